"""The RTT x clients map: crossovers per client count with their intervals, the queueing model's
predictions written before the points with more clients run, and the map's figures."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from dsd.analytic import queueing
from orchestrator.analysis import bootstrap, frontier
from orchestrator.analysis.predictions import Predictor
from orchestrator.records.sweep_folder import run_sweep
from orchestrator.report import finding_plots
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.spec.plan import is_calibration, plan_points
from orchestrator.spec.workload import make_prompts

RTTS_MS = [0, 25, 50, 75, 100, 125, 150, 175, 200, 250]
CLIENTS = [1, 2, 3]


def _per_token_ms(mode: str, rtt_ms: float, clients: int) -> float:
    """A made-up map: co-located SD pays every client's round, pipelined DSD its round trip.
    pipelined = co-located at rtt = 80 N - 40: 40, 120 and 200 ms."""
    return {
        "colocated": 50.0 * clients,
        "pipelined": 30 + 0.5 * rtt_ms + 10 * (clients - 1),
        "ar": 60.0 * clients,
        "sync": 45 + 0.5 * rtt_ms + 10 * (clients - 1),
    }[mode]


def _constructed_sweep(rng_seed: int = 3):
    """(points, request latencies): two repeats of four requests a point, a little noise."""
    rng = np.random.default_rng(rng_seed)
    points, latencies = [], []
    for mode in ("ar", "colocated", "sync", "pipelined"):
        for rtt_ms in RTTS_MS:
            for clients in CLIENTS:
                for repeat in (0, 1):
                    key = {
                        "mode": mode,
                        "rtt_ms": rtt_ms,
                        "gamma": 0 if mode == "ar" else 2,
                        "clients": clients,
                        "repeat": repeat,
                    }
                    values = _per_token_ms(mode, rtt_ms, clients) * (1 + 0.01 * rng.standard_normal(4))
                    points.append({**key, "per_token_ms_p50": float(np.median(values))})
                    latencies += [{**key, "request_index": i, "per_token_ms": v} for i, v in enumerate(values)]
    return pd.DataFrame(points), pd.DataFrame(latencies)


def _predictions(points: pd.DataFrame, by_clients_ms: dict[int, float]) -> pd.DataFrame:
    """predictions.csv as the sweep writes it: a row per point, its client count's crossovers."""
    rows = points[["mode", "rtt_ms", "gamma", "clients", "repeat"]].copy()
    rows = rows[rows["gamma"] == 2]
    for name in queueing.FRONTIER_PAIRS:
        rows[f"crossover_{name}_rtt_ms"] = (
            rows["clients"].map(by_clients_ms) if name == "pipelined_vs_colocated" else math.nan
        )
    return rows


def _frontier(points, latencies, predictions):
    cell_keys = ["mode", "rtt_ms", "gamma", "clients"]
    _, reps = bootstrap.cell_replicates(latencies, cell_keys, n_boot=400)
    return frontier.frontier_rows(points, reps, cell_keys, {}, 2, predictions, lambda pair, n: -1.0)


def test_crossovers_are_measured_for_every_client_count_with_an_interval_around_them():
    points, latencies = _constructed_sweep()
    rows = _frontier(points, latencies, _predictions(points, {1: 38.0, 2: 110.0, 3: 215.0}))
    pipelined = {r["clients"]: r for r in rows if r["pair"] == "pipelined_vs_colocated"}
    assert sorted(pipelined) == CLIENTS
    for clients, expected_ms in ((1, 40.0), (2, 120.0), (3, 200.0)):
        row = pipelined[clients]
        assert row["crossover_ms"] == pytest.approx(expected_ms, abs=4.0)
        assert row["ci_low_ms"] <= row["crossover_ms"] <= row["ci_high_ms"]
        assert row["ci_high_ms"] - row["ci_low_ms"] < 25.0 and not row["ci_covers_grid"]
    # predicted before the points ran: out of sample above the calibration's client count
    assert [pipelined[n]["in_or_out_of_sample"] for n in CLIENTS] == ["in_sample", "out_of_sample", "out_of_sample"]
    assert pipelined[2]["predicted_ms"] == 110.0
    assert pipelined[2]["err_pct"] == pytest.approx(100 * abs(pipelined[2]["crossover_ms"] / 110.0 - 1))
    # every pair of the map whose two modes ran, at every client count
    names = {r["pair"] for r in rows}
    assert names == {"pipelined_vs_colocated", "sync_vs_colocated", "sync_vs_ar", "pipelined_vs_ar"}
    evidence = frontier.frontier_evidence(rows)
    assert evidence["err_rows"] == 2 and evidence["err_max_pct"] == pytest.approx(
        max(pipelined[n]["err_pct"] for n in (2, 3))
    )


def test_the_bootstrap_is_drawn_jointly_across_client_counts():
    # A request that is slow in every point (its prompt) moves both curves alike; with shared
    # draws a crossover's interval stays narrow even though each cell's own interval is wide.
    points, latencies = _constructed_sweep()
    slow = latencies["request_index"] == 0
    latencies.loc[slow, "per_token_ms"] *= 1.6
    rows = _frontier(points, latencies, None)
    row = next(r for r in rows if r["pair"] == "sync_vs_colocated" and r["clients"] == 2)
    assert row["ci_high_ms"] - row["ci_low_ms"] < 60.0
    assert row["in_or_out_of_sample"] == "in_sample" and row["predicted_ms"] == -1.0  # no predictions: the fallback


def test_regime_cells_name_the_fastest_mode_and_its_margin():
    points, _ = _constructed_sweep()
    cells = points.groupby(["mode", "rtt_ms", "gamma", "clients"], as_index=False)["per_token_ms_p50"].median()
    regime = frontier.regime_cells(cells.rename(columns={"per_token_ms_p50": "per_token_ms"}), 2)
    at = regime.set_index(["clients", "rtt_ms"])
    assert at.loc[(1, 0), "fastest"] == "pipelined" and at.loc[(1, 250), "fastest"] == "colocated"
    assert at.loc[(3, 100), "fastest"] == "pipelined"
    assert at.loc[(1, 0), "margin_pct"] == pytest.approx(100 * (45 / 30 - 1), abs=3)


def test_the_map_figures_are_drawn(tmp_path):
    points, latencies = _constructed_sweep()
    rows = pd.DataFrame(_frontier(points, latencies, _predictions(points, {1: 38.0, 2: 110.0, 3: 215.0})))
    cells = points.groupby(["mode", "rtt_ms", "gamma", "clients"], as_index=False)["per_token_ms_p50"].median()
    regime = frontier.regime_cells(cells.rename(columns={"per_token_ms_p50": "per_token_ms"}), 2)
    for path in (
        finding_plots.plot_regime_map(regime, rows, tmp_path / "regime_map.png", "map", "sim"),
        finding_plots.plot_frontier(rows, tmp_path / "frontier.png", "frontier", "sim"),
    ):
        assert path.stat().st_size > 10_000


def test_points_with_more_clients_are_predicted_by_the_queueing_model_before_they_run(tmp_path):
    """A sweep over clients 1..3 (the sim launcher runs one client: here every point runs as one,
    only the order and the prediction are under test)."""
    out = tmp_path / "s"
    experiment = experiment_from_dict(
        {
            "name": "frontier",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 20],
            "gamma": [4],
            "clients": CLIENTS,
            "requests": 3,
            "max_new_tokens": 40,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "alpha": 0.8},
        }
    )
    from dsd.backends.factory import load_pair
    from orchestrator.launchers.sim import SimTestbed
    from orchestrator.running.run import assumed_times, point_settings, times_for

    times = {experiment.profile: times_for(experiment, out)}
    testbed = SimTestbed(*load_pair(experiment.backend), times[experiment.profile])
    prompts = make_prompts(
        experiment.backend, experiment.warmup_requests + experiment.requests, experiment.prompt_tokens, experiment.seed
    )

    def run_point(point):
        return testbed.run_point(dataclasses.replace(point, clients=1), prompts, point_settings(experiment))

    predict = Predictor(experiment, out, lambda p: assumed_times(p, experiment, times))
    run_sweep(experiment, out, run_point, facts={"launcher": "sim", "costs": {}}, predict=predict)
    predictions = pd.read_csv(out / "predictions.csv")
    done = {p.parent.name: json.loads(p.read_text()) for p in (out / "points").glob("*/done.json")}
    plan = plan_points(experiment)
    assert sorted(predictions["point"]) == sorted(p.key for p in plan)
    several = predictions[predictions["clients"] > 1]
    assert several["predicted_at_s"].max() < min(done[k]["started_s"] for k in several["point"])
    assert all(not is_calibration(p, experiment) for p in plan if p.clients > 1)
    calibration = json.loads((out / "calibration.json").read_text())["all"]
    from dsd.costs.compute_times import ComputeTimes

    params = ComputeTimes.from_dict(calibration["params"])
    for row in several.itertuples():
        expected_ms = 1e3 * queueing.per_token_s(
            row.mode, row.clients, calibration["alpha"], 4, row.rtt_ms / 1e3, params
        )
        assert row.per_token_ms_predicted == pytest.approx(expected_ms)
        assert row.crossover_pipelined_vs_colocated_rtt_ms == pytest.approx(
            1e3 * queueing.crossover_rtt_s("pipelined_vs_colocated", row.clients, calibration["alpha"], 4, params)
        )
    one = predictions[predictions["clients"] == 1]
    by_clients = predictions.groupby("clients")["crossover_pipelined_vs_colocated_rtt_ms"].first()
    assert by_clients[1] < by_clients[2] < by_clients[3]
    assert one["per_token_ms_predicted"].notna().all()


def _one_request_per_client(clients_of: list[int], requests: int = 1, seed: int = 5):
    """(points, request latencies) with client_ids: each client's request(s) per point, the
    clients' per-token times spread by where they sit in the verifier's queue (a client's offset
    kept across its requests and across points, as one edge's would be), one repeat."""
    rng = np.random.default_rng(seed)
    points, latencies = [], []
    for clients in clients_of:
        offset = {c: 8.0 * rng.standard_normal() for c in range(clients)}
        for mode in ("colocated", "pipelined"):
            for rtt_ms in RTTS_MS:
                key = {"mode": mode, "rtt_ms": rtt_ms, "gamma": 2, "clients": clients, "repeat": 0}
                values = []
                for c in range(clients):
                    for i in range(requests):
                        value = _per_token_ms(mode, rtt_ms, clients) + offset[c] + rng.standard_normal()
                        values.append(value)
                        latencies.append({**key, "client_id": str(c), "request_index": i, "per_token_ms": value})
                points.append({**key, "per_token_ms_p50": float(pd.Series(values).quantile(0.5))})
    return pd.DataFrame(points), pd.DataFrame(latencies)


def test_with_one_request_per_client_the_clients_are_redrawn_and_the_interval_holds_the_crossover():
    points, latencies = _one_request_per_client([2, 3])
    cell_keys = ["mode", "rtt_ms", "gamma", "clients"]
    cells, _ = bootstrap.cell_replicates(latencies, cell_keys, n_boot=400)
    # the bootstrap's full-sample statistic is the point's reported p50 (median over all its requests)
    merged = cells.merge(points, on=cell_keys)
    assert np.allclose(merged["per_token_ms"], merged["per_token_ms_p50"])
    rows = [r for r in _frontier(points, latencies, None) if r["pair"] == "pipelined_vs_colocated"]
    assert sorted(r["clients"] for r in rows) == [2, 3]
    for row in rows:
        assert row["ci_high_ms"] - row["ci_low_ms"] > 1.0, row
        assert row["ci_low_ms"] <= row["crossover_ms"] <= row["ci_high_ms"], row
        assert not row["ci_degenerate"] and not row["ci_covers_grid"]


def test_one_client_intervals_do_not_depend_on_the_client_counts_beside_them():
    points, latencies = _constructed_sweep()
    one = latencies["clients"] == 1
    alone = bootstrap.cell_replicates(latencies[one], ["mode", "rtt_ms", "gamma", "clients"], n_boot=200)[1]
    beside = bootstrap.cell_replicates(
        latencies.assign(client_id="0"), ["mode", "rtt_ms", "gamma", "clients"], n_boot=200
    )[1]
    for cell, values in alone.items():
        assert np.array_equal(values, beside[cell])


def test_a_single_request_a_cell_gives_a_degenerate_interval_that_is_flagged_not_shown_as_spread():
    points, latencies = _one_request_per_client([1])
    rows = [r for r in _frontier(points, latencies, None) if r["pair"] == "pipelined_vs_colocated"]
    (row,) = rows
    assert row["ci_degenerate"] and row["ci_low_ms"] == row["ci_high_ms"] == pytest.approx(row["crossover_ms"])
    cell_keys = ["mode", "rtt_ms", "gamma", "clients"]
    _, reps = bootstrap.cell_replicates(latencies, cell_keys, n_boot=100)
    ci = bootstrap.crossover_cis(reps, cell_keys, {"gamma": 2, "clients": 1}, RTTS_MS, queueing.FRONTIER_PAIRS)
    text = bootstrap.describe_crossover(row["crossover_ms"], ci["pipelined_vs_colocated"])
    assert "no interval" in text and "95% CI" not in text


def test_rows_whose_edges_slowed_each_other_are_flagged_with_the_measured_draft_step_ratio():
    points, latencies = _constructed_sweep()
    # Pipelined edges draft at once and share a core: their step grows with N; sync's does not.
    steps_ms = {"pipelined": {1: 14.0, 2: 23.0, 3: 42.0}, "sync": {1: 15.0, 2: 16.0, 3: 17.0}}
    points["t_draft_ms_measured"] = [
        steps_ms.get(m, {}).get(n, math.nan) for m, n in zip(points["mode"], points["clients"])
    ]
    rows = {(r["pair"], r["clients"]): r for r in _frontier(points, latencies, None)}
    assert rows[("pipelined_vs_colocated", 3)]["edge_draft_step_ratio"] == pytest.approx(3.0)
    assert rows[("pipelined_vs_colocated", 3)]["edge_draft_inflated"]
    assert rows[("pipelined_vs_colocated", 2)]["edge_draft_inflated"]
    assert not rows[("pipelined_vs_colocated", 1)]["edge_draft_inflated"]
    assert rows[("sync_vs_colocated", 3)]["edge_draft_step_ratio"] == pytest.approx(17 / 15)
    assert not rows[("sync_vs_colocated", 3)]["edge_draft_inflated"]
    evidence = frontier.frontier_evidence(list(rows.values()))
    assert evidence["edge_draft_inflated_rows"] == [
        "pipelined_vs_colocated at N = 2",
        "pipelined_vs_ar at N = 2",
        "pipelined_vs_colocated at N = 3",
        "pipelined_vs_ar at N = 3",
    ]


def test_without_measured_draft_steps_no_row_is_flagged():
    points, latencies = _constructed_sweep()
    rows = _frontier(points, latencies, None)
    assert rows and all(math.isnan(r["edge_draft_step_ratio"]) and not r["edge_draft_inflated"] for r in rows)


def test_the_reports_map_table_shows_the_edge_draft_step_and_names_an_inflated_row():
    from orchestrator.report.findings import frontier_sections

    points, latencies = _constructed_sweep()
    points["t_draft_ms_measured"] = [
        {1: 14.0, 2: 15.0, 3: 42.0}[n] if m == "pipelined" else math.nan
        for m, n in zip(points["mode"], points["clients"])
    ]
    rows = _frontier(points, latencies, None)
    summary = {
        "frontier": {"what": frontier.WHAT, "max_batch": 1, "rows": rows, **frontier.frontier_evidence(rows)},
        "plots": [],
    }
    ((_, parts),) = frontier_sections(summary)
    _, header, cells = next(part for part in parts if part[0] == "table")
    by_row = {(int(c[0]), c[1]): c[header.index("edge draft step vs fewest clients")] for c in cells}
    assert by_row[(3, "pipelined vs colocated")] == "x3.00 (the edges slowed each other)"
    assert by_row[(2, "pipelined vs colocated")] == "x1.07"
    assert by_row[(3, "sync vs colocated")] == ""
