"""Open-loop serving: arrivals keep their times when the server saturates (queue time grows
instead), refused requests are rows with their reason, and the analysis finds the rate at the
attainment level."""

import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.spec.arrivals import SloConfig
from orchestrator.open_loop.plan import ServingPoint, arrivals_for, serving_model
from orchestrator.open_loop.sweep import run_serving, run_sim_point
from orchestrator.open_loop.commands import is_serving_sweep, reanalyze_serving
from orchestrator.open_loop.figures import crossing_rate, max_rate, next_search_rate, wilson_interval
from orchestrator.running.run import times_for
from tests.checks import every

BASE = {
    "name": "serve",
    "launcher": "sim",
    "modes": ["ar", "colocated", "sync"],
    "profile": "toy-edge-cloud",
    "edges": 4,
    "rtt_ms": [20],
    "max_new_tokens": 24,
    "prompt_tokens": 8,
    "backend": {"kind": "synthetic", "alpha": 0.8},
    "load": {"rate_rps": [2.0, 40.0], "duration_s": 20, "warmup_s": 2},
    "slo": {"ttft_ms": 300, "tpot_ms": 30, "attainment": 0.9},
}


def experiment(**load):
    return experiment_from_dict({**BASE, "load": {**BASE["load"], **load}})


def run(exp, mode, rate, tmp_path):
    rows = run_sim_point(exp, ServingPoint(mode, rate, 4, 0), times_for(exp, tmp_path))[1]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("mode", ["ar", "colocated", "sync"])
def test_open_loop_arrivals_keep_their_times_when_the_server_saturates(mode, tmp_path):
    exp = experiment(max_sessions=5000)  # no refusals: every request waits its turn
    light, heavy = run(exp, mode, 2.0, tmp_path), run(exp, mode, 40.0, tmp_path)
    scheduled = [a.arrival_s for a in arrivals_for(exp, ServingPoint(mode, 40.0, 4, 0))]
    assert list(heavy["arrival_s"]) == scheduled  # not one arrival moved
    assert heavy["admitted"].all()
    # saturated: the queue, not the arrivals, absorbs the load, and it grows through the run
    assert heavy["queue_s"].median() > 20 * max(light["queue_s"].median(), 1e-3)
    # ... and grows through the run: a later arrival waits behind more open sessions
    late, early = heavy.tail(50)["ttft_s"].mean(), heavy.head(20)["ttft_s"].mean()
    assert late > 3 * early
    assert heavy["e2e_s"].notna().all()


def test_a_refused_request_is_a_row_with_its_reason_and_none_is_lost(tmp_path):
    exp = experiment(max_sessions=3)
    rows = run(exp, "sync", 40.0, tmp_path)
    assert len(rows) == len(arrivals_for(exp, ServingPoint("sync", 40.0, 4, 0)))
    refused = rows[~rows["admitted"]]
    assert len(refused) > 0 and set(refused["refused_reason"]) == {"limit max_sessions"}
    assert not refused["slo_met"].any() and refused["e2e_s"].isna().all()
    assert (rows[rows["admitted"]]["refused_reason"] == "").all()


def test_the_sweep_writes_points_and_the_largest_rate_beside_its_prediction(tmp_path):
    exp = experiment_from_dict(
        {
            **BASE,
            "modes": ["colocated", "sync"],
            "load": {"rate_rps": [5.0, 40.0], "duration_s": 30, "warmup_s": 3, "search_iterations": 4},
        }
    )
    points = run_serving(exp, tmp_path / "out")
    assert {"throughput_rps", "goodput_rps", "ttft_p99_ms", "tpot_p90_ms", "e2e_p50_ms"} <= set(points.columns)
    summary = pd.read_json(tmp_path / "out" / "serving.json", typ="series")
    for mode in ("colocated", "sync"):
        row = summary["modes"][mode]
        assert 5.0 <= row["max_rate_ci_low_rps"] <= row["max_rate_rps"] <= row["max_rate_ci_high_rps"] < 40.0
        assert abs(row["steady_err_pct"]) < 25
    assert (tmp_path / "out" / "goodput_vs_rate.png").exists() and (tmp_path / "out" / "report.md").exists()
    # `dsdbed analyze` redoes the figures from what sweep.json recorded
    before = (tmp_path / "out" / "serving.json").read_text()
    (tmp_path / "out" / "serving.json").unlink()
    assert is_serving_sweep(tmp_path / "out") and reanalyze_serving(tmp_path / "out") == 0
    assert (tmp_path / "out" / "serving.json").read_text() == before


def test_crossing_rate_interpolates_and_censors():
    assert crossing_rate(np.array([1, 2, 3]), np.array([1.0, 0.95, 0.85]), 0.9) == pytest.approx(2.5)
    assert crossing_rate(np.array([1, 2]), np.array([1.0, 0.95]), 0.9) == 2.0
    assert math.isnan(crossing_rate(np.array([1, 2]), np.array([0.5, 0.4]), 0.9))
    low, high = wilson_interval(90, 100)
    assert low < 0.9 < high


def test_the_rate_search_aims_at_the_interpolated_crossing_between_meeting_and_missing():
    points = pd.DataFrame({"rate_rps": [1.0, 4.0], "requests_good": [100, 10], "requests_measured": [100, 100]})
    assert next_search_rate(points, 0.9) == pytest.approx(1.0 + 3.0 * 0.1 / 0.9)
    assert next_search_rate(points.iloc[:1], 0.9) == 2.0
    # a lopsided bracket still narrows: the next rate stays a tenth of the bracket inside it
    lopsided = pd.DataFrame({"rate_rps": [1.0, 2.0], "requests_good": [100, 89], "requests_measured": [100, 100]})
    assert next_search_rate(lopsided, 0.9, tolerance=0.0) == pytest.approx(1.9)


def test_the_rate_search_stops_at_a_rate_within_the_tolerance_of_the_level_or_a_narrow_bracket():
    def points(rates, good):
        return pd.DataFrame({"rate_rps": rates, "requests_good": good, "requests_measured": [100] * len(rates)})

    assert next_search_rate(points([1.0, 2.0], [91, 50]), 0.9) is None  # 91% is within 2 points
    assert next_search_rate(points([1.0, 2.0], [100, 89]), 0.9) is None  # so is 89%
    assert next_search_rate(points([1.0, 2.0], [93, 50]), 0.9) is not None
    assert next_search_rate(points([1.0, 1.01], [100, 1]), 0.9) is None  # bracket within 1%
    assert next_search_rate(points([1.0, 1.01], [100, 1]), 0.9, resolution=0.001) is not None


def test_the_ci_covers_the_spread_between_repeats_not_only_the_binomial_noise():
    # two arrival realisations that disagree about the crossing, against one with the same totals
    rates = [1.0, 2.0, 3.0]
    two = pd.DataFrame(
        {
            "rate_rps": rates * 2,
            "repeat": [0] * 3 + [1] * 3,
            "requests_good": [100, 100, 60, 100, 60, 40],
            "requests_measured": [100] * 6,
        }
    )
    one = two.groupby("rate_rps")[["requests_good", "requests_measured"]].sum().reset_index()
    pooled, single = max_rate(two, 0.9), max_rate(one, 0.9)
    assert pooled["max_rate_rps"] == pytest.approx(single["max_rate_rps"])
    assert pooled["repeats"] == 2 and single["repeats"] == 1
    width = lambda r: r["max_rate_ci_high_rps"] - r["max_rate_ci_low_rps"]  # noqa: E731
    assert width(pooled) > 2 * width(single)


def test_the_predicted_attainment_falls_with_the_rate(tmp_path):
    exp = experiment()
    model = serving_model(exp, times_for(exp, tmp_path))
    slo = SloConfig(ttft_ms=300, tpot_ms=30, attainment=0.9)
    values = [model.attainment("sync", r, slo) for r in (1.0, 10.0, 20.0, 40.0)]
    assert values == sorted(values, reverse=True) and values[0] == pytest.approx(1.0)
    assert model.max_rate_rps("colocated", slo) < model.max_rate_rps("sync", slo) < model.saturation_rps("sync")


def test_an_open_bracket_steps_by_the_open_step_from_a_close_start():
    meeting = pd.DataFrame({"rate_rps": [2.0], "requests_good": [95], "requests_measured": [100]})
    missing = meeting.assign(requests_good=[80])
    assert next_search_rate(meeting, 0.9, open_step=0.03) == pytest.approx(2.06)
    assert next_search_rate(missing, 0.9, open_step=0.03) == pytest.approx(2.0 / 1.03)
    assert next_search_rate(missing, 0.9) == pytest.approx(1.0)  # the default halves


def test_the_attainment_reported_is_the_one_measured_at_the_nearest_rate_over_every_realisation():
    # two realisations per rate: the crossing lies nearer 2.0 (91%) than 3.0 (60%)
    points = pd.DataFrame(
        {
            "rate_rps": [1.0, 2.0, 3.0] * 2,
            "repeat": [0] * 3 + [1] * 3,
            "requests_good": [50, 46, 30, 50, 45, 30],
            "requests_measured": [50] * 6,
        }
    )
    found = max_rate(points, 0.9)
    assert 2.0 < found["max_rate_rps"] < 2.5
    assert found["attainment_rate_rps"] == 2.0 and found["attainment_requests"] == 100
    assert found["attainment_at_max"] == pytest.approx(0.91)
    assert (found["attainment_ci_low"], found["attainment_ci_high"]) == pytest.approx(wilson_interval(91, 100))


def test_the_search_runs_each_new_rate_over_the_realisations_its_modes_plan_ran(tmp_path):
    # the experiment's own repeats (1) do not decide it: cloud AR planned over three, sync over one
    exp = experiment_from_dict({**BASE, "modes": ["ar", "sync"], "load": {**BASE["load"], "search_iterations": 3}})
    plan = [ServingPoint("ar", 20.0, 4, r) for r in range(3)] + [ServingPoint("sync", 20.0, 4, 0)]
    run_serving(exp, tmp_path, plan=plan)
    points = pd.read_csv(tmp_path / "points.csv")
    searched = points[points["searched"]]
    assert set(searched["mode"]) == {"ar", "sync"}
    for mode, realisations in (("ar", {0, 1, 2}), ("sync", {0})):
        mine = searched[searched["mode"] == mode]
        assert every(set(group["repeat"]) == realisations for _, group in mine.groupby("rate_rps")), mode


def test_compose_serves_open_loop_and_gets_the_admission_limit_as_its_own_setting(tmp_path, monkeypatch):
    from orchestrator.launchers import leftovers
    from orchestrator.launchers import compose
    from orchestrator.open_loop.plan import check_serving
    from orchestrator.open_loop.sweep import open_serving_testbed

    made = []
    monkeypatch.setattr(compose, "ComposeTestbed", lambda config: made.append(config) or config)
    monkeypatch.setattr(leftovers, "refuse_if_any", lambda services: made.append(("leftovers", services)))
    exp = experiment(max_sessions=7)
    check_serving(exp, "compose")
    open_serving_testbed(exp, "compose", tmp_path)
    assert made[0] == ("leftovers", False)
    assert (made[1].n_edges, made[1].max_sessions, made[1].adopt) == (4, 7, "auto")
    assert made[1].compose_env()["DSD_MAX_SESSIONS"] == "7"
    with pytest.raises(ValueError, match="launcher"):
        check_serving(exp, "swarm")


@pytest.mark.parametrize(
    "launcher, keys, named",
    [
        ("loopback", {"sampling": {"temperature": [0.0, 0.8]}}, "'sampling'"),
        ("loopback", {"link": {"schedule": [{"at_s": 1.0, "rtt_ms": 80}]}}, "'link.schedule'"),
        ("loopback", {"adaptive_budget_points": 10}, "'adaptive_budget_points'"),
        ("loopback", {"clients": [1, 4]}, "'clients'"),
        ("loopback", {"requests": 40}, "'requests'"),
        ("loopback", {"rtt_ms": [20, 40]}, "'rtt_ms'"),
        ("sim", {"modes": ["sync"], "sampling": {"temperature": 0.8}}, "'sampling.temperature'"),
        ("sim", {"modes": ["sync"], "controller": "model"}, "'controller'"),
        ("sim", {"request_deadline_s": 5.0}, "'request_deadline_s'"),
        ("sim", {"transport": "tcp"}, "'transport'"),
    ],
)
def test_what_an_open_loop_sweep_cannot_run_is_refused_in_one_line_naming_the_key(launcher, keys, named):
    from orchestrator.open_loop.plan import check_serving

    with pytest.raises(ValueError, match=named) as refused:
        check_serving(experiment_from_dict({**BASE, **keys}), launcher)
    assert "\n" not in str(refused.value)
