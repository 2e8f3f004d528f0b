"""benchmarks/regime_map.py runs end to end on a tiny sim grid and prints every figure issue 57
asks for; the ones it cannot measure without a network or real-pair sweep print as nan."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from tests.benchmarks.test_benchmark_smoke import _run

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.regime_map import real_figures  # noqa: E402

KEYS = (
    "launcher",
    "client_counts",
    "clients_max",
    "frontier_inside_share",
    "frontier_ci_finite_share",
    "frontier_err_p50_pct",
    "frontier_err_max_pct",
    "slope_ms_per_client",
    "slope_predicted_ms_per_client",
    "sim_vs_net_err_max_pct",
    "sim_clients_max",
    "real_clients_max",
    "real_frontier_err_max_pct",
    "wan_crossover_ms",
    "real_edge_draft_step_ratio_max",
)


def test_regime_map_on_a_tiny_sim_grid_prints_the_frontiers_figures(tmp_path):
    figures = _run(
        [
            "benchmarks/regime_map.py",
            "--clients",
            "1,2,4",
            "--rtt-ms",
            "0,10,25,50",
            "--max-new-tokens",
            "12",
            "--warmup-requests",
            "0",
            "--out",
            str(tmp_path / "out"),
        ],
        tmp_path,
    )
    assert all(key in figures for key in KEYS), figures
    assert figures["launcher"] == "sim" and figures["client_counts"] == "1,2,4" and figures["clients_max"] == 4
    assert figures["sim_clients_max"] == 4
    # The model puts the crossover at about 12 and 35 ms for 2 and 4 clients: inside 0..50 ms, and
    # the measured line rises with the clients as the predicted one does.
    assert figures["frontier_inside_share"] >= 2 / 3
    assert figures["slope_ms_per_client"] > 5 and figures["slope_predicted_ms_per_client"] > 5
    assert math.isfinite(figures["frontier_err_max_pct"])
    for key in (
        "sim_vs_net_err_max_pct",
        "real_clients_max",
        "real_frontier_err_max_pct",
        "wan_crossover_ms",
        "real_edge_draft_step_ratio_max",
    ):
        assert math.isnan(figures[key]), key


def test_the_real_pairs_figures_name_the_largest_edge_draft_inflation():
    rows = [
        {
            "clients": n,
            "crossover_ms": x,
            "predicted_ms": p,
            "in_or_out_of_sample": "out_of_sample",
            "edge_draft_step_ratio": ratio,
        }
        for n, x, p, ratio in ((1, -math.inf, -math.inf, 1.0), (2, 32.0, 68.0, 1.7), (4, 86.0, 233.0, 4.9))
    ]
    figures = real_figures(rows)
    assert figures["real_clients_max"] == 4 and figures["wan_crossover_ms"] == 86.0
    assert figures["real_edge_draft_step_ratio_max"] == 4.9
    assert round(figures["real_frontier_err_max_pct"], 1) == round(100 * (1 - 86 / 233), 1)
