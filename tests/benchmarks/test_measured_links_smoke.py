"""benchmarks/measured_links.py on the sim launcher: on a short slice of the rural trace it runs the
four modes through the 12-s stall and prints its keys last, every stall request exact; on a few
seconds of every trace the adaptive controller against the per-segment oracle."""

import math

import pytest

from benchmarks import measured_links
from tests.checks import every


def test_the_benchmark_prints_its_keys_last_and_every_stall_request_is_exact(tmp_path, capsys):
    assert (
        measured_links.main(
            ["--launcher", "sim", "--slice-s", "8", "--stall-from-s", "83.5", "--requests", "4", "--out", str(tmp_path)]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = dict(item.split("=") for item in last.split())
    assert list(figures) == [
        "traces",
        "replay_err_p50_ms",
        "replay_err_p99_ms",
        "stall_requests",
        "stall_requests_exact",
        "rows_lost",
        "model_vs_oracle_pct_max",
        "best_static_vs_oracle_pct_min",
    ]
    assert figures["traces"] == "5" and figures["rows_lost"] == "0"
    assert int(figures["stall_requests"]) >= 3
    assert figures["stall_requests_exact"] == figures["stall_requests"]


def test_a_slice_starts_with_the_row_in_force_and_is_timed_from_zero():
    rows = measured_links.trace_slice(measured_links.RURAL, 84.0, 1.0)
    assert rows[0][0] == 0.0 and (0.149, 12066.0) in rows
    assert every(t < 1.0 for t, _ in rows)


def test_the_adaptive_part_prints_finite_figures_against_the_oracle_on_every_trace(tmp_path, capsys):
    """The adaptive controller on a few seconds of each trace (sim, a small scenario): the last line
    carries the model's worst trace and the best static's best, both finite; the parts not run, nan."""
    assert (
        measured_links.main(
            [
                "--launcher",
                "sim",
                "--parts",
                "adaptive",
                "--adaptive-slice-s",
                "6",
                "--adaptive-requests",
                "4",
                "--alpha-requests",
                "2",
                "--adaptive-tokens",
                "8",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.strip().splitlines()
    figures = dict(item.split("=") for item in out[-1].split())
    assert math.isfinite(float(figures["model_vs_oracle_pct_max"]))
    assert math.isfinite(float(figures["best_static_vs_oracle_pct_min"]))
    assert figures["replay_err_p50_ms"] == "nan" and figures["stall_requests"] == "nan"
    table = [line for line in out if line.split()[:1] and line.split()[0] in {p.name for p in measured_links.TRACES}]
    assert len(table) == 5 and all(len(line.split()) == 10 for line in table), table
    assert sorted(tmp_path.glob("adaptive-*.csv"))[0].name == "adaptive-south_n8_v10_02-12s.csv"


def test_an_adaptive_trace_finished_in_out_is_read_back_and_one_of_other_arguments_refused(tmp_path, capsys):
    """Resume by what is on disk: the same command again reads the trace's figures back instead of
    running it; the same --out with another scenario is refused rather than mixed in."""
    argv = [
        "--launcher",
        "sim",
        "--parts",
        "adaptive",
        "--traces",
        "urban_n78_v0_run01.csv",
        "--adaptive-slice-s",
        "6",
        "--adaptive-requests",
        "4",
        "--alpha-requests",
        "2",
        "--adaptive-tokens",
        "8",
        "--out",
        str(tmp_path),
    ]
    assert measured_links.main(argv) == 0
    first = capsys.readouterr().out.strip().splitlines()
    assert (tmp_path / "adaptive-urban_n78_v0_run01-0s.pkl").exists()
    assert measured_links.main(argv) == 0
    again = capsys.readouterr().out.strip().splitlines()
    assert any("read back from" in line for line in again) and not any("link:" in line for line in again)
    assert again[-1] == first[-1]
    with pytest.raises(SystemExit, match="other arguments"):
        measured_links.main(argv[:-2] + ["--warmup-requests", "0", "--out", str(tmp_path)])
