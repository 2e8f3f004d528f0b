"""Latency as users feel it (orchestrator/records/request_stats.py, analysis.user_latency): per-token
latency p50/p99, the longest gap per request in requests.csv, and the same over a point's tokens
in points.csv, so a stall moves the p99 and the longest gap instead of being averaged away."""

import math

import pandas as pd
import pytest

from orchestrator.records import request_stats
from orchestrator.analysis.points import point_table, user_latency


def test_tokens_that_arrive_together_share_the_wait_before_them():
    arrivals = [(10.0, 2), (10.1, 4), (10.3, 1)]
    assert request_stats.token_latencies_ms(arrivals) == pytest.approx([25.0] * 4 + [200.0])
    assert request_stats.longest_gap_ms(arrivals) == pytest.approx(200.0)
    # the charges sum to first -> last arrival: their mean is the steady time per token
    assert sum(request_stats.token_latencies_ms(arrivals)) == pytest.approx(300.0)
    assert request_stats.token_latencies_ms([(1.0, 3)]) == [] and math.isnan(request_stats.longest_gap_ms([(1.0, 3)]))


def _rounds(request_index: int, times_s: list[float], emitted: list[int], client: str = "0") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "client_id": client,
            "request_index": request_index,
            "t_receive_s": times_s,
            "emitted": emitted,
            "stale": False,
        }
    )


def test_a_stall_inside_a_request_is_its_longest_gap_and_its_p99_not_its_p50():
    steady = [0.02 * i for i in range(101)]  # 100 gaps of 20 ms, one token each
    stalled = steady[:50] + [t + 10.0 for t in steady[50:]]  # a 10-s stall between 49 and 50
    rounds = pd.concat([_rounds(0, steady, [1] * 101), _rounds(1, stalled, [1] * 101)])
    requests = pd.DataFrame({"client_id": ["0", "0"], "request_index": [0, 1]})
    out = request_stats.add_latency_stats(requests, rounds)
    assert out["token_latency_ms_p50"].tolist() == pytest.approx([20.0, 20.0])
    assert out["token_latency_ms_p99"].tolist() == pytest.approx([20.0, 20.0])  # 1 token in 100
    assert out["longest_gap_ms"].tolist() == pytest.approx([20.0, 10020.0])


def test_rounds_without_receipt_times_give_nan_columns():
    rounds = _rounds(0, [math.nan, math.nan], [3, 3])
    out = request_stats.add_latency_stats(pd.DataFrame({"client_id": ["0"], "request_index": [0]}), rounds)
    assert out[["token_latency_ms_p50", "token_latency_ms_p99", "longest_gap_ms"]].isna().all(axis=None)


def test_the_point_pools_every_token_and_counts_the_requests_given_up():
    rounds = pd.concat(
        [_rounds(i, [0.01 * k for k in range(101)], [1] * 101) for i in range(4)]
        + [_rounds(4, [0.0, 0.01, 5.01], [1, 1, 1])]
    )
    requests = pd.DataFrame(
        {
            "client_id": "0",
            "request_index": range(5),
            "ttft_s": [0.05] * 4 + [0.06],
            "gave_up": ["", "", "", "", "deadline: not done within request_deadline_s 5 (3 tokens)"],
        }
    )
    requests = request_stats.add_latency_stats(requests, rounds)
    latency = user_latency(requests, rounds)
    assert latency["token_latency_ms_p50"] == pytest.approx(10.0)
    assert latency["token_latency_ms_p99"] == pytest.approx(10.0)  # 1 of 402 tokens stalled
    assert latency["longest_gap_ms_max"] == pytest.approx(5000.0)
    assert latency["requests_gave_up"] == 1
    assert latency["ttft_ms_p99"] == pytest.approx(60.0, abs=0.5)


def test_points_csv_carries_the_user_latency_columns():
    rounds = _rounds(0, [0.1, 0.2, 2.2], [2, 2, 2]).assign(
        point="p", proposed=3, accepted=1, mode="sync", gamma=3, rtt_ms=20.0, clients=1, repeat=0, round_index=[0, 1, 2]
    )
    requests = pd.DataFrame(
        {
            "point": ["p"],
            "client_id": ["0"],
            "request_index": [0],
            "mode": ["sync"],
            "gamma": [3],
            "rtt_ms": [20.0],
            "clients": [1],
            "repeat": [0],
            "tokens": [6],
            "wall_s": [2.2],
            "ttft_s": [0.1],
            "steady_per_token_s": [0.525],
        }
    )
    requests = request_stats.add_latency_stats(requests, rounds)
    row = point_table(requests, rounds).iloc[0]
    assert row["longest_gap_ms_max"] == pytest.approx(2000.0)
    assert row["token_latency_ms_p99"] == pytest.approx(1000.0)
    assert row["requests_gave_up"] == 0
