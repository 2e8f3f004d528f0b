"""netem's delay distribution tables, generated the way iproute2 generates them (pure Python).

netem draws a jittered delay as ``delay + jitter * t / 8192`` where ``t`` is an entry of a
distribution table picked uniformly at random (``rnd % size``); iproute2 ships the tables as
``/usr/lib/.../tc/{normal,pareto,paretonormal}.dist``, made by its ``netem/*.c`` generators:

- pareto (netem/pareto.c): Pareto with shape a = 3 and scale 1, shifted by its mean 1.5 and
  scaled by 4/3: ``t = (u^(-1/3) - 1.5) * 4/3 * 8192`` for u = i/65536, i = 65536, 65520, ..., 16,
  clipped at 32767 (t/8192 < 4). 4096 entries; mean -0.033 (the clip) and stdev 0.82 jitter
  (not 1: the shifted Pareto's stdev is 1.15 and infinite-tailed in its fourth moment; the clip and
  the coarse grid of u cut the tail); its median is -0.32 jitter: most draws are early.
- paretonormal (netem/paretonormal.c): entry i (0, 4, 8, ... < 16384) is
  ``(normal_quantile(i/16384) * 8192 + 3 * pareto(i)) / 4``: a quarter normal, three quarters
  Pareto, drawn from the same uniform (comonotonic), clipped to a signed 16-bit value.

The userspace shaper draws the same way: a uniform (lag-1 correlated through an AR(1) Gaussian,
see `netem.model`) picks an entry. "normal" stays a continuous Gaussian (netem's normal table is
one, discretised and clipped at 4 stdev) and "uniform" netem's table-free uniform draw.
`tests/netem/test_netem_distributions.py` checks these tables against iproute2's files.
"""

from __future__ import annotations

import functools
import math

TABLE_FACTOR = 8192  # NETEM_DIST_SCALE
_PARETO_A = 3.0
_TABLESIZE = 16384
_SHRT_MIN, _SHRT_MAX = -32768, 32767
TABLE_DISTRIBUTIONS = ("pareto", "paretonormal")


def _pareto_value(i65536: int) -> int:
    """pareto.c / paretovalue(): the entry for u = i65536 / 65536."""
    value = 1.0 / math.pow(i65536 / 65536.0, 1.0 / _PARETO_A)
    value = (value - 1.5) * (4.0 / 3.0) * TABLE_FACTOR
    return int(_rint(min(value, 32767.0)))


def _rint(x: float) -> float:
    """C's rint (round half to even), which Python's round() is."""
    return float(round(x))


def normal_cdf(x: float) -> float:
    """The standard normal distribution function."""
    return 0.5 + 0.5 * math.erf(x / math.sqrt(2.0))


@functools.cache
def table(distribution: str) -> tuple[int, ...]:
    """The 4096 signed entries of netem's table for `distribution` (units of 1/8192 jitter)."""
    if distribution == "pareto":
        return tuple(_pareto_value(i) for i in range(65536, 0, -16))
    if distribution == "paretonormal":
        out = []
        for i in range(0, _TABLESIZE, 4):
            normal = int(_rint(_normal_grid_quantile(i) * TABLE_FACTOR))
            value = int((normal + 3 * _pareto_value(65536 - 4 * i)) / 4)  # C integer division
            out.append(min(max(value, _SHRT_MIN), _SHRT_MAX))
        return tuple(out)
    raise ValueError(f"distribution must be one of {TABLE_DISTRIBUTIONS}, got {distribution!r}")


def _normal_grid_quantile(i: int) -> float:
    """paretonormal.c fills table[rint(16384 * Phi(x))] = x for x = -10, -10 + 5e-5, ... < 10.05,
    so entry i holds the largest grid x that rounds to i. Found by bisection on the grid."""
    step, n_grid = 0.00005, 402_000
    lo, hi = 0, n_grid  # largest k with index(k) <= i
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _rint(_TABLESIZE * normal_cdf(-10.0 + mid * step)) <= i:
            lo = mid
        else:
            hi = mid - 1
    return -10.0 + lo * step


@functools.cache
def moments(distribution: str) -> tuple[float, float]:
    """(mean, stdev) of a table draw, in units of jitter."""
    values = [t / TABLE_FACTOR for t in table(distribution)]
    mean = math.fsum(values) / len(values)
    var = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(var)


def draw(distribution: str, u: float) -> float:
    """The table entry a uniform u in [0, 1) picks, in units of jitter."""
    entries = table(distribution)
    return entries[min(int(u * len(entries)), len(entries) - 1)] / TABLE_FACTOR


def read_iproute2_table(path: str) -> list[int]:
    """The entries of an iproute2 ``.dist`` file (comment lines start with #)."""
    with open(path) as f:
        return [int(x) for line in f if not line.lstrip().startswith("#") for x in line.split()]
