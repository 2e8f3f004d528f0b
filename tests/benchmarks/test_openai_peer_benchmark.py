"""benchmarks/openai_peer.py's join of a peer's records with our rows: a request the peer sent
with no row of ours is lost, a failed one is not ok, and the diffs are of the p50s."""

import json

import pandas as pd
import pytest

from benchmarks.openai_peer import join, peer_records, summary


def test_a_peer_request_without_our_row_is_lost_and_the_diffs_compare_p50s(tmp_path):
    records = [
        {
            "metadata": {"x_request_id": f"r{i}", "benchmark_phase": "profiling"},
            "metrics": {"time_to_first_token": {"value": 110.0 + i}, "inter_token_latency": {"value": 20.0}},
        }
        for i in range(4)
    ]
    records.append({"metadata": {"x_request_id": "w", "benchmark_phase": "warmup"}, "metrics": {}})
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(map(json.dumps, records)))
    ours = pd.DataFrame(
        {
            "request_id": ["r0", "r1", "r2", "w"],
            "ttft_s": [0.1, 0.1, 0.1, 0.1],
            "steady_per_token_s": [0.02, 0.02, 0.025, 0.02],
            "error": [None] * 4,
            "gave_up": [None] * 4,
        }
    )
    figures = summary(join(peer_records(path), ours))
    assert (figures["requests"], figures["requests_ok"], figures["rows_lost"]) == (4, 3, 1)
    assert float(figures["ttft_diff_pct"]) == pytest.approx(11.0)  # 111 against 100
    assert float(figures["itl_diff_pct"]) == pytest.approx(0.0)
