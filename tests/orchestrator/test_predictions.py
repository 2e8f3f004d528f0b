"""Calibrate, then predict, then measure; and 95% intervals (issue 14), on the sim launcher."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from dsd.analytic import latency_model as lm
from dsd.costs.profiles import get_profile
from orchestrator.analysis import bootstrap
from orchestrator import cli
from orchestrator.running import repeat_until_ci
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.analysis.predictions import Predictor
from orchestrator.launchers.sim import SimTestbed
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import assumed_times, point_settings, run_experiment, times_for
from orchestrator.records.sweep_folder import run_sweep
from orchestrator.spec.plan import is_calibration, plan_points
from orchestrator.spec.workload import make_prompts
from tests.checks import every

SMALL = {
    "name": "predict",
    "profile": "toy-edge-cloud",
    "rtt_ms": [0, 4, 8, 12, 16],
    "gamma": [4],
    "requests": 6,
    "max_new_tokens": 120,
    "prompt_tokens": 8,
    "repeats": 2,
    "backend": {"kind": "synthetic", "alpha": 0.8},
}


def _done(out):
    return {p.parent.name: json.loads(p.read_text()) for p in (out / "points").glob("*/done.json")}


def test_calibration_points_run_first_in_each_group_and_are_the_first_repeat_at_the_smallest_rtt():
    experiment = experiment_from_dict({**SMALL, "rtt_ms": [8, 0, 4]})
    plan = plan_points(experiment)
    calibration = [p for p in plan if is_calibration(p, experiment)]
    assert [p.key for p in calibration] == ["ar_rtt0ms_g4_c1_r0", "colocated_rtt0ms_g4_c1_r0", "sync_rtt0ms_g4_c1_r0"]
    assert plan[:3] == calibration


def test_predictions_are_written_after_calibration_and_before_every_other_point(tmp_path):
    out = tmp_path / "s"
    experiment = experiment_from_dict(SMALL)
    run_experiment(experiment, out, resume=False)
    predictions = pd.read_csv(out / "predictions.csv")
    plan = plan_points(experiment)
    assert sorted(predictions["point"]) == sorted(p.key for p in plan)  # one row per planned point
    assert predictions["per_token_ms_predicted"].notna().all()
    predicted_at_s = predictions["predicted_at_s"].max()
    done = _done(out)
    calibration = {p.key for p in plan if is_calibration(p, experiment)}
    assert set(predictions.loc[predictions["calibration"], "point"]) == calibration
    assert every(done[k]["finished_s"] <= predicted_at_s for k in calibration)
    others = [d["started_s"] for k, d in done.items() if k not in calibration]
    assert len(others) == len(plan) - 3 and predicted_at_s < min(others)


def test_resume_keeps_the_original_predictions_byte_for_byte(tmp_path):
    """Kill the sweep after some measured points, resume it: predictions.csv is not rewritten."""
    out = tmp_path / "s"
    experiment = experiment_from_dict(SMALL)
    plan = plan_points(experiment)
    from dsd.backends.factory import load_pair

    times = {experiment.profile: times_for(experiment, out)}
    testbed = SimTestbed(*load_pair(experiment.backend), times[experiment.profile])
    prompts = make_prompts(
        experiment.backend, experiment.warmup_requests + experiment.requests, experiment.prompt_tokens, experiment.seed
    )
    calls = []

    class Killed(BaseException):
        pass

    def dies_after_six(point):
        calls.append(point)
        if len(calls) > 6:
            raise Killed()
        return testbed.run_point(point, prompts, point_settings(experiment))

    predict = Predictor(experiment, out, lambda p: assumed_times(p, experiment, times))
    with pytest.raises(Killed):
        run_sweep(experiment, out, dies_after_six, facts={"launcher": "sim", "costs": {}}, predict=predict)
    before = (out / "predictions.csv").read_bytes()
    mtime_ns = (out / "predictions.csv").stat().st_mtime_ns
    run_experiment(experiment, out, resume=True)
    assert (out / "predictions.csv").read_bytes() == before
    assert (out / "predictions.csv").stat().st_mtime_ns == mtime_ns
    assert len(_done(out)) == len(plan)


def test_out_of_sample_figure_excludes_the_calibration_points(tmp_path):
    """Corrupt the calibration points' measurements after the fact: the out-of-sample figures do
    not move (those points are neither compared nor, after prediction, consulted), while the
    in-sample ones do."""
    out = tmp_path / "s"
    run_experiment(experiment_from_dict({**SMALL, "repeats": 1}), out, resume=False)
    before = analyze_sweep(out)
    points = pd.read_csv(out / "points.csv")
    assert points.loc[points["calibration"], "latency_err_oos_pct"].isna().all()
    assert points.loc[~points["calibration"], "latency_err_oos_pct"].notna().all()
    assert before["out_of_sample"]["cells"] == (~points["calibration"]).sum()
    requests = pd.read_csv(out / "requests.csv")
    calibration = requests["point"].isin(
        points.loc[points["calibration"]].pipe(
            lambda p: [f"{m}_rtt{r:g}ms_g4_c1_r0" for m, r in zip(p["mode"], p["rtt_ms"])]
        )
    )
    assert calibration.sum() == 3 * 6
    requests.loc[calibration, "steady_per_token_s"] *= 3.0
    requests.to_csv(out / "requests.csv", index=False)
    after = analyze_sweep(out)
    for key in ("latency_err_p50_pct", "latency_err_max_pct", "cells"):
        assert after["out_of_sample"][key] == before["out_of_sample"][key]
    assert after["in_sample"]["latency_err_max_pct"] > before["in_sample"]["latency_err_max_pct"] + 50


def test_bootstrap_interval_of_a_synthetic_sweep_contains_the_closed_form_crossover(tmp_path):
    out = tmp_path / "s"
    run_experiment(experiment_from_dict({**SMALL, "requests": 10, "seed": 3}), out, resume=False)
    summary = analyze_sweep(out)
    profile = get_profile("toy-edge-cloud")
    closed_ms = 1e3 * lm.sync_dsd_beats_ar_rtt_s(0.8, 4, profile.t_draft_edge_s, profile.t_verify_s(4), profile.t_ar_s)
    sync = summary["crossovers"]["sync_vs_ar"]
    assert sync["ci_low"] <= closed_ms <= sync["ci_high"], (sync, closed_ms)
    assert not sync["ci_covers_grid"] and sync["ci_high"] - sync["ci_low"] < 6.0
    assert sync["ci_low"] <= sync["measured_rtt_ms"] <= sync["ci_high"]
    points = pd.read_csv(out / "points.csv")
    assert (points.per_token_ms_ci_low <= points.per_token_ms_p50).all()
    assert (points.per_token_ms_p50 <= points.per_token_ms_ci_high).all()
    assert every(c["ci_low"] <= c["per_token_ms"] <= c["ci_high"] for c in summary["latency_cells"])
    # The same data gives the same interval (fixed seed).
    assert analyze_sweep(out)["crossovers"]["sync_vs_ar"]["ci_low"] == sync["ci_low"]
    report = out / "report.html"
    from orchestrator.report.html import write_report

    text = write_report(out).read_text()
    assert report.exists() and "out of sample" in text.lower() and "95% CI" in text


def test_an_interval_covering_the_whole_grid_is_reported_as_undetermined():
    """AR flat at 10 ms; every sync point half 2 ms, half 18 ms requests: which side of AR its
    median falls on is a coin toss per resample, so the crossing can be anywhere (or nowhere)."""
    rows = []
    for repeat in range(3):
        for rtt in (0.0, 10.0, 20.0):
            for request in range(8):
                rows.append(
                    {
                        "mode": "ar",
                        "rtt_ms": rtt,
                        "gamma": 4,
                        "clients": 1,
                        "repeat": repeat,
                        "request_index": request,
                        "per_token_ms": 10.0,
                    }
                )
                rows.append(
                    {
                        "mode": "sync",
                        "rtt_ms": rtt,
                        "gamma": 4,
                        "clients": 1,
                        "repeat": repeat,
                        "request_index": request,
                        "per_token_ms": 2.0 if request % 2 else 18.0 + request,
                    }
                )
    latencies = pd.DataFrame(rows)
    keys = ["mode", "rtt_ms", "gamma", "clients"]
    cells, replicates = bootstrap.cell_replicates(latencies, keys)
    cis = bootstrap.crossover_cis(replicates, keys, {"gamma": 4, "clients": 1}, [0.0, 10.0, 20.0])
    ci = cis["sync_vs_ar"]
    assert ci["ci_covers_grid"] and ci["ci_low"] <= 0 and ci["ci_high"] >= 20
    assert bootstrap.describe_crossover(7.0, ci).startswith("undetermined")


def test_bootstrap_repeats_are_drawn_jointly_so_a_shared_drift_cancels_in_a_crossover():
    """Repeat 1 ran on a slow machine: every mode 30% slower. Paired draws keep the crossing
    where it is in every repeat (10 ms); independent draws would smear it."""
    rows = []
    for repeat, slow in ((0, 1.0), (1, 1.3), (2, 1.0)):
        for rtt in (0.0, 10.0, 20.0):
            for request in range(5):
                rows.append(
                    {
                        "mode": "ar",
                        "rtt_ms": rtt,
                        "gamma": 4,
                        "clients": 1,
                        "repeat": repeat,
                        "request_index": request,
                        "per_token_ms": slow * 10.0,
                    }
                )
                rows.append(
                    {
                        "mode": "sync",
                        "rtt_ms": rtt,
                        "gamma": 4,
                        "clients": 1,
                        "repeat": repeat,
                        "request_index": request,
                        "per_token_ms": slow * (5.0 + 0.5 * rtt),
                    }
                )
    keys = ["mode", "rtt_ms", "gamma", "clients"]
    _, replicates = bootstrap.cell_replicates(pd.DataFrame(rows), keys)
    ci = bootstrap.crossover_cis(replicates, keys, {"gamma": 4, "clients": 1}, [0.0, 10.0, 20.0])["sync_vs_ar"]
    assert math.isclose(ci["ci_low"], 10.0) and math.isclose(ci["ci_high"], 10.0)


REPEATS = {
    "name": "repeats",
    "profile": "toy-edge-cloud",
    "modes": ["ar", "sync"],
    "rtt_ms": [0, 4, 8, 12, 16],
    "gamma": [4],
    "requests": 3,
    "max_new_tokens": 80,
    "prompt_tokens": 8,
    "backend": {"kind": "synthetic", "alpha": 0.8},
}


def test_repeats_until_ci_bracket_the_crossover_and_stop_at_the_budget(tmp_path):
    out = tmp_path / "s"
    experiment = experiment_from_dict({**REPEATS, "adaptive_budget_points": 6, "adaptive_ci_target_pct": 1.0})
    run_experiment(experiment, out, resume=False)
    planned = {p.key for p in plan_points(experiment)}
    done = _done(out)
    extra = {k: d for k, d in done.items() if k not in planned}
    assert 0 < len(extra) <= 6
    assert every(d["repeat"] >= 1 and d["mode"] in ("ar", "sync") for d in extra.values())
    summary = analyze_sweep(out)
    sync = summary["crossovers"]["sync_vs_ar"]
    rtts = sorted({d["rtt_ms"] for d in extra.values()})
    assert rtts[0] <= max(sync["ci_low"], 0) and rtts[-1] >= min(sync["ci_high"], 16), (rtts, sync)
    points = pd.read_csv(out / "points.csv")
    added = points[points["repeat"] >= 1]
    assert (~added["calibration"]).all() and added["per_token_ms_predicted_oos"].notna().all()
    # Resume: the budget counts what is on disk; nothing more runs.
    run_experiment(experiment, out, resume=True)
    assert len(_done(out)) == len(done)


def test_repeat_until_ci_points_are_the_planned_cells_with_their_sampling_and_link():
    experiment = experiment_from_dict(
        {
            **REPEATS,
            "launcher": "netns",
            "rtt_ms": [4, 8, 12, 16],
            "jitter_ms": [0, 1],
            "sampling": {"temperature": 0.7, "top_p": 0.9},
        }
    )
    group = {
        "jitter_ms": 1.0,
        "temperature": 0.7,
        "top_k": np.int64(0),
        "top_p": 0.9,
        "sampling_seed": np.int64(0),
        "profile": math.nan,
    }
    state = {
        "group": group,
        "name": "sync_vs_ar",
        "measured_rtt_ms": 6.0,
        "ci_low": -math.inf,
        "ci_high": 9.0,
        "ci_covers_grid": False,
        "width_relative": math.inf,
    }
    points = repeat_until_ci.next_points(experiment, [state], 20.0, {"ar_rtt4ms_r1"})
    planned = {p.key for p in plan_points(experiment)}
    assert {p.rtt_ms for p in points} == {4.0, 8.0, 12.0} and {p.mode for p in points} == {"ar", "sync"}
    assert len(points) == 6
    assert every(p.repeat == 2 and p.jitter_ms == 1.0 and p.temperature == 0.7 and p.top_p == 0.9 for p in points)
    assert {p.key.replace("_r2", "_r0") for p in points} <= planned


def test_repeats_until_ci_serve_only_the_crossovers_the_experiment_names():
    experiment = experiment_from_dict(
        {**REPEATS, "modes": ["ar", "colocated", "sync", "cached"], "adaptive_crossovers": ["cached_vs_colocated"]}
    )
    wide = {
        "group": {},
        "measured_rtt_ms": 6.0,
        "ci_low": -math.inf,
        "ci_high": 9.0,
        "ci_covers_grid": False,
        "width_relative": math.inf,
    }
    sync, cached = {**wide, "name": "sync_vs_ar"}, {**wide, "name": "cached_vs_colocated", "measured_rtt_ms": 3.0}
    points = repeat_until_ci.next_points(experiment, [sync, cached], 20.0, set())
    assert {p.mode for p in points} == {"cached", "colocated"} and {p.rtt_ms for p in points} == {0.0, 4.0, 8.0, 12.0}
    assert repeat_until_ci.next_points(experiment, [sync], 20.0, set()) == []
    everyone = experiment_from_dict({**REPEATS, "modes": ["ar", "colocated", "sync", "cached"]})
    assert {p.mode for p in repeat_until_ci.next_points(everyone, [sync], 20.0, set())} == {"ar", "sync"}
    with pytest.raises(ValueError, match="adaptive_crossovers.*cached_vs_colocated"):
        experiment_from_dict({**REPEATS, "adaptive_crossovers": ["cached_vs_coloc"]})


def test_a_finished_sweep_resumed_with_repeat_until_ci_adds_repeats_and_nothing_else(tmp_path):
    toml = tmp_path / "repeats.toml"
    toml.write_text(
        'name = "repeats"\nprofile = "toy-edge-cloud"\nmodes = ["ar", "sync"]\n'
        "rtt_ms = [0, 4, 8, 12, 16]\ngamma = [4]\nrequests = 3\nmax_new_tokens = 80\n"
        'prompt_tokens = 8\nadaptive_ci_target_pct = 1.0\n[backend]\nkind = "synthetic"\nalpha = 0.8\n'
    )
    out = tmp_path / "s"
    assert cli.main(["sweep", str(toml), "--out", str(out)]) == 0
    planned = dict(_done(out))
    predictions = (out / "predictions.csv").read_bytes()
    assert cli.main(["sweep", str(toml), "--out", str(out), "--resume", "--repeat-until-ci", "6"]) == 0
    extra = {k: d for k, d in _done(out).items() if k not in planned}
    assert 0 < len(extra) <= 6 and all(d["repeat"] >= 1 for d in extra.values())
    assert (out / "predictions.csv").read_bytes() == predictions  # written before, kept
    # Only the repeat-until-CI keys may change on resume; a different grid is refused.
    toml.write_text(toml.read_text().replace("[0, 4, 8, 12, 16]", "[0, 4, 8]"))
    assert cli.main(["sweep", str(toml), "--out", str(out), "--resume", "--repeat-until-ci", "6"]) == 2
    assert cli.main(["sweep", str(toml), "--out", str(out), "--repeat-until-ci", "-1"]) == 2


def test_repeats_until_ci_add_nothing_when_every_interval_is_narrow_enough(tmp_path):
    out = tmp_path / "s"
    experiment = experiment_from_dict({**REPEATS, "adaptive_budget_points": 6, "adaptive_ci_target_pct": 1000.0})
    run_experiment(experiment, out, resume=False)
    assert len(_done(out)) == len(plan_points(experiment))
    with pytest.raises(ValueError, match="adaptive_ci_target_pct"):
        experiment_from_dict({**REPEATS, "adaptive_ci_target_pct": 0})


def test_a_sweep_over_link_keys_calibrates_on_the_first_link_of_the_smallest_rtt():
    experiment = experiment_from_dict({**SMALL, "rtt_ms": [20, 8], "jitter_ms": [0, 2]})
    calibration = [p for p in plan_points(experiment) if is_calibration(p, experiment)]
    assert len(calibration) == 3
    assert {(p.rtt_ms, p.jitter_ms) for p in calibration} == {(8.0, 0.0)}


def test_compute_drift_is_each_points_server_compute_against_its_modes_calibration_point():
    from orchestrator.analysis.out_of_sample import add_compute_drift, oos_cells

    points = pd.DataFrame(
        {
            "mode": ["ar", "ar", "ar", "sync", "sync", "pipelined", "colocated"],
            "rtt_ms": [0.0, 10.0, 10.0, 0.0, 10.0, 10.0, 10.0],
            "repeat": [0, 0, 1, 0, 0, 0, 0],
            "gamma": 2,
            "clients": 1,
            "calibration": [True, False, False, True, False, False, False],
            "server_compute_ms_p50": [100.0, 80.0, 90.0, 50.0, 60.0, 55.0, 70.0],
            "per_token_ms_p50": 1.0,
            "per_token_ms_predicted_oos": 1.0,
        }
    )
    drift = add_compute_drift(points)["compute_drift_pct"]
    assert drift.iloc[[1, 2, 4, 5]].round(6).tolist() == [-20.0, -10.0, 20.0, 10.0]
    assert drift.iloc[[0, 3, 6]].isna().all()  # calibration points, and a mode without one
    cells = oos_cells(add_compute_drift(points)).set_index(["mode", "rtt_ms"])
    assert cells.loc[("ar", 10.0), "compute_drift_pct"] == pytest.approx(-15.0)


def test_every_repeat_calibrates_each_planned_repeat_first_and_no_added_one():
    from orchestrator.spec.plan import Point, calibration_unit

    experiment = experiment_from_dict({**SMALL, "rtt_ms": [8, 0, 4], "calibrate": "every_repeat"})
    plan = plan_points(experiment)
    for repeat in (0, 1):
        block = [p for p in plan if p.repeat == repeat]
        assert [p.key for p in block[:3]] == [f"{m}_rtt0ms_g4_c1_r{repeat}" for m in ("ar", "colocated", "sync")]
        assert sum(is_calibration(p, experiment) for p in block) == 3
        assert {calibration_unit(p, experiment) for p in block} == {("", repeat)}
    added = Point("ar", 0.0, 4, 1, 2)  # a repeat after the plan (repeat_until_ci)
    assert not is_calibration(added, experiment) and calibration_unit(added, experiment) == ("", None)
    with pytest.raises(ValueError, match="calibrate"):
        experiment_from_dict({**SMALL, "calibrate": "each"})


def test_every_repeat_predicts_each_repeat_from_its_own_calibration_before_it_runs(tmp_path):
    out = tmp_path / "s"
    experiment = experiment_from_dict({**SMALL, "calibrate": "every_repeat"})
    run_experiment(experiment, out, resume=False)
    predictions, done = pd.read_csv(out / "predictions.csv"), _done(out)
    record = json.loads((out / "calibration.json").read_text())["all"]
    assert record["predicted"] and record["by_repeat"]["1"]["predicted"]
    assert record["by_repeat"]["1"]["calibration_points"] == [
        f"{m}_rtt0ms_g4_c1_r1" for m in ("ar", "colocated", "sync")
    ]
    for repeat in (0, 1):
        rows = predictions[predictions["repeat"] == repeat]
        predicted_at_s = rows["predicted_at_s"].max()
        assert rows["predicted_at_s"].nunique() == 1
        calibration = set(rows.loc[rows["calibration"], "point"])
        assert len(calibration) == 3 and all(done[k]["finished_s"] <= predicted_at_s for k in calibration)
        assert predicted_at_s < min(done[k]["started_s"] for k in rows["point"] if k not in calibration)
    analyze_sweep(out)
    own = predictions.set_index("point")["per_token_ms_predicted"]
    measured = pd.read_csv(out / "points.csv")
    keys = [f"{m}_rtt{r:g}ms_g4_c1_r{k}" for m, r, k in zip(measured["mode"], measured["rtt_ms"], measured["repeat"])]
    assert measured["per_token_ms_predicted_oos"].tolist() == pytest.approx(own.reindex(keys).tolist())


@pytest.mark.parametrize("calibrate", ["first_repeat", "every_repeat"])
def test_a_repeat_whose_requests_accept_less_is_predicted_from_its_own_calibration(tmp_path, monkeypatch, calibrate):
    """Repeat 1's requests accept at alpha 0.5 instead of 0.8 (as a repeat whose prompts suit the
    draft less): its own calibration predicts it; repeat 0's misses it by more than a fifth."""
    from dataclasses import replace
    from dsd.backends.factory import load_pair

    run_point = SimTestbed.run_point
    pairs = {}

    def accepts_less_in_repeat_1(self, point, prompts, settings):
        own = self.draft, self.target
        if point.repeat == 1:
            pairs.setdefault(1, load_pair(replace(experiment.backend, alpha=0.5)))
            self.draft, self.target = pairs[1]
        try:
            return run_point(self, point, prompts, settings)
        finally:
            self.draft, self.target = own

    monkeypatch.setattr(SimTestbed, "run_point", accepts_less_in_repeat_1)
    out = tmp_path / "s"
    experiment = experiment_from_dict({**SMALL, "calibrate": calibrate})
    run_experiment(experiment, out, resume=False)
    analyze_sweep(out)
    points = pd.read_csv(out / "points.csv")
    late = points[points["mode"].isin(["sync", "colocated"]) & (points["rtt_ms"] > 0)]
    err = late.groupby("repeat")["latency_err_oos_pct"].apply(lambda e: e.abs().max())
    assert err[0] < 3
    if calibrate == "every_repeat":
        assert err[1] < 3
    else:
        assert err[1] > 20


def test_compute_drift_with_a_calibration_per_repeat_is_against_the_repeats_own():
    from orchestrator.analysis.out_of_sample import add_compute_drift, oos_crossovers

    points = pd.DataFrame(
        {
            "mode": ["ar", "ar", "ar", "ar", "ar"],
            "rtt_ms": [0.0, 10.0, 0.0, 10.0, 10.0],
            "repeat": [0, 0, 1, 1, 2],
            "gamma": 2,
            "clients": 1,
            "calibration": [True, False, True, False, False],
            "server_compute_ms_p50": [100.0, 110.0, 50.0, 60.0, 120.0],
        }
    )
    drift = add_compute_drift(points)["compute_drift_pct"]
    assert drift.iloc[[1, 3, 4]].round(6).tolist() == [10.0, 20.0, 20.0]  # repeat 2 has none: repeat 0's
    predictions = pd.DataFrame(
        {"gamma": 2, "repeat": [0, 0, 1, 1, 2, 2], "crossover_sync_vs_ar_rtt_ms": [4.0, 4.0, 8.0, 8.0, 30.0, 30.0]}
    )
    assert oos_crossovers(predictions, {}, 2)["sync_vs_ar"] == 8.0


def test_repeat_until_ci_keeps_narrowing_a_crossover_measured_never_whose_interval_reaches_into_the_grid():
    """ "never wins [95% CI -inf .. 9]" is as uncertain as a located crossover: more repeats at the
    RTTs up to 9 ms and the next one; "never [-inf .. -inf]" (no replicate crosses) needs none."""
    experiment = experiment_from_dict({**REPEATS, "launcher": "netns", "rtt_ms": [4, 8, 12, 16]})
    state = {
        "group": {},
        "name": "sync_vs_ar",
        "measured_rtt_ms": -math.inf,
        "ci_low": -math.inf,
        "ci_high": 9.0,
        "ci_covers_grid": False,
        "width_relative": math.nan,
    }
    points = repeat_until_ci.next_points(experiment, [state], 20.0, set())
    assert {p.rtt_ms for p in points} == {4.0, 8.0, 12.0} and {p.mode for p in points} == {"ar", "sync"}
    settled = {**state, "ci_high": -math.inf}
    assert repeat_until_ci.next_points(experiment, [settled], 20.0, set()) == []


def test_the_out_of_sample_line_says_when_no_cell_is_left_to_judge():
    from orchestrator.cli import out_of_sample_line

    assert out_of_sample_line({"available": False}) == ""
    empty = out_of_sample_line(
        {"available": True, "cells": 0, "latency_err_p50_pct": math.nan, "latency_err_max_pct": math.nan}
    )
    assert "no cell to judge" in empty and "nan" not in empty
    full = out_of_sample_line(
        {
            "available": True,
            "cells": 21,
            "latency_err_p50_pct": 3.39,
            "latency_err_max_pct": 8.88,
            "compute_drift_p50_pct": 2.8,
            "compute_drift_max_pct": 8.9,
        }
    )
    assert "p50 3.39%, max 8.88% over 21 cells" in full and "moved p50 2.8%, max 8.9%" in full


def test_a_capped_points_prediction_carries_the_serialisation_term_and_moves_sync_dsds_crossover():
    from orchestrator.analysis.predictions import WireTerms, prediction_rows
    from services import wire_size

    experiment = experiment_from_dict({**SMALL, "rate_mbit": [0, 1]})
    plan = plan_points(experiment)
    calibration = {"alpha": 0.8, "params": get_profile("toy-edge-cloud").times}
    rows = {r["point"]: r for r in prediction_rows(plan, calibration, lambda p: False, 0.0, WireTerms(512, None, {}))}

    def row(mode, rate, rtt=8):
        return rows[f"{mode}_rtt{rtt}ms_rate{rate}mbit_g4_c1_r0"]

    tokens = lm.expected_tokens_per_round(0.8, 4)
    up, down = wire_size.round_wire_bytes(4, 512, 0.0, acks=False)  # greedy: ids up, a verdict down
    sync_ms = 8 * (up + down) / 1e3 / tokens  # at 1 Mbit/s, a round's bytes over E
    ar_ms = 8 * sum(wire_size.stream_round_wire_bytes(1, 512, 4, acks=False)) / 1e3
    assert row("sync", 1)["per_token_ms_predicted"] - row("sync", 0)["per_token_ms_predicted"] == pytest.approx(sync_ms)
    assert row("ar", 1)["per_token_ms_predicted"] - row("ar", 0)["per_token_ms_predicted"] == pytest.approx(ar_ms)
    assert row("sync", 1)["crossover_sync_vs_ar_rtt_ms"] == pytest.approx(
        row("sync", 0)["crossover_sync_vs_ar_rtt_ms"] - (sync_ms - ar_ms) * tokens
    )
    assert math.isnan(row("sync", 1)["crossover_pipelined_vs_colocated_rtt_ms"])  # not predicted under a cap
    assert not math.isnan(row("sync", 0)["crossover_pipelined_vs_colocated_rtt_ms"])
