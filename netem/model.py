"""The userspace link model: when does each packet of one direction leave, or is it lost.

Pure (the clock is an argument, randomness a seeded `random.Random`), so it is tested without
a kernel. The NFQUEUE daemon runs one `DirectionScheduler` per queue.

A packet that arrives at ``arrival_s``:
1. is lost with probability loss_pct (lag-1 correlated: a two-state Markov chain whose stationary
   loss rate is exactly loss_pct; netem's own correlated generator shifts the mean, we do not);
2. waits for the wire if rate_mbit is set (FIFO serialisation at the rate; tail drop when more
   than ``backlog_pkts`` full-size packets are waiting, like a default txqueuelen of 1000);
3. then propagates for delay_ms plus a jitter draw (uniform, normal, or an entry of netem's
   pareto/paretonormal table picked by a uniform, as netem picks one; lag-1 correlated through an
   AR(1) Gaussian mapped to the draw by its CDF, so the marginal distribution is the configured
   one whatever the correlation);
4. never leaves before the packet ahead of it: FIFO release, so jitter does not reorder
   (netem's does unless a rate is set).

`update(direction)` changes the settings from then on (a link schedule): packets already held
keep their release times (nothing is dropped or re-timed); the FIFO floor starts afresh, so after
a cut in delay new packets may overtake held ones, as the new delay implies, and are never held
back by the old delay: a path change (TCP may answer the reordering with a spurious timeout;
benchmarks/step_reorder.py). `update(direction, keep_order=True)` keeps the floor: a new packet
never leaves before one sent ahead of it, so after a cut the delay falls as the held packets
drain, as when a queue empties. The random state, a loss burst and the wire's backlog carry over.
"""

from __future__ import annotations

import math
import random

from netem import distributions
from netem.spec import DirectionSpec

MTU_BYTES = 1500
MIN_PACKET_BYTES = 64
DEFAULT_BACKLOG_PKTS = 1000
# Held-time headroom: a jitter draw rarely exceeds 3 stdev; 25% on top for bursts.
_JITTER_TAIL_STDEVS = 3.0
_HEADROOM = 1.25


def hold_time_s(direction: DirectionSpec) -> float:
    """How long a packet is held at most, backlog aside."""
    tail_ms = _JITTER_TAIL_STDEVS * direction.delay_stdev_ms
    if direction.distribution in distributions.TABLE_DISTRIBUTIONS:
        tail_ms = 4.0 * direction.jitter_ms  # the tables' clip: a long tail, reached by 1% of draws
    return (direction.delay_ms + tail_ms) / 1000.0


def queue_limit_pkts(direction: DirectionSpec, max_pps: int, backlog_pkts: int = DEFAULT_BACKLOG_PKTS) -> int:
    """Packets one direction may hold at once: packets/s x hold time, plus the wire's backlog.

    Every held packet counts against the kernel's queue (NFQUEUE ``maxlen``, netem ``limit``);
    when that is too small the kernel drops silently, so size it for the peak rate.
    """
    pps = float(max_pps)
    if direction.rate_bytes_s is not None:
        # A rate cap bounds the packets/s that can be in flight behind the wire.
        pps = min(pps, direction.rate_bytes_s / MIN_PACKET_BYTES)
    return backlog_pkts + math.ceil(pps * hold_time_s(direction) * _HEADROOM)


class DirectionScheduler:
    """Loss, serialisation, delay and FIFO order for one direction of one link."""

    def __init__(self, direction: DirectionSpec, seed: int, backlog_pkts: int = DEFAULT_BACKLOG_PKTS):
        self._rng = random.Random(seed)
        self._backlog_limit_bytes = backlog_pkts * MTU_BYTES
        self._set(direction)
        self._z = self._rng.gauss(0.0, 1.0)  # AR(1) state of the jitter draw
        self._last_lost = False
        self._wire_free_s = -math.inf
        self._last_release_s = -math.inf
        self.n_in = 0
        self.n_lost = 0
        self.n_overflow = 0
        self.n_updates = 0

    def _set(self, direction: DirectionSpec) -> None:
        self.direction = direction
        self._rho = direction.correlation_pct / 100.0
        self._p_loss = direction.loss_pct / 100.0
        self._rate_bytes_s = direction.rate_bytes_s

    def update(self, direction: DirectionSpec, keep_order: bool = False) -> None:
        """New settings for packets arriving from now on (see the module docstring)."""
        self._set(direction)
        if not keep_order:
            self._last_release_s = -math.inf
        self.n_updates += 1

    def on_arrival(self, arrival_s: float, size_bytes: int) -> float | None:
        """The time the packet leaves, or None when it is dropped (lost or backlog overflow)."""
        self.n_in += 1
        if self._lose():
            self.n_lost += 1
            return None
        sent_s = arrival_s
        if self._rate_bytes_s is not None:
            wire_start_s = max(arrival_s, self._wire_free_s)
            if (wire_start_s - arrival_s) * self._rate_bytes_s > self._backlog_limit_bytes:
                self.n_overflow += 1
                return None
            self._wire_free_s = wire_start_s + size_bytes / self._rate_bytes_s
            sent_s = self._wire_free_s
        release_s = max(sent_s + self._delay_s(), self._last_release_s)
        self._last_release_s = release_s
        return release_s

    def _lose(self) -> bool:
        if self._p_loss == 0.0:
            return False
        p, rho = self._p_loss, self._rho
        p_now = p + rho * (1.0 - p) if self._last_lost else p * (1.0 - rho)
        self._last_lost = self._rng.random() < p_now
        return self._last_lost

    def _delay_s(self) -> float:
        d = self.direction
        if d.jitter_ms == 0.0:
            return d.delay_ms / 1000.0
        rho = self._rho
        self._z = rho * self._z + math.sqrt(1.0 - rho * rho) * self._rng.gauss(0.0, 1.0)
        if d.distribution == "uniform":
            jitter_ms = d.jitter_ms * (2.0 * distributions.normal_cdf(self._z) - 1.0)
        elif d.distribution == "normal":
            jitter_ms = d.jitter_ms * self._z
        else:
            jitter_ms = d.jitter_ms * distributions.draw(d.distribution, distributions.normal_cdf(self._z))
        return max(0.0, d.delay_ms + jitter_ms) / 1000.0
