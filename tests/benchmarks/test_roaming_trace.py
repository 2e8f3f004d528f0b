"""The roaming-client RTT trace (benchmarks/roaming_trace.py) and the adaptive benchmark replaying
a trace (benchmarks/adaptive.py --rtt-trace)."""

import gzip
import pickle
from pathlib import Path

import pytest

from benchmarks import adaptive
from benchmarks.roaming_trace import RoamingConfig, main as trace_main, pair_levels_ms, roaming_trace
from netem.schedule import LinkSchedule
from orchestrator.links.geography import pair_stats
from tests.checks import every

ROOT = Path(__file__).resolve().parents[2]


def _data(tmp_path: Path) -> str:
    """A small country-pair file in the data's format, with means the real one does not have."""
    path = tmp_path / "pairs.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(
            "cty1,cty2,rtt_cnt,rtt_avg,rtt_std,rtt_min,rtt_max\n"
            "AA,AA,10,12.4,3,5,40\nAA,BB,10,99.6,20,50,400\nAA,CC,10,250.2,30,100,900\n"
        )
    return str(path)


def test_the_trace_is_the_same_for_a_seed_and_differs_between_seeds():
    config = RoamingConfig(duration_s=120.0, seed=3)
    assert roaming_trace(config) == roaming_trace(RoamingConfig(duration_s=120.0, seed=3))
    assert roaming_trace(config) != roaming_trace(RoamingConfig(duration_s=120.0, seed=4))


def test_levels_are_the_pairs_mean_rtts_from_the_data_file_and_every_boundary_changes_the_pair(tmp_path):
    config = RoamingConfig(
        pairs=("AA-AA", "AA-BB", "CC-AA"),
        duration_s=200.0,
        mean_segment_s=5.0,
        min_segment_s=2.0,
        seed=1,
        data_path=_data(tmp_path),
    )
    assert pair_levels_ms(config) == {"AA-AA": 12.0, "AA-BB": 100.0, "CC-AA": 250.0}
    rows = roaming_trace(config)
    assert rows[0][:3] == (0.0, 12.0, "AA-AA")
    assert {rtt for _, rtt, _ in rows} == {12.0, 100.0, 250.0}
    times = [t for t, _, _ in rows]
    assert every(b - a >= 2.0 - 1e-9 for a, b in zip(times, times[1:])) and times[-1] < 200.0
    assert every(a[2] != b[2] for a, b in zip(rows, rows[1:]))
    # the real file: the default pairs' levels are their means there, rounded
    real = pair_levels_ms(RoamingConfig())
    assert real == {p: float(round(pair_stats(*p.split("-")).mean_ms)) for p in RoamingConfig().pairs}


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(pairs=("DE-DE", "DE-XX")), r"pairs\[1\]"),
        (dict(pairs=("DE-DE", "DEUS")), r"pairs\[1\]"),
        (dict(pairs=("DE-DE",)), "pairs"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(seed=True), "seed"),
        (dict(duration_s=0), "duration_s"),
        (dict(duration_s=float("nan")), "duration_s"),
        (dict(min_segment_s=0), "min_segment_s"),
        (dict(mean_segment_s=3.0, min_segment_s=3.0), "mean_segment_s"),
    ],
)
def test_bad_input_is_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        roaming_trace(RoamingConfig(**changes))


def test_the_shipped_trace_is_what_its_documented_command_writes(tmp_path):
    out = tmp_path / "trace.csv"
    trace_main(
        [
            "--pairs",
            "DE-DE",
            "DE-US",
            "DE-JP",
            "--duration-s",
            "300",
            "--mean-segment-s",
            "6",
            "--min-segment-s",
            "3",
            "--seed",
            "0",
            "--out",
            str(out),
        ]
    )
    shipped = ROOT / "experiments" / "traces" / "roaming-de.csv"
    assert out.read_text() == shipped.read_text()
    schedule = LinkSchedule.from_trace_csv(shipped)  # the link schedule's trace format
    assert {dict(s.changes)["rtt_ms"] for s in schedule.steps} == {27.0, 114.0, 174.0}


def test_adaptive_benchmark_replays_a_trace_on_sim_with_an_oracle_per_level_and_class(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("t_s,rtt_ms\n0,20\n0.3,120\n0.8,20\n")
    save = tmp_path / "runs.pkl"
    adaptive.main(
        [
            "--launcher",
            "sim",
            "--seeds",
            "1",
            "--rtt-trace",
            str(trace),
            "--requests",
            "4",
            "--tokens",
            "8",
            "--alpha-requests",
            "2",
            "--modes",
            "ar",
            "sync",
            "--gamma-max",
            "4",
            "--save",
            str(save),
        ]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    keys = [item.split("=")[0] for item in last.split()]
    assert keys == [
        "model_vs_oracle_pct",
        "bandit_vs_oracle_pct",
        "heuristic_vs_oracle_pct",
        "best_static_vs_oracle_pct",
        "switches_per_100_rounds",
        "launcher",
        "goals_met",
    ]
    saved = pickle.loads(save.read_bytes())
    assert saved["scenario"].levels_ms() == [20.0, 120.0]
    _, best = saved["per_seed"][0]
    assert set(best) == {(rtt, alpha) for rtt in (20.0, 120.0) for alpha in (0.9, 0.3)}


def test_adaptive_benchmark_refuses_a_trace_it_cannot_replay(tmp_path):
    late = tmp_path / "late.csv"
    late.write_text("t_s,rtt_ms\n1,20\n2,120\n")
    with pytest.raises(ValueError, match="t_s 0"):
        adaptive.load_rtt_trace(str(late))
    jitter = tmp_path / "jitter.csv"
    jitter.write_text("t_s,rtt_ms,jitter_ms\n0,20,1\n")
    with pytest.raises(ValueError, match="jitter_ms"):
        adaptive.load_rtt_trace(str(jitter))
    with pytest.raises(SystemExit):
        adaptive.parse_args(["--rtt-trace", str(late), "--segment-s", "4"])
    flat = tmp_path / "flat.csv"
    flat.write_text("t_s,rtt_ms\n0,150\n1000,150\n")
    with pytest.raises(ValueError, match="one RTT level"):
        adaptive.load_rtt_trace(str(flat))


def test_a_network_run_the_schedule_never_changed_in_is_refused_by_name():
    from benchmarks.adaptive_netns import _runs

    with pytest.raises(ValueError, match="no change of the link schedule"):
        _runs([], [], [{"change_index": 0, "change_at_s": 0.0, "change_t_unix_s": 1.0}], lambda index: 0.9)
