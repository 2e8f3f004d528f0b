"""The measured 5G traces (netem/measured.py, data/cicv5g/): the converter on each raw file gives
the rows, duration and RTT percentiles of the data set's PROVENANCE.md, and the shipped CSVs are
exactly its output on the raw files whose sha256 data/README.md records."""

import os
import re
from pathlib import Path

import pytest

from netem.measure import percentile
from netem import measured
from netem.schedule import LinkSchedule

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "cicv5g"
# The raw files live beside the repository (they are not shipped; their hashes are).
RAW = Path(os.environ.get("DSD_CICV5G_RAW", ROOT.parent / "shared" / "data" / "traces" / "cicv5g"))
NAMES = ["urban_n78_v30_run01", "urban_n8_v30_run01", "urban_n78_v0_run01", "w2s_n78_v30_run01", "south_n8_v10_02"]
needs_raw = pytest.mark.skipif(not (RAW / "PROVENANCE.md").exists(), reason=f"raw CICV5G files not at {RAW}")


def _table(text: str) -> dict[str, list[str]]:
    """The rows of a markdown table keyed by their first cell's first word, without the .txt/.csv."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] and not set(cells[0]) <= set("-"):
            rows[re.sub(r"\.(txt|csv)$", "", cells[0].split()[0])] = cells
    return rows


def _provenance() -> dict[str, dict]:
    out = {}
    for name, cells in _table((RAW / "PROVENANCE.md").read_text()).items():
        if name in NAMES:
            p50, p95, p99, top = (float(x) for x in cells[4].split("/"))
            out[name] = {"rows": int(cells[2]), "duration_s": int(cells[3]), "p": (p50, p95, p99, top)}
    return out


def _readme_hashes() -> dict[str, str]:
    return {
        name: cells[1].strip("`")
        for name, cells in _table((ROOT / "data" / "README.md").read_text()).items()
        if name in NAMES
    }


@needs_raw
@pytest.mark.parametrize("name", NAMES)
def test_the_converter_gives_the_provenance_figures_of_each_raw_file(name):
    expected = _provenance()[name]
    trace = measured.to_trace(measured.read_raw(RAW / f"{name}.txt"))
    f = measured.figures(trace)
    assert f["rows"] == expected["rows"]
    assert round(f["duration_s"]) == expected["duration_s"]
    assert (f["rtt_p50_ms"], f["rtt_p95_ms"], f["rtt_p99_ms"], f["rtt_max_ms"]) == expected["p"]
    assert trace[0] == (0.0, trace[0][1]) and all(b[0] >= a[0] for a, b in zip(trace, trace[1:]))


@needs_raw
@pytest.mark.parametrize("name", NAMES)
def test_the_shipped_trace_is_the_conversion_of_the_raw_file_whose_hash_the_readme_records(name):
    raw = RAW / f"{name}.txt"
    assert measured.sha256(raw) == _readme_hashes()[name]
    assert (SHIPPED / f"{name}.csv").read_text() == measured.format_trace(measured.to_trace(measured.read_raw(raw)))


@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_trace_loads_as_a_link_schedule_at_the_raw_sampling(name):
    schedule = LinkSchedule.from_trace_csv(SHIPPED / f"{name}.csv")
    rtts = [dict(step.changes)["rtt_ms"] for step in schedule.steps]
    assert len(schedule.steps) > 1000 and schedule.steps[0].at_s == 0
    gaps = [b.at_s - a.at_s for a, b in zip(schedule.steps, schedule.steps[1:])]
    assert 0.05 <= sorted(gaps)[len(gaps) // 2] <= 0.06  # one echo every ~55 ms
    assert min(rtts) > 0


def test_the_rural_trace_holds_a_twelve_second_stall_that_drains_as_a_queue():
    trace = [
        (s.at_s, dict(s.changes)["rtt_ms"]) for s in LinkSchedule.from_trace_csv(SHIPPED / "south_n8_v10_02.csv").steps
    ]
    assert measured.stalls(trace, min_rtt_ms=5000) == [(84.149, 12066.0)]
    i = trace.index((84.149, 12066.0))
    held = [(t, rtt) for t, rtt in trace[i : i + 400] if rtt >= 1000]
    # the ~220 echoes sent in the 12 s came back within 0.4 s of each other, when the link returned
    returns_s = [t + rtt / 1000 for t, rtt in held]
    assert len(held) > 200 and max(returns_s) - min(returns_s) < 0.5


def test_resampling_keeps_the_largest_rtt_of_a_bin_and_holds_over_empty_bins():
    trace = [(0.0, 20.0), (0.05, 30.0), (0.12, 25.0), (0.35, 25.0), (0.41, 9000.0)]
    assert measured.resample(trace, 0.1) == [(0.0, 30.0), (0.1, 25.0), (0.4, 9000.0)]
    with pytest.raises(ValueError, match="step_s"):
        measured.resample(trace, 0)


def test_the_traces_percentile_is_the_inverted_cdf():
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([1, 2, 3, 4], 51) == 3
    assert percentile(list(range(1, 101)), 99) == 99


def test_a_raw_file_with_a_wrong_header_or_an_inconsistent_delay_is_refused(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("time delay\n1 2\n")
    with pytest.raises(ValueError, match="header"):
        measured.read_raw(bad)
    bad.write_text("pub_time(ms) sub_time(ms) delay(ms)\n1000 1020 21\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: delay 21 ms is not sub - pub = 20 ms"):
        measured.read_raw(bad)


def test_the_cli_writes_the_trace_and_refuses_to_overwrite(tmp_path, capsys):
    raw = tmp_path / "r.txt"
    raw.write_text("pub_time(ms) sub_time(ms) delay(ms) x\n1000 1020 20 a\n1055 1080 25 b\n")
    assert measured.main([str(raw), "--out-dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "r.csv").read_text() == "t_s,rtt_ms\n0,20\n0.055,25\n"
    assert "rows=2" in capsys.readouterr().out
    assert measured.main([str(raw), "--out-dir", str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("measured-*.toml")), ids=lambda p: p.stem)
def test_each_scenario_experiment_loads_its_trace_and_runs_on_the_sim_and_netns(path, monkeypatch):
    from orchestrator.spec.experiment import load_experiment
    from orchestrator.links.keys import check_launcher

    monkeypatch.chdir(Path("/"))  # trace_csv is taken from the file's folder, wherever one runs it
    experiment = load_experiment(path)
    assert experiment.link.trace_csv.startswith(str(ROOT / "data" / "cicv5g"))
    assert len(experiment.link.schedule.steps) > 1000
    assert set(experiment.modes) == {"ar", "sync", "pipelined", "colocated"} and experiment.request_deadline_s > 0
    check_launcher(experiment, "sim")
    check_launcher(experiment, "netns")
