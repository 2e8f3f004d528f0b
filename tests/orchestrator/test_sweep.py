"""Sweep mechanics: a folder per point, resume by what is on disk, no overwrite, errors as rows."""

import json

import pandas as pd
import pytest

from dsd.costs.compute_times import ComputeTimes
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import run_experiment
from orchestrator.records.sweep_folder import SweepExists, experiment_record, run_sweep
from orchestrator.spec.plan import plan_points
from tests.checks import every

EXPERIMENT = experiment_from_dict(
    {
        "name": "small",
        "profile": "toy-edge-cloud",
        "rtt_ms": [0, 10, 40],
        "gamma": [2, 4],
        "requests": 3,
        "max_new_tokens": 40,
        "prompt_tokens": 8,
        "backend": {"kind": "synthetic", "alpha": 0.8},
    }
)


def test_plan_runs_ar_once_per_rtt_and_every_other_mode_per_gamma():
    plan = plan_points(EXPERIMENT)
    assert len(plan) == 3 * (1 + 3 * 2)
    assert len({p.key for p in plan}) == len(plan)


def test_sweep_writes_pandas_readable_traces_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "sweep"
    run_experiment(EXPERIMENT, out, resume=False)
    points = pd.read_csv(out / "requests.csv")
    assert len(points) == len(plan_points(EXPERIMENT)) * 3
    rounds = pd.read_csv(out / "rounds.csv")
    assert {"mode", "rtt_ms", "gamma", "proposed", "accepted", "emitted", "stale"} <= set(rounds.columns)
    sidecar = json.loads((out / "sweep.json").read_text())
    assert sidecar["launcher"] == "sim" and sidecar["experiment"]["name"] == "small"
    with pytest.raises(SweepExists, match="--resume"):
        run_experiment(EXPERIMENT, out, resume=False)


def test_resume_after_a_crash_gives_the_same_points(tmp_path):
    """Kill the sweep mid-way (an exception out of a point runner), resume, compare."""
    full, broken = tmp_path / "full", tmp_path / "broken"
    run_experiment(EXPERIMENT, full, resume=False)
    plan = plan_points(EXPERIMENT)
    calls = []

    class Killed(BaseException):
        pass

    def dies_after_five(point):
        calls.append(point)
        if len(calls) > 5:
            raise Killed()
        return [], [
            {
                "request_index": 0,
                "rtt_probe_ms": point.rtt_ms,
                "tokens": 1,
                "wall_s": 1.0,
                "ttft_s": 1.0,
                "steady_per_token_s": 1.0,
            }
        ]

    with pytest.raises(Killed):
        run_sweep(EXPERIMENT, broken, dies_after_five, facts={"launcher": "sim"}, resume=False)
    assert len(list((broken / "points").glob("*/done.json"))) == 5
    # A partial point folder without done.json is redone, not trusted.
    run_experiment(EXPERIMENT, broken, resume=True)
    done = sorted(p.parent.name for p in (broken / "points").glob("*/done.json"))
    assert done == sorted(p.key for p in plan)
    # Points finished before the crash are kept as they were (not rerun).
    first_five = {p.key for p in plan[:5]}
    kept = pd.read_csv(broken / "requests.csv")
    assert set(kept[kept.wall_s == 1.0]["point"]) == first_five


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path):
    def fails_on_sync(point):
        if point.mode == "sync":
            raise RuntimeError("verifier unreachable")
        return [], [
            {
                "request_index": 0,
                "rtt_probe_ms": point.rtt_ms,
                "tokens": 1,
                "wall_s": 1.0,
                "ttft_s": 1.0,
                "steady_per_token_s": 1.0,
            }
        ]

    done = run_sweep(EXPERIMENT, tmp_path / "s", fails_on_sync, facts={"launcher": "sim"})
    errors = done[done.status == "error"]
    assert set(errors["mode"]) == {"sync"} and errors["error"].str.contains("verifier unreachable").all()
    assert (done.status == "ok").sum() == len(plan_points(EXPERIMENT)) - len(errors)


def test_analysis_recovers_the_synthetic_truth(tmp_path):
    """Known answers: alpha as configured, and on the sim launcher the latency and crossover
    equal the closed form at the fitted alpha."""
    out = tmp_path / "a"
    experiment = experiment_from_dict(
        {
            "name": "truth",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 5, 10, 20],
            "gamma": [4],
            "requests": 6,
            "max_new_tokens": 200,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "alpha": 0.8},
        }
    )
    run_experiment(experiment, out, resume=False)
    summary = analyze_sweep(out)
    assert summary["alpha_measured"] == pytest.approx(0.8, abs=0.04)
    points = pd.read_csv(out / "points.csv")
    assert points["latency_err_pct"].abs().max() < 5.0
    sync = summary["crossovers"]["sync_vs_ar"]
    assert sync["measured_rtt_ms"] == pytest.approx(sync["predicted_rtt_ms"], rel=0.10)
    assert (out / "latency_vs_rtt.png").stat().st_size > 10_000


def test_a_retried_point_keeps_only_the_rows_of_the_attempt_that_succeeded(tmp_path):
    """retries=1: the first attempt of each point fails after making rows; the heal runs before
    the retry; done.json lists both attempts; the CSVs hold the second attempt's rows only."""
    experiment = experiment_from_dict(
        {
            "name": "retry",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 10],
            "modes": ["sync"],
            "retries": 1,
            "retry_backoff_s": 0.0,
            "backend": {"kind": "synthetic"},
        }
    )
    attempts, heals = {}, []

    def flaky(point):
        attempts[point.key] = attempts.get(point.key, 0) + 1
        rows = [{"request_index": 0, "attempt": attempts[point.key], "tokens": 1}]
        if attempts[point.key] == 1:
            raise ConnectionError("verifier went away")
        return [], rows

    def heal():
        heals.append(1)
        return ["restarted verifier (exit code -9)"]

    done = run_sweep(experiment, tmp_path / "s", flaky, facts={"launcher": "sim"}, heal=heal)
    assert (done.status == "ok").all() and len(heals) == 2
    for record in done.itertuples():
        assert [a["status"] for a in record.attempts] == ["error", "ok"]
        assert "verifier went away" in record.attempts[0]["error"]
        assert record.attempts[1]["healed"] == ["restarted verifier (exit code -9)"]
    requests = pd.read_csv(tmp_path / "s" / "requests.csv")
    assert list(requests["attempt"]) == [2, 2]


def test_resume_redoes_a_point_folder_without_done_json_from_scratch(tmp_path):
    experiment = experiment_from_dict(
        {
            "name": "redo",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0],
            "modes": ["sync"],
            "backend": {"kind": "synthetic"},
        }
    )
    out = tmp_path / "s"
    (point,) = plan_points(experiment)

    def ok(p):
        return [], [{"request_index": 0, "tokens": 1}]

    run_sweep(experiment, out, ok, facts={"launcher": "sim"})
    folder = out / "points" / point.key
    (folder / "done.json").unlink()  # as if killed before done.json was written
    (folder / "requests.csv").write_text("point,request_index,tokens\nstale,0,1\nstale,1,")
    (folder / "requests.csv.tmp").write_text("half")
    run_sweep(experiment, out, ok, facts={"launcher": "sim"}, resume=True)
    requests = pd.read_csv(out / "requests.csv")
    assert list(requests["point"]) == [point.key]
    assert not (folder / "requests.csv.tmp").exists()


def test_keys_of_experiments_without_the_new_dimensions_are_unchanged():
    """Old sweep folders resume only if their point folders keep their names."""
    keys = {p.key for p in plan_points(EXPERIMENT)}
    assert "sync_rtt10ms_g4_c1_r0" in keys and "ar_rtt0ms_g2_c1_r0" in keys
    assert every(p.alpha is None and p.profile is None for p in plan_points(EXPERIMENT))


def test_an_old_sidecar_without_the_alpha_key_still_resumes(tmp_path):
    out = tmp_path / "old"
    run_experiment(EXPERIMENT, out, resume=False)
    sidecar = json.loads((out / "sweep.json").read_text())
    assert "alpha" not in sidecar["experiment"]  # written as before the key existed
    run_experiment(EXPERIMENT, out, resume=True)


def test_alpha_and_profile_groups_run_together_one_after_another():
    experiment = experiment_from_dict(
        {
            "name": "grid",
            "profile": ["toy-edge-cloud", "cpu2-default-pair"],
            "alpha": [0.6, 0.9],
            "rtt_ms": [0, 10],
            "modes": ["ar", "sync"],
            "repeats": 2,
            "backend": {"kind": "synthetic"},
        }
    )
    plan = plan_points(experiment)
    assert len(plan) == 2 * 2 * 2 * 2 * 2 and len({p.key for p in plan}) == len(plan)
    groups = [(p.profile, p.alpha) for p in plan]
    # Each group is one contiguous run of the plan (one testbed per group on a network launcher).
    changes = sum(1 for a, b in zip(groups, groups[1:]) if a != b)
    assert changes == 3 and len(set(groups)) == 4
    assert plan[0].key == "ar_rtt0ms_g4_c1_a0.6_ptoy-edge-cloud_r0"


def test_gain_window_on_sim_recovers_each_alpha_and_the_predicted_boundary(tmp_path):
    """Known answers: each group's fitted alpha near its configured one; DSD wins exactly where
    the closed form says, at cells far enough from the boundary that sampling cannot flip them."""
    from orchestrator.analysis import points as analysis

    out = tmp_path / "gw"
    experiment = experiment_from_dict(
        {
            "name": "gw",
            "profile": "toy-edge-cloud",
            "alpha": [0.6, 0.9],
            "rtt_ms": [0, 5, 30],
            "modes": ["ar", "sync", "pipelined"],
            "requests": 6,
            "max_new_tokens": 120,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic"},
        }
    )
    run_experiment(experiment, out, resume=False)
    summary = analyze_sweep(out)
    assert summary["group_keys"] == ["alpha"]
    fitted = {g["alpha"]: g["alpha_measured"] for g in summary["groups"]}
    assert fitted[0.6] == pytest.approx(0.6, abs=0.05) and fitted[0.9] == pytest.approx(0.9, abs=0.04)
    points = pd.read_csv(out / "points.csv")
    assert {"alpha", "alpha_measured_group", "speedup_vs_ar"} <= set(points.columns)
    params = ComputeTimes.from_dict(summary["params"])
    checked = 0
    for row in points[points["mode"] != "ar"].itertuples():
        boundary_ms = analysis.predicted_ar_boundary_rtt_ms(row.mode, row.alpha_measured_group, 4, params)
        if abs(row.rtt_ms - boundary_ms) > 3:
            assert (row.speedup_vs_ar > 1) == (row.rtt_ms < boundary_ms), row
            checked += 1
    assert checked >= 8
    window = pd.read_csv(out / "gain_window.csv")
    assert set(window["mode"]) == {"sync", "pipelined"}
    assert (out / "gain_window.png").stat().st_size > 10_000
    assert "gain_window.png" in summary["plots"] and "latency_vs_rtt.png" not in summary["plots"]


def test_the_sidecar_leaves_out_keys_at_their_defaults_for_every_backend():
    """Keys added after sweeps were recorded (alpha, retries, retry_backoff_s) appear only when
    set, so an older folder still resumes; this must hold for a real pair too (no profile)."""
    hf = experiment_record(experiment_from_dict({"name": "hf", "backend": {"kind": "hf"}}))
    assert not {"alpha", "retries", "retry_backoff_s"} & set(hf)
    set_keys = experiment_record(
        experiment_from_dict(
            {"name": "syn", "profile": "toy-edge-cloud", "alpha": [0.5], "retries": 3, "backend": {"kind": "synthetic"}}
        )
    )
    assert set_keys["retries"] == 3 and set_keys["alpha"] == [0.5]


def test_a_sampling_sweep_runs_each_setting_and_records_it_in_every_row(tmp_path):
    out = tmp_path / "sampling"
    experiment = experiment_from_dict(
        {
            "name": "sampling",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 10],
            "modes": ["ar", "colocated", "sync"],
            "requests": 2,
            "max_new_tokens": 24,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic"},
            "sampling": {"temperature": [0.0, 1.0], "top_k": 5, "seed": 3},
        }
    )
    plan = plan_points(experiment)
    assert len(plan) == 2 * 3 * 2 and len({p.key for p in plan}) == len(plan)
    assert {p.key for p in plan if p.temperature == 1.0} >= {"sync_rtt10ms_g4_c1_T1k5s3_r0"}
    run_experiment(experiment, out, resume=False)
    summary = analyze_sweep(out)
    assert summary["group_keys"] == ["temperature", "top_k"] and len(summary["groups"]) == 2
    for name in ("rounds", "requests", "points"):
        frame = pd.read_csv(out / f"{name}.csv")
        assert {"temperature", "top_k", "top_p", "sampling_seed"} <= set(frame.columns), name
        assert set(frame["temperature"]) == {0.0, 1.0}, name
        assert set(frame.loc[frame.temperature == 1.0, "top_k"]) == {5}, name
        assert set(frame.loc[frame.temperature == 0.0, "top_k"]) == {0}, name  # greedy: no truncation
    requests = pd.read_csv(out / "requests.csv")
    greedy = requests[requests.temperature == 0.0].groupby(["rtt_ms", "mode"])["token_ids"].apply(tuple)
    assert greedy.nunique() == 1  # greedy: every mode and RTT emits the same tokens


def test_greedy_sweeps_keep_their_keys_and_sidecar_without_a_sampling_table():
    experiment = experiment_from_dict({"name": "g", "profile": "toy-edge-cloud", "backend": {"kind": "synthetic"}})
    assert plan_points(experiment)[0].key == "ar_rtt0ms_g4_c1_r0"
    assert "sampling" not in experiment_record(experiment)
