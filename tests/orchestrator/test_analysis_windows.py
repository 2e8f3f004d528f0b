"""Known-answer checks of the gain-window and capacity analysis on hand-made traces."""
import math

import numpy as np
import pandas as pd
import pytest

from dsd import latency_model as lm
from orchestrator import analysis

TOY = {"t_draft_edge_s": 0.004, "t_draft_server_s": 0.002, "t_ar_s": 0.010, "t_verify_s": {4: 0.010}}


def test_overlap_window_counts_only_what_arrived_while_every_client_ran():
    receipts = [np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([1.5, 2.5, 3.5, 5.0])]
    emitted = [np.array([1, 2, 3, 4, 5]), np.array([10, 20, 30, 40])]
    window_s, rounds, tokens = analysis.overlap_counts(receipts, emitted)
    # Window (1.5, 4.0]: client 0 rounds at 2, 3, 4; client 1 at 2.5, 3.5 (1.5 itself opens it).
    assert window_s == pytest.approx(2.5)
    assert (rounds, tokens) == (5, 3 + 4 + 5 + 20 + 30)


def test_overlap_rate_per_client_from_round_rows():
    rows = [{"client_id": c, "t_receive_s": 0.1 * i + 0.05 * c, "emitted": 3, "stale": False}
            for c in (0, 1) for i in range(11)]
    rate = analysis.overlap_tok_s_per_client(pd.DataFrame(rows))
    # Each client gets 3 tokens every 0.1 s.
    assert rate == pytest.approx(30.0, rel=0.06)


def test_capacity_at_interpolates_the_largest_sustained_count():
    clients = np.array([1, 2, 4, 8])
    per_token_s = 0.018 * clients                 # saturated co-located SD: linear in the clients
    assert analysis.capacity_at(clients, per_token_s, 0.08) == pytest.approx(0.08 / 0.018)
    assert analysis.capacity_at(clients, per_token_s, 1.0) == 8            # every count meets it
    assert math.isnan(analysis.capacity_at(clients, per_token_s, 0.001))   # none does


def test_capacity_ratio_of_saturated_curves_is_one_plus_gamma_td_over_tv():
    """Per client round: co-located n*(gamma*t_d + t_v), DSD max(floor, n*t_v)."""
    gamma, t_d, t_v, e = 4, 0.002, 0.010, 3.0
    rows = []
    for n in (1, 2, 4, 6, 8):
        rows.append({"mode": "colocated", "clients": n, "tok_s_per_client": e / (n * (gamma * t_d + t_v))})
        rows.append({"mode": "sync", "clients": n, "tok_s_per_client": e / max(0.036, n * t_v)})
    ratio = analysis.capacity_ratio(pd.DataFrame(rows), "sync")
    assert ratio["clients_dsd"] == 8
    assert ratio["ratio_measured"] == pytest.approx(lm.capacity_factor(gamma, t_d, t_v))


def test_gain_window_boundaries_agree_both_ways():
    for alpha in (0.75, 0.85, 0.95):
        rtt_ms = analysis.predicted_ar_boundary_rtt_ms("sync", alpha, 4, TOY)
        assert analysis.predicted_ar_boundary_alpha("sync", rtt_ms, 4, TOY) == pytest.approx(alpha, abs=1e-6)
        # Pipelined: RTT(alpha) has flat steps (a verdict is noticed at the end of a draft
        # step), so the inverse is the smallest alpha that reaches the same RTT.
        rtt_ms = analysis.predicted_ar_boundary_rtt_ms("pipelined", alpha, 4, TOY)
        inverse = analysis.predicted_ar_boundary_alpha("pipelined", rtt_ms, 4, TOY)
        assert inverse <= alpha + 1e-6
        assert analysis.predicted_ar_boundary_rtt_ms("pipelined", inverse, 4, TOY) == pytest.approx(rtt_ms, abs=1e-3)
    # Sync: REFERENCE.md's window with t_verify = t_ar.
    e = lm.expected_tokens_per_round(0.9, 4)
    assert analysis.predicted_ar_boundary_rtt_ms("sync", 0.9, 4, TOY) == pytest.approx(1e3 * (0.010 * (e - 1) - 0.016))
    assert analysis.predicted_ar_boundary_rtt_ms("sync", 0.5, 4, TOY) == -math.inf
    # Pipelining hides part of the round trip: a wider window.
    assert analysis.predicted_ar_boundary_rtt_ms("pipelined", 0.9, 4, TOY) > \
        analysis.predicted_ar_boundary_rtt_ms("sync", 0.9, 4, TOY)


def test_speedups_compare_with_ar_of_the_same_group_rtt_and_repeat():
    points = pd.DataFrame([
        {"alpha": 0.6, "mode": "ar", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 10.0},
        {"alpha": 0.6, "mode": "sync", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 20.0},
        {"alpha": 0.9, "mode": "ar", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 12.0},
        {"alpha": 0.9, "mode": "sync", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 6.0},
    ])
    speedups = analysis.add_speedups(points)["speedup_vs_ar"].tolist()
    assert speedups == [1.0, 0.5, 1.0, 2.0]
