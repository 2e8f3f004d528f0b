"""benchmarks/echo_floor.py: the paced echo that hf_overhead.py reports as the floor under the
server overhead (its cadence checked, the server's compute left out of what it returns), and
hf_overhead's cadence taken from a sync run's rounds."""

import statistics
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.echo_floor import EchoCadence, _SpinSelector, compute, paced_echo_ms  # noqa: E402
from benchmarks.hf_overhead import sync_cadence  # noqa: E402


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"transport": "udp"}, "transport"),
        ({"draft_s": -0.001}, "draft_s"),
        ({"verify_s": float("nan")}, "verify_s"),
        ({"verify_s": 2.0}, "verify_s"),
        ({"spin": 1}, "spin"),
    ],
)
def test_cadence_refuses_bad_values_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        EchoCadence(**fields)


def test_spin_windows_cover_the_other_sides_compute_plus_a_millisecond():
    cadence = EchoCadence("tcp", 0.004, 0.006, spin=True)
    assert (cadence.client_spin_s, cadence.server_spin_s) == (pytest.approx(0.007), pytest.approx(0.005))
    assert EchoCadence("tcp", 0.004, 0.006).client_spin_s == 0.0


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_paced_echo_leaves_the_servers_compute_out(transport):
    values = paced_echo_ms(EchoCadence(transport, 0.002, 0.008), 20, warmup=2)
    assert len(values) == 20 and min(values) > 0
    # 8 ms of compute per answer are left out: what is left is the transport (well under it)
    assert statistics.median(values) < 4.0, values
    with pytest.raises(ValueError, match="n_messages"):
        paced_echo_ms(EchoCadence(transport), 0)


def test_the_echo_spin_selector_polls_no_longer_than_its_bound():
    selector = _SpinSelector(0.004)
    try:
        cpu_before_s, started_s = time.thread_time(), time.perf_counter()
        assert selector.select(0.02) == []
        assert time.perf_counter() - started_s >= 0.019
        assert time.thread_time() - cpu_before_s <= 0.004 + 0.003
    finally:
        selector.close()
    started_s = time.perf_counter()
    compute(0.003)
    assert time.perf_counter() - started_s >= 0.003


def test_hf_overhead_takes_the_echo_cadence_from_the_steady_sync_rounds():
    def row(index, draft_ms, compute_ms):
        return {
            "round_index": str(index),
            "t_draft_start_s": "1.0",
            "t_draft_end_s": str(1.0 + draft_ms / 1e3),
            "server_compute_s": str(compute_ms / 1e3),
        }

    rows = [row(0, 50, 90), row(1, 4, 10), row(2, 6, 12), row(3, 5, 11)]  # round 0 waits for the prefill
    cadence = sync_cadence(rows)
    assert cadence.transport == "ws" and not cadence.spin
    assert (cadence.draft_s, cadence.verify_s) == (pytest.approx(0.005), pytest.approx(0.011))
    with pytest.raises(ValueError, match="steady sync round"):
        sync_cadence(rows[:1])
