"""The userspace link model (pure, fixed seeds): delay, jitter, loss, rate, FIFO, queue sizing."""

from __future__ import annotations

import math
import statistics

import pytest

from netem.model import DirectionScheduler, queue_limit_pkts
from netem.spec import DirectionSpec
from tests.checks import every


def run(direction: DirectionSpec, n: int, gap_s: float = 0.01, size_bytes: int = 100, seed: int = 1):
    """Feed n evenly spaced packets; (arrival, release or None) for each."""
    sched = DirectionScheduler(direction, seed=seed)
    return sched, [(i * gap_s, sched.on_arrival(i * gap_s, size_bytes)) for i in range(n)]


def delays_ms(results):
    return [(r - a) * 1000 for a, r in results if r is not None]


def test_constant_delay_is_exact():
    _, results = run(DirectionSpec(delay_ms=25), 100)
    assert every(d == pytest.approx(25) for d in delays_ms(results))


@pytest.mark.parametrize("distribution, stdev_ms", [("uniform", 4 / math.sqrt(3)), ("normal", 4.0)])
def test_jitter_has_configured_mean_and_stdev(distribution, stdev_ms):
    # Packets 100 ms apart: FIFO order never holds one back, so the draws show through.
    _, results = run(DirectionSpec(delay_ms=50, jitter_ms=4, distribution=distribution), 20_000, gap_s=0.1)
    d = delays_ms(results)
    assert statistics.fmean(d) == pytest.approx(50, abs=0.1)
    assert statistics.stdev(d) == pytest.approx(stdev_ms, rel=0.03)
    if distribution == "uniform":
        assert 46 <= min(d) and max(d) <= 54


def test_correlated_jitter_keeps_its_spread_and_correlates():
    _, results = run(DirectionSpec(delay_ms=50, jitter_ms=4, correlation_pct=75), 20_000, gap_s=0.1)
    d = delays_ms(results)
    assert statistics.stdev(d) == pytest.approx(4 / math.sqrt(3), rel=0.05)
    assert statistics.correlation(d[:-1], d[1:]) > 0.6


def test_release_is_fifo_even_when_jitter_exceeds_the_gap():
    _, results = run(DirectionSpec(delay_ms=20, jitter_ms=10), 5000, gap_s=0.001)
    releases = [r for _, r in results]
    assert releases == sorted(releases)


@pytest.mark.parametrize("correlation_pct", [0, 50])
def test_loss_rate_matches_configured_within_sampling_error(correlation_pct):
    sched, results = run(DirectionSpec(delay_ms=1, loss_pct=5, correlation_pct=correlation_pct), 40_000)
    lost = [r is None for _, r in results]
    rate = sum(lost) / len(lost)
    assert abs(rate - 0.05) < 4 * math.sqrt(0.05 * 0.95 / len(lost)) * (3 if correlation_pct else 1)
    assert sched.n_lost == sum(lost)
    if correlation_pct:
        after_loss = [b for a, b in zip(lost, lost[1:]) if a]
        assert sum(after_loss) / len(after_loss) == pytest.approx(0.05 + 0.5 * 0.95, abs=0.05)


def test_rate_serialises_a_burst_at_the_configured_rate():
    sched = DirectionScheduler(DirectionSpec(delay_ms=10, rate_mbit=8), seed=0)  # 1 MB/s
    releases = [sched.on_arrival(0.0, 1000) for _ in range(500)]
    # 1000 bytes take 1 ms on the wire: the k-th packet leaves after k ms plus the delay.
    assert releases[0] == pytest.approx(0.011)
    assert releases[-1] == pytest.approx(0.010 + 0.500)


def test_rate_backlog_overflow_is_tail_drop():
    sched = DirectionScheduler(DirectionSpec(delay_ms=0, rate_mbit=8), seed=0, backlog_pkts=10)
    results = [sched.on_arrival(0.0, 1500) for _ in range(30)]
    # 10 full-size packets may wait behind the one on the wire; the rest are dropped.
    assert None not in results[:11]
    assert results[11:] == [None] * 19 and sched.n_overflow == 19


def test_queue_limit_covers_packets_per_second_times_hold_time():
    # 20 kpps held 100 ms (+3 stdev of jitter) with 25% headroom, plus the backlog.
    assert queue_limit_pkts(DirectionSpec(delay_ms=100), 20_000, backlog_pkts=1000) == 1000 + 2500
    capped = queue_limit_pkts(DirectionSpec(delay_ms=100, rate_mbit=1), 20_000, backlog_pkts=1000)
    assert capped == 1000 + math.ceil(125_000 / 64 * 0.1 * 1.25)


def test_update_changes_delay_for_new_packets_and_keeps_held_ones_as_they_were():
    """A schedule step: held packets keep their release times; after a cut new packets may pass
    them (as the new delay implies), after a rise they wait the new delay; nothing is dropped."""
    sched = DirectionScheduler(DirectionSpec(delay_ms=50), seed=1)
    held = [sched.on_arrival(i * 0.001, 100) for i in range(10)]  # released at 50..59 ms
    sched.update(DirectionSpec(delay_ms=10))
    after = [sched.on_arrival(0.010 + i * 0.001, 100) for i in range(10)]
    assert held == pytest.approx([0.050 + i * 0.001 for i in range(10)])
    assert after == pytest.approx([0.020 + i * 0.001 for i in range(10)])
    sched.update(DirectionSpec(delay_ms=80))
    assert sched.on_arrival(0.030, 100) == pytest.approx(0.110)
    assert sched.n_updates == 2 and sched.n_lost == 0


def test_update_keeping_order_lets_the_delay_fall_as_the_held_packets_drain():
    """schedule_order = "queue": after a cut no new packet leaves before one held ahead of it;
    once those are out, the new delay holds."""
    sched = DirectionScheduler(DirectionSpec(delay_ms=50), seed=1)
    held = [sched.on_arrival(i * 0.001, 100) for i in range(10)]  # released at 50..59 ms
    sched.update(DirectionSpec(delay_ms=10), keep_order=True)
    after = [sched.on_arrival(0.010 + i * 0.001, 100) for i in range(10)]
    assert held == pytest.approx([0.050 + i * 0.001 for i in range(10)])
    assert after == pytest.approx([0.059] * 10)  # behind the last held one
    assert sched.on_arrival(0.060, 100) == pytest.approx(0.070)  # drained: the new delay


def test_update_keeps_the_configured_loss_rate_across_changes():
    sched = DirectionScheduler(DirectionSpec(delay_ms=1, loss_pct=5), seed=2)
    lost = 0
    for i in range(40_000):
        if i % 1000 == 0:
            sched.update(DirectionSpec(delay_ms=1 + (i // 1000) % 3, loss_pct=5))
        lost += sched.on_arrival(i * 0.001, 100) is None
    assert abs(lost / 40_000 - 0.05) < 4 * math.sqrt(0.05 * 0.95 / 40_000)
