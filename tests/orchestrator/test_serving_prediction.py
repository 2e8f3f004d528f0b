"""What an open-loop sweep predicts before it runs, and the check that a point's queue was still
building at its end."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.running.run import times_for
from orchestrator.open_loop.plan import PREDICTION, ServingPoint
from orchestrator.open_loop.sweep import run_serving, run_sim_point, write_prediction
from orchestrator.open_loop.figures import add_slo, in_system_at, point_figures, queue_growing, queue_growth
from tests.checks import every

BASE = {
    "name": "predict",
    "launcher": "sim",
    "modes": ["ar", "colocated", "sync"],
    "profile": "toy-edge-cloud",
    "edges": 4,
    "rtt_ms": [20],
    "max_new_tokens": 24,
    "prompt_tokens": 8,
    "seed": 3,
    "backend": {"kind": "synthetic", "alpha": 0.8},
    "load": {"rate_rps": [5.0, 40.0], "duration_s": 20, "warmup_s": 2, "search_iterations": 6},
    "slo": {"ttft_ms": 300, "tpot_ms": 30, "attainment": 0.9},
}


def test_a_stationary_queue_is_rarely_flagged_and_a_building_one_always():
    rng = np.random.default_rng(7)
    stationary = [queue_growing(rng.geometric(0.3, 120) - 1) for _ in range(400)]
    assert np.mean(stationary) < 0.06  # four rising batch means by chance: 1/24
    building = [queue_growing(np.linspace(1, 12, 120) + rng.geometric(0.3, 120)) for _ in range(50)]
    assert every(building)


def test_the_stationarity_check_needs_enough_arrivals_and_more_than_a_request_of_growth():
    assert not queue_growing(np.linspace(0, 10, 12))  # 12 arrivals: too few to say
    assert not queue_growing(np.linspace(0.1, 0.9, 200))  # rising, but by under one request
    assert queue_growth(np.r_[np.full(50, 1.0), np.full(50, 3.0)]) == pytest.approx(3.0)
    assert np.isnan(queue_growth(np.zeros(100)))


def test_requests_in_the_system_are_those_arrived_and_not_yet_answered():
    arrival_s, end_s = np.array([0.0, 1.0, 2.0, 3.0]), np.array([2.5, 1.5, np.nan, 10.0])
    assert list(in_system_at(arrival_s, end_s, np.array([0.0, 1.0, 2.0, 3.0, 11.0]))) == [0, 1, 1, 0, 0]


def test_a_saturated_sim_point_is_flagged_as_still_building_and_a_light_one_is_not(tmp_path):
    exp = experiment_from_dict({**BASE, "load": {**BASE["load"], "search_iterations": 0, "max_sessions": 5000}})
    for mode in ("ar", "colocated", "sync"):
        for rate, growing in ((2.0, False), (40.0, True)):
            rows = add_slo(
                pd.DataFrame(run_sim_point(exp, ServingPoint(mode, rate, 4, 0), times_for(exp, tmp_path))[1]), exp.slo
            )
            assert point_figures(rows)["queue_growing"] == growing, (mode, rate)


def test_the_run_prediction_is_the_virtual_time_model_on_the_sweeps_own_arrivals(tmp_path):
    exp = experiment_from_dict(BASE)
    times = times_for(exp, tmp_path)
    # as a network sweep writes it before its first point ...
    (tmp_path / "net").mkdir()
    write_prediction(tmp_path / "net", exp, times, "netns")
    predicted = json.loads((tmp_path / "net" / PREDICTION).read_text())
    # ... against the sim launcher's measurement on the same arrivals: the same model, searched apart
    run_serving(exp, tmp_path / "sim")
    measured = json.loads((tmp_path / "sim" / "serving.json").read_text())
    for mode in ("ar", "colocated", "sync"):
        row = predicted["modes"][mode]
        assert row["run_max_rate_ci_low_rps"] <= row["run_max_rate_rps"] <= row["run_max_rate_ci_high_rps"]
        assert row["run_max_rate_rps"] == pytest.approx(measured["modes"][mode]["max_rate_rps"], rel=0.05)
        assert 0 < row["steady_max_rate_rps"] < row["saturation_rps"]
    # the sim launcher's own file has the closed form alone (the run is the model), made before its points
    own = json.loads((tmp_path / "sim" / PREDICTION).read_text())
    assert "run_max_rate_rps" not in own["modes"]["sync"] and measured["prediction_made_before_points"]
    assert measured["modes"]["sync"]["predicted_max_rate_rps"] is None
    assert measured["modes"]["sync"]["steady_max_rate_rps"] == own["modes"]["sync"]["steady_max_rate_rps"]


def test_a_resumed_sweep_keeps_the_prediction_it_made_first(tmp_path):
    exp = experiment_from_dict({**BASE, "modes": ["sync"]})
    times = times_for(exp, tmp_path)
    write_prediction(tmp_path, exp, times, "netns")
    first = (tmp_path / PREDICTION).read_text()
    write_prediction(tmp_path, exp, times, "netns")
    assert (tmp_path / PREDICTION).read_text() == first


def test_a_run_whose_level_is_out_of_reach_is_predicted_as_no_rate_rather_than_failing(tmp_path):
    # one session at a time and a 1 ms TTFT bound: no rate meets the level, down to no arrival at all
    exp = experiment_from_dict(
        {**BASE, "modes": ["ar"], "load": {**BASE["load"], "max_sessions": 1}, "slo": {"ttft_ms": 1, "attainment": 0.9}}
    )
    write_prediction(tmp_path, exp, times_for(exp, tmp_path), "netns")
    row = json.loads((tmp_path / PREDICTION).read_text())["modes"]["ar"]
    # no rate: NaN, the JSON files' one rule for a number that is not finite (docs/outputs.md)
    assert math.isnan(row["run_max_rate_rps"]) and row["steady_max_rate_rps"] == 0.0


def test_the_prediction_pools_each_modes_own_realisations_as_its_measurement_does(tmp_path):
    exp = experiment_from_dict({**BASE, "modes": ["ar", "sync"]})
    times = times_for(exp, tmp_path)
    (tmp_path / "net").mkdir()
    write_prediction(tmp_path / "net", exp, times, "netns", repeats={"ar": 3, "sync": 1})
    predicted = json.loads((tmp_path / "net" / PREDICTION).read_text())["modes"]
    # the sim launcher over the same realisations per mode: the same model, searched apart
    plan = [ServingPoint("ar", 5.0, 4, r) for r in range(3)] + [ServingPoint("sync", 5.0, 4, 0)]
    run_serving(exp, tmp_path / "sim", plan=plan)
    measured = json.loads((tmp_path / "sim" / "serving.json").read_text())["modes"]
    assert measured["ar"]["repeats"] == 3 and measured["sync"]["repeats"] == 1
    for mode in ("ar", "sync"):
        assert predicted[mode]["run_max_rate_rps"] == pytest.approx(measured[mode]["max_rate_rps"], rel=0.05), mode
    # one realisation of cloud AR is not what three pool to
    (tmp_path / "one").mkdir()
    write_prediction(tmp_path / "one", exp, times, "netns", repeats={"ar": 1, "sync": 1})
    single = json.loads((tmp_path / "one" / PREDICTION).read_text())["modes"]
    assert single["ar"]["run_max_rate_rps"] != predicted["ar"]["run_max_rate_rps"]
    assert single["sync"]["run_max_rate_rps"] == predicted["sync"]["run_max_rate_rps"]
