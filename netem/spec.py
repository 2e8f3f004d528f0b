"""What one edge<->verifier link should look like: `LinkSpec`, and its two `DirectionSpec`s.

Directions: "up" is edge -> verifier, "down" is verifier -> edge.

How a round trip is split: ``rtt_ms`` puts half of it on each direction (``delay_up_ms`` and
``delay_down_ms`` set the two directly instead). ``jitter_ms``, ``loss_pct``, ``rate_mbit`` and
``correlation_pct`` apply to EACH direction on its own, as a netem qdisc on each side would:

- jitter_ms is netem's jitter: the half-width of a uniform spread (stdev jitter/sqrt(3)) for
  ``distribution="uniform"`` (netem's default), the standard deviation for ``"normal"``, and the
  scale of netem's table for ``"pareto"`` and ``"paretonormal"`` (delay + jitter x an entry of
  iproute2's table, see `netem.distributions`: stdev 0.82 and 0.83 jitter, skewed right, median
  below the delay). The two directions draw independently, so the round-trip stdev is sqrt(2) x
  the one-way stdev.
- loss_pct is per direction, so a request/reply pair is lost with 1 - (1 - loss)^2.
- rate_mbit caps each direction (IP bytes in the userspace backend, L2 bytes in htb).
- correlation_pct correlates successive delays and successive losses (lag 1).

Delays are never negative: a draw below zero is clipped, so jitter_ms may not exceed the one-way
delay (a uniform draw is then never clipped; a normal one is, in its tail).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from dataclasses import dataclass

from netem import distributions

DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")  # netem's set
MAX_RATE_MBIT = 100_000.0


def _check_number(field: str, value, *, lo: float, hi: float = math.inf, hi_open: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number, got {value!r}")
    if not math.isfinite(value) or value < lo or value > hi or (hi_open and value == hi):
        if hi == math.inf:
            raise ValueError(f"{field} must be a finite number >= {lo}, got {value!r}")
        upper = f"< {hi}" if hi_open else f"<= {hi}"
        raise ValueError(f"{field} must be >= {lo} and {upper}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DirectionSpec:
    """One direction of a link: what one netem qdisc, or one NFQUEUE queue, applies."""

    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float | None = None
    correlation_pct: float = 0.0
    distribution: str = "uniform"

    def __post_init__(self):
        _check_number("delay_ms", self.delay_ms, lo=0.0)
        _check_number("jitter_ms", self.jitter_ms, lo=0.0)
        # 100 is a link that is down: a schedule's stall (a sweep point refuses it: orchestrator/links/keys.py)
        _check_number("loss_pct", self.loss_pct, lo=0.0, hi=100.0)
        _check_number("correlation_pct", self.correlation_pct, lo=0.0, hi=100.0, hi_open=True)
        if self.rate_mbit is not None:
            _check_number("rate_mbit", self.rate_mbit, lo=0.0, hi=MAX_RATE_MBIT)
            if self.rate_mbit == 0:
                raise ValueError("rate_mbit must be > 0 or None (no cap), got 0")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if self.jitter_ms > self.delay_ms:
            raise ValueError(
                f"jitter_ms must not exceed the one-way delay ({self.delay_ms} ms), got {self.jitter_ms!r}"
            )

    @property
    def delay_stdev_ms(self) -> float:
        if self.distribution == "uniform":
            return self.jitter_ms / math.sqrt(3.0)
        if self.distribution in distributions.TABLE_DISTRIBUTIONS:
            return self.jitter_ms * distributions.moments(self.distribution)[1]
        return self.jitter_ms

    @property
    def rate_bytes_s(self) -> float | None:
        return None if self.rate_mbit is None else self.rate_mbit * 1e6 / 8.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LinkSpec:
    """One edge<->verifier link. Give ``rtt_ms``, or both ``delay_up_ms`` and ``delay_down_ms``."""

    rtt_ms: float | None = None
    delay_up_ms: float | None = None
    delay_down_ms: float | None = None
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    rate_mbit: float | None = None
    correlation_pct: float = 0.0
    distribution: str = "uniform"

    def __post_init__(self):
        per_direction = (self.delay_up_ms, self.delay_down_ms)
        if self.rtt_ms is None and None in per_direction:
            raise ValueError(
                "give rtt_ms, or both delay_up_ms and delay_down_ms; got "
                f"rtt_ms={self.rtt_ms!r}, delay_up_ms={self.delay_up_ms!r}, delay_down_ms={self.delay_down_ms!r}"
            )
        if self.rtt_ms is not None and per_direction != (None, None):
            raise ValueError(
                f"give rtt_ms or delay_up_ms/delay_down_ms, not both; got rtt_ms={self.rtt_ms!r}, "
                f"delay_up_ms={self.delay_up_ms!r}, delay_down_ms={self.delay_down_ms!r}"
            )
        if self.rtt_ms is not None:
            _check_number("rtt_ms", self.rtt_ms, lo=0.0)
        # Building both directions runs every other check, with the field names the user wrote.
        _ = (self.up, self.down)

    @property
    def up(self) -> DirectionSpec:
        return self._direction("delay_up_ms", self.delay_up_ms)

    @property
    def down(self) -> DirectionSpec:
        return self._direction("delay_down_ms", self.delay_down_ms)

    def _direction(self, name: str, delay_ms: float | None) -> DirectionSpec:
        if self.rtt_ms is not None:
            name, delay_ms = "half of rtt_ms", self.rtt_ms / 2.0
        else:
            _check_number(name, delay_ms, lo=0.0)
        _check_number("jitter_ms", self.jitter_ms, lo=0.0)
        if self.jitter_ms > delay_ms:
            raise ValueError(
                f"jitter_ms must not exceed the one-way delay ({name} = {delay_ms} ms), got {self.jitter_ms!r}"
            )
        return DirectionSpec(
            delay_ms=float(delay_ms),
            jitter_ms=self.jitter_ms,
            loss_pct=self.loss_pct,
            rate_mbit=self.rate_mbit,
            correlation_pct=self.correlation_pct,
            distribution=self.distribution,
        )

    def expected_rtt_ms(self, probe_bytes: int = 0) -> float:
        """Base round trip plus the serialisation of a probe of `probe_bytes` IP bytes each way."""
        up, down = self.up, self.down
        rtt_ms = up.delay_ms + down.delay_ms
        for d in (up, down):
            if d.rate_bytes_s:
                rtt_ms += 1000.0 * probe_bytes / d.rate_bytes_s
        return rtt_ms

    def expected_rtt_p50_ms(self, probe_bytes: int = 0) -> float:
        """The median round trip: the base one for symmetric jitter; for netem's skewed tables the
        median of the sum of the two directions' draws (exact over the tables, see `_sum_median`)."""
        up, down = self.up, self.down
        shift = sum(d.jitter_ms * _table_offset(d.distribution) for d in (up, down) if d.jitter_ms)
        if (
            up.jitter_ms
            and down.jitter_ms
            and up.distribution in distributions.TABLE_DISTRIBUTIONS
            and down.distribution in distributions.TABLE_DISTRIBUTIONS
        ):
            shift = _sum_median(up.distribution, up.jitter_ms, down.distribution, down.jitter_ms)
        return self.expected_rtt_ms(probe_bytes) + shift

    @property
    def expected_rtt_stdev_ms(self) -> float:
        return math.hypot(self.up.delay_stdev_ms, self.down.delay_stdev_ms)

    @property
    def expected_rtt_loss_pct(self) -> float:
        keep = (1.0 - self.up.loss_pct / 100.0) * (1.0 - self.down.loss_pct / 100.0)
        return 100.0 * (1.0 - keep)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LinkSpec:
        """From a config mapping; a misspelt key is an error, never silently ignored."""
        check_known_keys(cls, data, "LinkSpec")
        return cls(**data)


def check_known_keys(cls, data: dict, where: str) -> None:
    """A mapping meant for dataclass `cls` names only its fields: a misspelt key is a ValueError
    naming it and `where` it was written, never silently ignored."""
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) in {where}: {unknown}; known: {known}")


def _table_offset(distribution: str) -> float:
    """The median of one direction's draw in units of jitter (0 for symmetric spreads)."""
    if distribution not in distributions.TABLE_DISTRIBUTIONS:
        return 0.0
    entries = distributions.table(distribution)
    return entries[len(entries) // 2] / distributions.TABLE_FACTOR


@functools.lru_cache(maxsize=64)
def _sum_median(dist_a: str, jitter_a: float, dist_b: str, jitter_b: float) -> float:
    """Median of jitter_a x A + jitter_b x B, A and B independent uniform picks from two tables:
    bisection on x of P(sum <= x) = mean over A's entries of P(B <= (x - a) / jitter_b)."""
    a = [jitter_a * t / distributions.TABLE_FACTOR for t in distributions.table(dist_a)]
    b = sorted(jitter_b * t / distributions.TABLE_FACTOR for t in distributions.table(dist_b))
    lo, hi = a[0] + b[0], max(a) + b[-1]
    for _ in range(40):
        mid = (lo + hi) / 2
        below = sum(bisect.bisect_right(b, mid - x) for x in a) / (len(a) * len(b))
        lo, hi = (lo, mid) if below >= 0.5 else (mid, hi)
    return hi
