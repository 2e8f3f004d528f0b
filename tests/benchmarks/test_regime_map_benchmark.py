"""benchmarks/regime_map.py runs end to end on a tiny sim grid and prints every figure issue 57
asks for; the ones it cannot measure without a network or real-pair sweep print as nan."""
from __future__ import annotations

import math

from tests.benchmarks.test_benchmark_smoke import _run

KEYS = ("launcher", "client_counts", "clients_max", "frontier_inside_share", "frontier_ci_finite_share",
        "frontier_err_p50_pct", "frontier_err_max_pct", "slope_ms_per_client", "slope_predicted_ms_per_client",
        "sim_vs_net_err_max_pct", "sim_clients_max", "real_clients_max", "real_frontier_err_max_pct",
        "wan_crossover_ms")


def test_regime_map_on_a_tiny_sim_grid_prints_the_frontiers_figures(tmp_path):
    figures = _run(["benchmarks/regime_map.py", "--clients", "1,2,4", "--rtt-ms", "0,10,25,50",
                    "--max-new-tokens", "12", "--warmup-requests", "0", "--out", str(tmp_path / "out")], tmp_path)
    assert all(key in figures for key in KEYS), figures
    assert figures["launcher"] == "sim" and figures["client_counts"] == "1,2,4" and figures["clients_max"] == 4
    assert figures["sim_clients_max"] == 4
    # The model puts the crossover at about 12 and 35 ms for 2 and 4 clients: inside 0..50 ms, and
    # the measured line rises with the clients as the predicted one does.
    assert figures["frontier_inside_share"] >= 2 / 3
    assert figures["slope_ms_per_client"] > 5 and figures["slope_predicted_ms_per_client"] > 5
    assert math.isfinite(figures["frontier_err_max_pct"])
    for key in ("sim_vs_net_err_max_pct", "real_clients_max", "real_frontier_err_max_pct", "wan_crossover_ms"):
        assert math.isnan(figures[key]), key
