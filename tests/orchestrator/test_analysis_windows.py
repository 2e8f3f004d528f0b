"""Known-answer checks of the gain-window and capacity analysis on hand-made traces."""

import math

import numpy as np
import pandas as pd
import pytest

from dsd.analytic import latency_model as lm
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis.fits import fit_effective_params
from orchestrator.analysis.points import (
    add_speedups,
    point_table,
    predicted_ar_boundary_alpha,
    predicted_ar_boundary_rtt_ms,
)
from orchestrator.analysis import bootstrap
from orchestrator.analysis import capacity
from orchestrator.analysis import paper
from tests.checks import every

TOY = ComputeTimes.from_dict(
    {"t_draft_edge_s": 0.004, "t_draft_server_s": 0.002, "t_ar_s": 0.010, "t_verify_s": {4: 0.010}}
)


def test_overlap_window_counts_only_what_arrived_while_every_client_ran():
    receipts = [np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([1.5, 2.5, 3.5, 5.0])]
    emitted = [np.array([1, 2, 3, 4, 5]), np.array([10, 20, 30, 40])]
    window_s, rounds, tokens = capacity.overlap_counts(receipts, emitted)
    # Window (1.5, 4.0]: client 0 rounds at 2, 3, 4; client 1 at 2.5, 3.5 (1.5 itself opens it).
    assert window_s == pytest.approx(2.5)
    assert (rounds, tokens) == (5, 3 + 4 + 5 + 20 + 30)


def test_overlap_rate_per_client_from_round_rows():
    rows = [
        {"client_id": c, "t_receive_s": 0.1 * i + 0.05 * c, "emitted": 3, "stale": False}
        for c in (0, 1)
        for i in range(11)
    ]
    rate = capacity.overlap_tok_s_per_client(pd.DataFrame(rows))
    # Each client gets 3 tokens every 0.1 s.
    assert rate == pytest.approx(30.0, rel=0.06)


def test_capacity_at_interpolates_the_largest_sustained_count():
    clients = np.array([1, 2, 4, 8])
    per_token_s = 0.018 * clients  # saturated co-located SD: linear in the clients
    assert capacity.capacity_at(clients, per_token_s, 0.08) == pytest.approx(0.08 / 0.018)
    assert capacity.capacity_at(clients, per_token_s, 1.0) == 8  # every count meets it
    assert math.isnan(capacity.capacity_at(clients, per_token_s, 0.001))  # none does


def test_capacity_ratio_of_saturated_curves_is_one_plus_gamma_td_over_tv():
    """Per client round: co-located n*(gamma*t_d + t_v), DSD max(floor, n*t_v)."""
    gamma, t_d, t_v, e = 4, 0.002, 0.010, 3.0
    rows = []
    for n in (1, 2, 4, 6, 8):
        rows.append({"mode": "colocated", "clients": n, "tok_s_per_client": e / (n * (gamma * t_d + t_v))})
        rows.append({"mode": "sync", "clients": n, "tok_s_per_client": e / max(0.036, n * t_v)})
    ratio = capacity.capacity_ratio(pd.DataFrame(rows), "sync")
    assert ratio["clients_dsd"] == 8
    assert ratio["ratio_measured"] == pytest.approx(lm.capacity_factor(gamma, t_d, t_v))


def _saturated_points(t_v_by_repeat: list[float], gamma=4, t_d=0.002, e=3.0) -> pd.DataFrame:
    """points.csv rows of a capacity sweep whose server took t_v per pass in repeat r."""
    rows = []
    for repeat, t_v in enumerate(t_v_by_repeat):
        for n in (1, 2, 4, 6, 8):
            rows.append(
                {
                    "mode": "colocated",
                    "clients": n,
                    "repeat": repeat,
                    "tok_s_per_client_overlap": e / (n * (gamma * t_d + t_v)),
                }
            )
            rows.append(
                {"mode": "sync", "clients": n, "repeat": repeat, "tok_s_per_client_overlap": e / max(0.036, n * t_v)}
            )
    return pd.DataFrame(rows)


def test_capacity_ratio_replicates_redraw_the_repeats_jointly():
    gamma, t_d = 4, 0.002
    points = _saturated_points([0.008, 0.010, 0.012])
    replicates = capacity.capacity_ratio_replicates(points, "sync", n_boot=400, seed=3)
    assert len(replicates) == 400 and not np.isnan(replicates).any()
    # A joint draw keeps each replicate's curves those of one machine speed or a mix of them, so
    # every ratio lies between the slowest and the fastest repeat's own 1 + gamma*t_d/t_v.
    slowest, fastest = lm.capacity_factor(gamma, t_d, 0.012), lm.capacity_factor(gamma, t_d, 0.008)
    assert replicates.min() >= slowest - 1e-9 and replicates.max() <= fastest + 1e-9
    assert np.unique(replicates.round(6)).size > 2  # the draw varies
    same = capacity.capacity_ratio_replicates(_saturated_points([0.010] * 3), "sync", n_boot=50, seed=3)
    assert same == pytest.approx(np.full(50, lm.capacity_factor(gamma, t_d, 0.010)))
    assert capacity.capacity_ratio_replicates(_saturated_points([0.010]), "sync", n_boot=50, seed=3).size == 0
    assert capacity.capacity_ratio_replicates(points, "pipelined", n_boot=50, seed=3).size == 0


def test_summary_capacity_interval_names_its_repeats():
    entry = bootstrap.capacity_ratio_interval(_saturated_points([0.008, 0.010, 0.012]), "sync")
    assert entry["ratio_repeats"] == 3 and entry["ratio_replicates_undefined"] == 0.0
    assert entry["ratio_ci_low"] < entry["ratio_ci_high"]
    assert paper.ratio_interval(entry).startswith("95% CI ") and paper.ratio_interval(entry).endswith(", 3 repeats")
    single = bootstrap.capacity_ratio_interval(_saturated_points([0.010]), "sync")
    assert single["ratio_repeats"] == 1 and math.isnan(single["ratio_ci_low"])
    assert paper.ratio_interval(single) == "one repeat: no interval"


def test_gain_window_boundaries_agree_both_ways():
    for alpha in (0.75, 0.85, 0.95):
        rtt_ms = predicted_ar_boundary_rtt_ms("sync", alpha, 4, TOY)
        assert predicted_ar_boundary_alpha("sync", rtt_ms, 4, TOY) == pytest.approx(alpha, abs=1e-6)
        # Pipelined: RTT(alpha) has flat steps (a verdict is noticed at the end of a draft
        # step), so the inverse is the smallest alpha that reaches the same RTT.
        rtt_ms = predicted_ar_boundary_rtt_ms("pipelined", alpha, 4, TOY)
        inverse = predicted_ar_boundary_alpha("pipelined", rtt_ms, 4, TOY)
        assert inverse <= alpha + 1e-6
        assert predicted_ar_boundary_rtt_ms("pipelined", inverse, 4, TOY) == pytest.approx(rtt_ms, abs=1e-3)
    # Sync: docs/concepts.md's window with t_verify = t_ar.
    e = lm.expected_tokens_per_round(0.9, 4)
    assert predicted_ar_boundary_rtt_ms("sync", 0.9, 4, TOY) == pytest.approx(1e3 * (0.010 * (e - 1) - 0.016))
    assert predicted_ar_boundary_rtt_ms("sync", 0.5, 4, TOY) == -math.inf
    # Pipelining hides part of the round trip: a wider window.
    assert predicted_ar_boundary_rtt_ms("pipelined", 0.9, 4, TOY) > predicted_ar_boundary_rtt_ms("sync", 0.9, 4, TOY)


def test_speedups_compare_with_ar_of_the_same_group_rtt_and_repeat():
    points = pd.DataFrame(
        [
            {"alpha": 0.6, "mode": "ar", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 10.0},
            {
                "alpha": 0.6,
                "mode": "sync",
                "rtt_ms": 0,
                "gamma": 4,
                "clients": 1,
                "repeat": 0,
                "per_token_ms_p50": 20.0,
            },
            {"alpha": 0.9, "mode": "ar", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 12.0},
            {"alpha": 0.9, "mode": "sync", "rtt_ms": 0, "gamma": 4, "clients": 1, "repeat": 0, "per_token_ms_p50": 6.0},
        ]
    )
    speedups = add_speedups(points)["speedup_vs_ar"].tolist()
    assert speedups == [1.0, 0.5, 1.0, 2.0]


def two_clients_point(keys: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(requests, rounds, links) of a point with two clients, six rounds each."""
    requests = pd.DataFrame(
        [
            {
                **keys,
                "client_id": c,
                "request_index": 0,
                "steady_per_token_s": 0.01 * (1 + c),
                "rtt_probe_ms": 21.0,
                "ttft_s": 0.05,
                "tokens": 40,
                "wall_s": 0.5,
            }
            for c in (0, 1)
        ]
    )
    # The last round is cut short by max_new_tokens (4 accepted, 2 emitted).
    rounds = pd.DataFrame(
        [
            {
                **keys,
                "client_id": c,
                "request_index": 0,
                "round_index": i,
                "proposed": 4,
                "accepted": 4 if i % 2 else 1,
                "emitted": (2 if i == 5 else 5) if i % 2 else 2,
                "stale": False,
                "t_draft_start_s": i * 0.1,
                "t_draft_end_s": i * 0.1 + 0.016,
                "t_receive_s": i * 0.1 + 0.05,
                "server_compute_s": 0.011,
            }
            for c in (0, 1)
            for i in range(6)
        ]
    )
    links = pd.DataFrame(
        [
            {**keys, "edge": f"e{i}", "rtt_configured_ms": 20.0, "rtt_measured_p50_ms": m}
            for i, m in enumerate((20.2, 20.6))
        ]
    )
    return requests, rounds, links


def test_points_table_has_every_column_the_issue_lists_and_the_link_rtt():
    keys = {"mode": "sync", "rtt_ms": 20.0, "gamma": 4, "clients": 2, "repeat": 0}
    requests, rounds, links = two_clients_point(keys)
    row = point_table(requests, rounds, links).iloc[0]
    for column in (
        "mode",
        "rtt_configured_ms",
        "rtt_measured_ms",
        "rtt_link_measured_ms",
        "clients",
        "gamma",
        "alpha_measured",
        "t_draft_ms_measured",
        "t_verify_ms_measured",
        "per_token_ms_mean",
        "per_token_ms_p50",
        "per_token_ms_p99",
        "throughput_tok_s",
        "tok_s_per_client",
        "tok_s_per_client_overlap",
    ):
        assert column in row.index, column
    assert row.rtt_configured_ms == 20.0 and row.rtt_link_measured_ms == pytest.approx(20.4)
    assert row.t_draft_ms_measured == pytest.approx(4.0) and row.t_verify_ms_measured == pytest.approx(11.0)
    assert row.alpha_measured == pytest.approx(15 / (15 + 3))  # 3x4 + 3x1 accepted, 3 rejections per client
    # Steady state: first receipt to the last full round's, over the tokens in between.
    assert row.per_token_ms_mean == pytest.approx(1e3 * 0.4 / (5 + 2 + 5 + 2))
    assert row.throughput_tok_s == pytest.approx(2 * row.tok_s_per_client) and row.tok_s_per_client == pytest.approx(
        80.0
    )


def test_client_view_parameters_add_the_measured_harness_overhead():
    rows = []
    for i in range(8):  # AR: a token every 11 ms, 10 ms of compute
        rows.append(
            {
                "point": "ar",
                "mode": "ar",
                "gamma": 4,
                "rtt_ms": 20.0,
                "client_id": 0,
                "request_index": 0,
                "round_index": i,
                "proposed": 0,
                "accepted": 0,
                "emitted": 1,
                "stale": False,
                "t_send_s": None,
                "t_receive_s": 0.011 * i,
                "t_draft_start_s": None,
                "t_draft_end_s": None,
                "server_queue_s": 0.0,
                "server_compute_s": 0.010,
            }
        )
    receive_s = 0.0
    for i in range(8):  # sync: 4 drafts of 4 ms + 0.8 ms edge work, RTT 20 ms, 10 + 1.5 ms verdict
        start_s = receive_s + 0.0003
        send_s = start_s + 0.016 + 0.0005
        rows.append(
            {
                "point": "sync",
                "mode": "sync",
                "gamma": 4,
                "rtt_ms": 20.0,
                "client_id": 0,
                "request_index": 0,
                "round_index": i,
                "proposed": 4,
                "accepted": 2,
                "emitted": 3,
                "stale": False,
                "t_draft_start_s": start_s,
                "t_draft_end_s": start_s + 0.016,
                "t_send_s": send_s,
                "t_receive_s": send_s + 0.020 + 0.0115,
                "server_queue_s": 0.0,
                "server_compute_s": 0.010,
            }
        )
        receive_s = rows[-1]["t_receive_s"]
    compute = TOY
    params, source, overhead_ms = fit_effective_params(pd.DataFrame(rows), compute)
    assert params.t_ar_s == pytest.approx(0.011) and overhead_ms["ar_step"] == pytest.approx(1.0)
    assert params.t_verify_s(4) == pytest.approx(0.0115) and overhead_ms["dsd_round_server_side"] == pytest.approx(1.5)
    assert params.t_draft_edge_s == pytest.approx(0.0168 / 4) and overhead_ms["dsd_round_edge_side"] == pytest.approx(
        0.8
    )
    assert params.t_draft_server_s == 0.002 and "no receipt times" in source["t_draft_server_s"]
    assert compute.verify_table_s == {4: 0.010}  # the compute-only parameters are left alone


def test_a_requests_first_round_and_its_prefill_stay_out_of_the_sync_fit():
    rows, receive_s = [], 0.0
    for i in range(6):  # sync: 8 ms of drafts, RTT 0, 10 ms pass + 1 ms; the first round also prefills 40 ms
        send_s = receive_s + 0.008
        prefill_s = 0.040 if i == 0 else 0.0
        rows.append(
            {
                "point": "sync",
                "mode": "sync",
                "gamma": 4,
                "rtt_ms": 0.0,
                "client_id": 0,
                "request_index": 0,
                "round_index": i,
                "proposed": 4,
                "accepted": 2,
                "emitted": 3,
                "stale": False,
                "t_draft_start_s": receive_s,
                "t_draft_end_s": send_s,
                "t_send_s": send_s,
                "t_receive_s": send_s + prefill_s + 0.011,
                "server_queue_s": 0.0,
                "server_compute_s": 0.010,
            }
        )
        receive_s = rows[-1]["t_receive_s"]
    params, _, overhead_ms = fit_effective_params(pd.DataFrame(rows), TOY)
    assert params.t_verify_s(4) == pytest.approx(0.011) and overhead_ms["dsd_round_server_side"] == pytest.approx(1.0)


def test_backlogged_gaps_are_the_idle_time_before_passes_whose_work_was_waiting():
    # Passes [0, 10], [10.5, 20], [25, 30], [30.2, 31] (ms); the third's job arrived at 24,
    # after the second ended: idle for want of work, not a hand-off. Order of rows is free.
    starts = np.array([10.5, 0.0, 30.2, 25.0]) / 1e3
    ends = np.array([20.0, 10.0, 31.0, 30.0]) / 1e3
    ready = np.array([3.0, 0.0, 29.0, 24.0]) / 1e3
    gaps = capacity.backlogged_gaps_s(starts, ends, ready)
    assert gaps == pytest.approx([0.0005, 0.0002])


def test_fit_cost_line_recovers_t1_and_the_slope_from_means_by_batch_size():
    # t(b) = 8 ms * (1 + 0.25 (b - 1)) = 6 + 2b ms: size 1 takes 8 ms on average (7, 7, 10),
    # size 5 takes 16 ms (15, 17).
    sizes = np.array([1, 1, 1, 5, 5])
    times = np.array([7.0, 7.0, 10.0, 15.0, 17.0]) / 1e3
    t1, s = capacity.fit_cost_line(sizes, times)
    assert t1 == pytest.approx(0.008)
    assert s == pytest.approx(0.25)
    assert every(math.isnan(x) for x in capacity.fit_cost_line(np.array([3, 3]), np.array([0.01, 0.01])))
