"""netem's pareto and paretonormal delays in the userspace shaper (pure, fixed seeds): our tables
are iproute2's, and the shaper's draws have the distribution netem's own draw gives."""

from __future__ import annotations

import bisect
import os
import random
import statistics

import pytest

from netem import distributions
from netem.model import DirectionScheduler
from netem.spec import DirectionSpec, LinkSpec

TC_LIB = "/usr/lib/x86_64-linux-gnu/tc"


@pytest.mark.parametrize("name", distributions.TABLE_DISTRIBUTIONS)
def test_tables_are_iproute2s_tables_entry_for_entry(name):
    path = os.path.join(TC_LIB, f"{name}.dist")
    if not os.path.exists(path):
        pytest.skip(f"iproute2's {path} is not installed here")
    assert list(distributions.table(name)) == distributions.read_iproute2_table(path)


def netem_draws(name: str, n: int, seed: int) -> list[float]:
    """What sch_netem's tabledist() gives, in units of jitter: table[rnd % size], rnd 32 bits."""
    rng, entries = random.Random(seed), distributions.table(name)
    return [entries[rng.getrandbits(32) % len(entries)] / distributions.TABLE_FACTOR for _ in range(n)]


def shaper_draws(name: str, n: int, correlation_pct: float = 0.0, seed: int = 3) -> list[float]:
    """The userspace shaper's one-way delays for delay 100 ms, jitter 10 ms, in units of jitter.
    Packets 1 s apart, so FIFO release never holds one back."""
    sched = DirectionScheduler(
        DirectionSpec(delay_ms=100, jitter_ms=10, distribution=name, correlation_pct=correlation_pct), seed=seed
    )
    return [((sched.on_arrival(i * 1.0, 100) - i * 1.0) * 1000 - 100) / 10 for i in range(n)]


def ks_distance(a: list[float], b: list[float]) -> float:
    a, b = sorted(a), sorted(b)
    points = sorted(set(a) | set(b))
    return max(abs(bisect.bisect_right(a, x) / len(a) - bisect.bisect_right(b, x) / len(b)) for x in points)


@pytest.mark.parametrize("name", distributions.TABLE_DISTRIBUTIONS)
@pytest.mark.parametrize("correlation_pct", [0, 60])
def test_shaper_draws_have_netems_distribution(name, correlation_pct):
    ours, netem = shaper_draws(name, 20_000, correlation_pct), netem_draws(name, 20_000, seed=11)
    # Two-sample KS at n = m = 20000: the 0.1% critical distance is 1.95 * sqrt(2/20000) = 0.0195.
    # Correlated draws have fewer effective samples: a wider margin.
    assert ks_distance(ours, netem) < (0.0195 if correlation_pct == 0 else 0.04)
    mean, stdev = distributions.moments(name)
    assert statistics.fmean(ours) == pytest.approx(mean, abs=0.03 if correlation_pct == 0 else 0.06)
    assert statistics.stdev(ours) == pytest.approx(stdev, rel=0.04 if correlation_pct == 0 else 0.08)
    assert min(ours) >= distributions.table(name)[0] / distributions.TABLE_FACTOR - 1e-9
    assert max(ours) <= 4.0 + 1e-9


def test_correlated_pareto_draws_correlate():
    ours = shaper_draws("pareto", 20_000, correlation_pct=75)
    assert statistics.correlation(ours[:-1], ours[1:]) > 0.5


def test_pareto_is_skewed_the_way_netems_table_is():
    """Median below the delay, a long right tail: a link's median RTT is not its base RTT."""
    ours = shaper_draws("pareto", 20_000)
    assert statistics.median(ours) == pytest.approx(-0.32, abs=0.03)
    assert sum(x > 2 for x in ours) / len(ours) == pytest.approx(0.045, abs=0.01)
    spec = LinkSpec(rtt_ms=40, jitter_ms=10, distribution="pareto")
    assert spec.up.delay_stdev_ms == pytest.approx(8.197, abs=0.01)
    sums = [10 * (a + b) for a, b in zip(ours[::2], ours[1::2])]
    assert spec.expected_rtt_p50_ms() - 40 == pytest.approx(statistics.median(sums), abs=0.25)
