"""Stratified acceptance for the synthetic draft: each request realises the alpha it was given.

With i.i.d. acceptance (the synthetic backend's default) a request's measured alpha is a sample
proportion: at alpha 0.9 and 320 tokens its standard error is ~0.018, and near alpha 0.9 the
sync-vs-AR crossover moves ~7 ms per 0.01 of alpha, so a run answers a different question than
the one configured. ``acceptance = "stratified"`` lays out each request's rounds in advance.

What is measured (``orchestrator.analysis.fits.fit_alpha``, ``dsd.drive.generation.Generation.alpha_measured``):
alpha_measured = S / (S + F) over the live rounds, S the accepted drafts and F the rounds that rejected
one. A round that accepts k of gamma moves S*(1 - alpha) - alpha*F by

    d(k) = k*(1 - alpha) - alpha*[k < gamma]         (E[d] = 0 under the truncated geometric)

so alpha_measured - alpha = D / (S + F), D the running sum of d. The schedule keeps |D| <= B =
(alpha + gamma*(1 - alpha)) / 2 after every round, while each round's accepted count is drawn from
the truncated geometric pmf of i.i.d. acceptance:

- "long" counts (d > 0) and "short" ones (d <= 0) are drawn from the pmf restricted to each;
- a long round is drawn in advance and played once D <= (alpha - d_long) / 2; until then short
  rounds are played.

Since D stays bounded, long rounds come at the long-run rate p(long) (E[d] = 0 means
p(long)*E[d | long] = -p(short)*E[d | short]), so the distribution of accepted counts per round is
the truncated geometric; what changes is the order (a long round is followed by short ones sooner
than by chance), which the closed forms do not use: they take one round's expectation.

Where the running total starts matters: its long-run mean depends on the start (the values d
takes lie on a lattice, and the thresholds cut it differently), and a request's sum of d ends, on
average, at that mean minus the start. Started at 0 that is 0.05-0.25 for gamma 5: a bias of
mu / (S + F) in alpha_measured and about one long round too many per request, which a chi-square over
a few hundred requests sees. So each request starts at c_lo or c_hi (``drift_start``), two points
either side of the start whose long-run mean equals it, mixed so the expected sum of d is 0.
Guarantee, every request: |alpha_measured - alpha| <= (B + max|c|) / (S + F); see
``tested_positions_needed``.
The bonus position after a round that accepted all gamma (the pipelined edge's guess) keeps its
i.i.d. coin: the speculation then survives with probability alpha^(gamma+1), as in the model.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Iterator

ACCEPTANCE_KINDS = ("iid", "stratified")


def truncated_geometric_pmf(alpha: float, gamma: int) -> list[float]:
    """P(accepted = k), k = 0..gamma, under i.i.d. acceptance with probability alpha."""
    return [(1.0 - alpha) * alpha**k for k in range(gamma)] + [alpha**gamma]


def alpha_drift(k: int, alpha: float, gamma: int) -> float:
    """d(k): how a round accepting k of gamma moves S*(1 - alpha) - alpha*F."""
    return k * (1.0 - alpha) - (alpha if k < gamma else 0.0)


def drift_band(alpha: float, gamma: int) -> float:
    """B: the schedule's running total stays in [-B, B]."""
    return (alpha + gamma * (1.0 - alpha)) / 2


@functools.lru_cache(maxsize=256)
def drift_start(alpha: float, gamma: int) -> tuple[float, float, float]:
    """(c_lo, c_hi, w): start at c_lo with probability w, else at c_hi, so that the long-run
    mean minus the start averages 0. Bisection on the start over [-B, B] (fixed seed, so every
    process agrees); about 0.2 s once per (alpha, gamma)."""
    band = drift_band(alpha, gamma)
    lo, hi = -band, band
    f_lo, f_hi = _mean_minus_start(alpha, gamma, lo), _mean_minus_start(alpha, gamma, hi)
    if not f_lo > 0 >= f_hi:  # alpha 0 or 1 (one count), or no crossing
        return 0.0, 0.0, 1.0
    for _ in range(12):
        mid = (lo + hi) / 2
        f_mid = _mean_minus_start(alpha, gamma, mid)
        lo, hi, f_lo, f_hi = (mid, hi, f_mid, f_hi) if f_mid > 0 else (lo, mid, f_lo, f_mid)
    return lo, hi, -f_hi / (f_lo - f_hi)


def _mean_minus_start(alpha: float, gamma: int, start: float, rounds: int = 8000) -> float:
    counts = stratified_accepted_counts(alpha, gamma, random.Random(0x5EED), start=start)
    total, summed = start, 0.0
    for _ in range(rounds):
        total += alpha_drift(next(counts), alpha, gamma)
        summed += total
    return summed / rounds - start


def drift_bound(alpha: float, gamma: int) -> float:
    """|sum of d over a request's rounds| <= B + max(|c_lo|, |c_hi|), after every round."""
    c_lo, c_hi, _ = drift_start(alpha, gamma)
    return drift_band(alpha, gamma) + max(abs(c_lo), abs(c_hi))


def tested_positions_needed(alpha: float, gamma: int, tolerance: float = 0.005) -> int:
    """Tested positions (S + F) a request needs for |alpha_measured - alpha| <= tolerance."""
    return math.ceil(drift_bound(alpha, gamma) / tolerance)


def tokens_needed(alpha: float, gamma: int, tolerance: float = 0.005) -> int:
    """max_new_tokens that gives ``tested_positions_needed``: a round tests (1 - alpha^gamma) /
    (1 - alpha) positions and emits E(alpha, gamma) tokens on average; one round's slack for the
    request's last round, whose tokens are clipped."""
    if alpha >= 1.0:
        return 1
    tested_per_token = (1.0 - alpha**gamma) / (1.0 - alpha ** (gamma + 1))
    return math.ceil(tested_positions_needed(alpha, gamma, tolerance) / tested_per_token) + gamma + 1


def stratified_accepted_counts(
    alpha: float, gamma: int, rng: random.Random, start: float | None = None
) -> Iterator[int]:
    """Accepted counts of successive rounds (endless), as described in the module docstring;
    the running total starts at ``start`` (default: ``drift_start``'s, drawn with ``rng``)."""
    pmf = truncated_geometric_pmf(alpha, gamma)
    drift = [alpha_drift(k, alpha, gamma) for k in range(gamma + 1)]
    long = [k for k in range(gamma + 1) if pmf[k] > 0 and drift[k] > 0]
    short = [k for k in range(gamma + 1) if pmf[k] > 0 and drift[k] <= 0]
    if not long or not short:  # alpha 0 or 1: one count only
        only = (long or short)[0]
        while True:
            yield only
    if start is None:
        c_lo, c_hi, w = drift_start(alpha, gamma)
        start = c_lo if rng.random() < w else c_hi
    total = start
    pending = None
    while True:
        if pending is None:
            pending = _draw(long, pmf, rng)
        if total <= (alpha - drift[pending]) / 2:
            k, pending = pending, None
        else:
            k = _draw(short, pmf, rng)
        total += drift[k]
        yield k


def _draw(counts: list[int], pmf: list[float], rng: random.Random) -> int:
    u = rng.random() * sum(pmf[k] for k in counts)
    for k in counts:
        u -= pmf[k]
        if u < 0:
            return k
    return counts[-1]


class RoundLayout:
    """One request's rounds: round i starts at ``starts[i]`` (the first at the prompt's end) and
    accepts ``accepted[i]``, so round i+1 starts at starts[i] + accepted[i] + 1."""

    def __init__(self, alpha: float, gamma: int, first_position: int, seed: int) -> None:
        self.gamma = gamma
        self._counts = stratified_accepted_counts(alpha, gamma, random.Random(seed))
        self.starts = [first_position]
        self.accepted: list[int] = []

    def outcome(self, position: int) -> str:
        """The draft at ``position`` is "right", "wrong" (the round's rejection), "bonus" (after
        a round that accepted all: no draft is tested there) or "prompt"."""
        while self.starts[-1] <= position:
            k = next(self._counts)
            self.accepted.append(k)
            self.starts.append(self.starts[-1] + k + 1)
        i = bisect.bisect_right(self.starts, position) - 1
        if i < 0:
            return "prompt"
        offset, k = position - self.starts[i], self.accepted[i]
        if offset < k:
            return "right"
        return "bonus" if k == self.gamma else "wrong"
