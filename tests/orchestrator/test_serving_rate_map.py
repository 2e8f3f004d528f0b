"""The open-loop rate map ([load] rtt_ms): the largest rate at the SLO per mode and RTT, picked
right from a constructed table, found at the hand-solvable stability limit of a deterministic
server, predicted before the points, and a bad rate-map experiment refused with its key named."""

import json
import math

import pandas as pd
import pytest

from orchestrator.open_loop.plan import check_serving, plan_serving
from orchestrator.open_loop.rate_map import rate_frontier
from orchestrator.open_loop.sweep import run_serving
from orchestrator.spec.experiment import experiment_from_dict


def table(rows: list[tuple[float, str, float, float]]) -> pd.DataFrame:
    """points.csv rows from (rtt_ms, mode, rate_rps, attainment), 100 requests each, one repeat."""
    return pd.DataFrame(
        [
            {
                "rtt_ms": rtt,
                "mode": mode,
                "rate_rps": rate,
                "repeat": 0,
                "requests_good": round(100 * att),
                "requests_measured": 100,
            }
            for rtt, mode, rate, att in rows
        ]
    )


def test_the_frontier_picks_the_last_rate_met_before_the_first_miss_and_the_best_mode_per_rtt():
    points = table(
        [
            (10, "ar", 1, 1.0),
            (10, "ar", 2, 0.95),
            (10, "ar", 3, 0.5),
            (10, "ar", 4, 0.2),
            (10, "sync", 1, 1.0),
            (10, "sync", 2, 1.0),
            (10, "sync", 3, 0.99),
            (10, "sync", 4, 0.95),
            # a dip and a recovery above it: the first miss ends what is sustained
            (100, "ar", 1, 0.95),
            (100, "ar", 2, 0.85),
            (100, "ar", 3, 0.92),
            (100, "ar", 4, 0.1),
            (100, "sync", 1, 0.5),
            (100, "sync", 2, 0.1),
            (100, "sync", 3, 0.0),
            (100, "sync", 4, 0.0),
        ]
    )
    predicted = [{"rtt_ms": 10.0, "mode": "ar", "predicted_rps": 2.0}]
    rows = {(r["rtt_ms"], r["mode"]): r for r in rate_frontier(points, 0.9, predicted)}

    ar = rows[(10.0, "ar")]
    assert (ar["met_rps"], ar["missed_rps"]) == (2.0, 3.0)
    assert ar["max_rate_rps"] == pytest.approx(2 + 0.05 / 0.45)  # interpolated inside the bracket
    assert ar["ci_low_rps"] <= ar["max_rate_rps"] <= ar["ci_high_rps"]
    assert ar["err_pct"] == pytest.approx(100 * (ar["max_rate_rps"] - 2) / 2)
    sync = rows[(10.0, "sync")]
    assert sync["censored"] and sync["max_rate_rps"] == 4.0 and math.isnan(sync["missed_rps"])
    assert sync["best"] and not ar["best"]
    assert sync["margin_pct"] == pytest.approx(100 * (4.0 / ar["max_rate_rps"] - 1))

    dip = rows[(100.0, "ar")]
    assert (dip["met_rps"], dip["missed_rps"]) == (1.0, 2.0)
    assert dip["max_rate_rps"] == pytest.approx(1.5)
    below = rows[(100.0, "sync")]
    assert below["below_grid"] and math.isnan(below["max_rate_rps"])
    assert (below["met_rps"], below["missed_rps"], below["ci_low_rps"], below["ci_high_rps"]) == (0, 1, 0, 1)
    assert dip["best"] and not below["best"]


# toy-edge-cloud: t_ar 10 ms, t_verify 10 ms, a server draft step 2 ms, prefill 0.1 ms a token
PROMPT, TOKENS, GAMMA = 8, 8, 4
SERVER_S = {
    "ar": PROMPT * 1e-4 + TOKENS * 0.010,  # the prefill, one AR pass a token
    "colocated": PROMPT * 1e-4 + math.ceil(TOKENS / (GAMMA + 1)) * (GAMMA * 0.002 + 0.010),  # alpha 1: 2 rounds
}
# each mode's TPOT alone, doubled as soon as a second request shares the server
TPOT_MS = {"ar": 15.0, "colocated": 3.9}
GRID = (0.90, 0.94, 0.98, 1.02, 1.06, 1.10)  # times the stability limit: 4% resolution


def rate_map_experiment(mode: str, **changes) -> dict:
    limit_rps = 1 / SERVER_S[mode]
    spec = {
        "name": "rate-map",
        "launcher": "sim",
        "modes": [mode],
        "profile": "toy-edge-cloud",
        "edges": 2,
        "gamma": [GAMMA],
        "max_new_tokens": TOKENS,
        "prompt_tokens": PROMPT,
        "backend": {"kind": "synthetic", "alpha": 1.0},
        "load": {
            "arrival_process": "gamma_gaps",
            "cv": 0.01,
            "rate_rps": [round(f * limit_rps, 4) for f in GRID],
            "requests": 400,
            "rtt_ms": [10, 80],
            "max_sessions": 5000,
        },
        "slo": {"tpot_ms": TPOT_MS[mode], "attainment": 0.9},
    }
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    return spec


@pytest.mark.parametrize("mode", ["ar", "colocated"])
def test_a_deterministic_server_sustains_one_request_per_its_work_at_every_rtt(mode, tmp_path):
    """Deterministic service (alpha 1: every request the same passes) and nearly deterministic
    arrivals (gamma gaps, cv 0.01): below 1/S no two requests share the server, above it the
    backlog grows by the excess each arrival, so TPOT doubles within a few dozen requests and
    attainment collapses. The largest rate at the SLO is the stability limit 1/S = 1 / (prefill +
    passes per request x t_pass), at any RTT (the link delays every arrival alike)."""
    experiment = experiment_from_dict(rate_map_experiment(mode))
    run_serving(experiment, tmp_path)
    summary = json.loads((tmp_path / "serving.json").read_text())
    limit_rps = 1 / SERVER_S[mode]
    rows = summary["rate_frontier"]
    assert [(r["rtt_ms"], r["mode"]) for r in rows] == [(10.0, mode), (80.0, mode)]
    for row in rows:
        assert row["met_rps"] <= limit_rps <= row["missed_rps"]
        assert abs(row["max_rate_rps"] - limit_rps) <= 0.04 * limit_rps  # the grid's resolution
        assert row["predicted_rps"] > 0 and row["best"]
    assert summary["prediction_made_before_points"] is True
    prediction = json.loads((tmp_path / "prediction.json").read_text())
    assert [(p["rtt_ms"], p["mode"]) for p in prediction["rate_frontier"]] == [(10.0, mode), (80.0, mode)]
    assert (tmp_path / "rate_map.png").stat().st_size > 0
    points = pd.read_csv(tmp_path / "points.csv")
    assert set(points["rtt_ms"]) == {10.0, 80.0} and len(points) == 2 * len(GRID)


def test_the_plan_runs_the_whole_grid_at_each_rtt_with_its_own_keys():
    experiment = experiment_from_dict(rate_map_experiment("ar"))
    plan = plan_serving(experiment)
    assert len(plan) == 2 * len(GRID) and {p.rtt_ms for p in plan} == {10.0, 80.0}
    assert len({p.key for p in plan}) == len(plan) and plan[0].key.startswith("ar_rtt10ms_rate")


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"rtt_ms": [30]}, "'rtt_ms'"),
        ({"link": {"edges": [{"rtt_ms": 30}]}}, "'link.edges'"),
        ({"slo": None}, "add an [slo] table"),
    ],
)
def test_a_rate_map_with_a_second_source_of_rtts_or_no_slo_is_refused_naming_the_key(changes, key):
    spec = rate_map_experiment("ar")
    for name, value in changes.items():
        if value is None:
            spec.pop(name)
        else:
            spec[name] = value
    with pytest.raises(ValueError, match="rate map") as error:
        check_serving(experiment_from_dict(spec), "sim")
    assert key in str(error.value)


@pytest.mark.parametrize(
    "load, message",
    [
        ({"rtt_ms": [10, 10]}, "load.rtt_ms"),
        ({"rtt_ms": [-5]}, "load.rtt_ms"),
    ],
)
def test_a_bad_load_rtt_grid_is_refused_on_reading(load, message):
    spec = rate_map_experiment("ar", load=load)
    with pytest.raises(ValueError, match=message):
        experiment_from_dict(spec)
