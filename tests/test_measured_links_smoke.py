"""benchmarks/measured_links.py on a short slice of the rural trace, on the sim launcher: it runs
the four modes through the 12-s stall and prints its keys last, every stall request exact."""
from benchmarks import measured_links


def test_the_benchmark_prints_its_keys_last_and_every_stall_request_is_exact(tmp_path, capsys):
    assert measured_links.main(["--launcher", "sim", "--slice-s", "8", "--stall-from-s", "83.5", "--requests", "4",
                                "--out", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in last.split())
    assert list(figures) == ["traces", "replay_err_p50_ms", "replay_err_p99_ms", "stall_requests",
                             "stall_requests_exact", "rows_lost", "model_vs_oracle_pct_max",
                             "best_static_vs_oracle_pct_min"]
    assert figures["traces"] == "5" and figures["rows_lost"] == "0"
    assert int(figures["stall_requests"]) >= 3
    assert figures["stall_requests_exact"] == figures["stall_requests"]


def test_a_slice_starts_with_the_row_in_force_and_is_timed_from_zero():
    rows = measured_links.trace_slice(measured_links.RURAL, 84.0, 1.0)
    assert rows[0][0] == 0.0 and (0.149, 12066.0) in rows
    assert all(t < 1.0 for t, _ in rows)
