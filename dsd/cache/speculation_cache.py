"""The speculation cache of cached pipelined DSD: next blocks drafted for the likely verdicts.

While a block of gamma draft tokens x_0..x_{gamma-1} is being verified, the edge would sit idle
for a round trip and a verification pass. A verdict is an *outcome*: how many tokens the target
accepted, j in 0..gamma, and the token it sends back, t (the corrected token at j < gamma, the
bonus at j = gamma). The next block starts after committed + x_0..x_{j-1} + t, so the edge can
draft it before the verdict for each likely outcome, and send it the moment its outcome arrives
(Kumar, Dao and May's speculative speculative decoding, ICLR 2026, on one machine; here across
the network, where the wait is longer).

The outcomes are ranked by an estimate of their probability from the draft's own distributions
(``rank_outcomes``): P(j) from a running acceptance rate (i.i.d. per position, as the closed form
has it), and P(t | j) from the draft's distribution at position j with the rejected token x_j
removed and renormalised (the correction comes from where the target puts more mass than the
draft: mostly the draft's other likely tokens), at j = gamma its distribution after the block.
The best ranked outcomes get branches, drafted together, one batched pass per depth
(``dsd.drive.driver``); a branch draws from the keyed draws of its own start position (dsd.speculation.draws), so
the block it drafts is the block synchronous DSD would draft there, hit or miss.

``SpeculationCache`` holds one block's branches; ``take`` answers the prefix the edge drafts on
next with the branch drafted on it (complete or part-way), or None (a miss).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsd.checks import is_int

if TYPE_CHECKING:  # the annotations only: a [cache] table is read without torch
    import torch

    from dsd.speculation.drafting import Block

AUTO = "auto"


@dataclass(frozen=True)
class CacheConfig:
    fanout: int | str = AUTO  # branches per wait; "auto": as many as the wait allows
    tokens_per_position: int = 4  # candidate tokens the verifier may send back, per accepted length
    max_branches: int = 16
    # emulated devices only: a batched draft pass over B branches costs (1 + slope (B - 1)) steps
    batch_slope: float = 0.05
    alpha_prior: float = 0.5  # the acceptance estimate before a request's first verdict ...
    alpha_prior_tokens: int = 8  # ... weighted as this many draft tokens
    calibrate: bool = True  # scale P(t | j) by how often the draft caught the verdict's token at j

    def __post_init__(self) -> None:
        if self.fanout != AUTO and not (is_int(self.fanout) and self.fanout >= 1):
            raise ValueError(f"fanout must be {AUTO!r} or a whole number >= 1, got {self.fanout!r}")
        for name in ("tokens_per_position", "max_branches", "alpha_prior_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if not isinstance(self.calibrate, bool):
            raise ValueError(f"calibrate must be true or false, got {self.calibrate!r}")
        if not self.batch_slope >= 0:
            raise ValueError(f"batch_slope must be >= 0, got {self.batch_slope!r}")
        if not 0.0 < self.alpha_prior < 1.0:
            raise ValueError(f"alpha_prior must be in (0, 1), got {self.alpha_prior!r}")


@dataclass(frozen=True)
class Outcome:
    accepted: int  # j: draft tokens the target accepted
    token: int  # t: the corrected (j < gamma) or bonus (j = gamma) token


@dataclass(frozen=True)
class Candidate:
    outcome: Outcome
    probability: float  # estimated before the verdict
    token_probability: float  # its share of P(t | j) in the draft's distribution, uncalibrated


def accepted_length_probability(j: int, gamma: int, alpha: float) -> float:
    """P(j of gamma accepted) with i.i.d. acceptance alpha: alpha^j (1 - alpha), alpha^gamma at j = gamma."""
    return alpha**j * (1.0 - alpha) if j < gamma else alpha**gamma


def top_tokens(row: torch.Tensor, k: int, exclude: int | None = None) -> list[tuple[int, float]]:
    """The k most probable tokens of a distribution row [vocab] and their probabilities, without
    ``exclude`` and renormalised over the rest (zero-probability tokens left out)."""
    import torch

    row = row.float()
    scale = 1.0
    if exclude is not None:
        scale = 1.0 - float(row[exclude])
        row = row.clone()
        row[exclude] = 0.0
    values, ids = torch.topk(row, min(k, row.shape[-1]))
    if scale <= 0.0:
        return []
    return [(int(i), float(v) / scale) for i, v in zip(ids, values) if v > 0]


def rank_outcomes(
    block: Sequence[int], rows: torch.Tensor, alpha: float, k: int, coverage: Sequence[float] | None = None
) -> list[Candidate]:
    """Every outcome the edge can draft for, most probable first. block: the gamma draft tokens;
    rows [gamma + 1, vocab]: the draft's distribution at each block position and after the block;
    ``coverage`` [gamma + 1]: per accepted length, how much of P(t | j) the draft's distribution
    really catches (``Calibration``; 1 each by default)."""
    gamma = len(block)
    if rows.shape[0] != gamma + 1:
        raise ValueError(f"rows must hold gamma + 1 = {gamma + 1} distributions, got {rows.shape[0]}")
    out = []
    for j in range(gamma + 1):
        p_j = accepted_length_probability(j, gamma, alpha) * (coverage[j] if coverage is not None else 1.0)
        for token, p in top_tokens(rows[j], k, exclude=block[j] if j < gamma else None):
            out.append(Candidate(Outcome(j, token), p_j * p, p))
    return sorted(out, key=lambda c: (-c.probability, c.outcome.accepted, c.outcome.token))


class Calibration:
    """How well the draft's own distribution predicts the token a verdict sends back, per
    accepted length j: the verdicts whose outcome was among the candidates at their j, over the
    probability the candidates claimed (a correction comes from where the target exceeds the
    draft, so at j < gamma the draft over-credits its likely tokens; the bonus it predicts
    better). Starts at 1 (``prior`` verdicts' worth), and scales P(t | j) in ``rank_outcomes``."""

    def __init__(self, prior: float = 4.0) -> None:
        self.prior = prior
        self.caught: dict[int, float] = {}
        self.claimed: dict[int, float] = {}

    def note(self, candidates: Sequence[Candidate], outcome: Outcome) -> None:
        j = outcome.accepted
        claimed = sum(c.token_probability for c in candidates if c.outcome.accepted == j)
        self.claimed[j] = self.claimed.get(j, 0.0) + claimed
        self.caught[j] = self.caught.get(j, 0.0) + any(c.outcome == outcome for c in candidates)

    def coverage(self, gamma: int) -> list[float]:
        return [
            (self.caught.get(j, 0.0) + self.prior) / (self.claimed.get(j, 0.0) + self.prior) for j in range(gamma + 1)
        ]


def fill_plan(
    config: CacheConfig,
    probabilities: Sequence[float],
    wait_s: float | None,
    gamma: int,
    step_s_of_batch: Callable[[int], float],
) -> tuple[int, int]:
    """(branches, depth) of a fill, the ranked candidates' estimated ``probabilities`` given. The
    depth is the batched passes that end before the expected verdict, ``wait_s`` (a pass cannot
    be cut short, so one that the verdict would interrupt delays the next block by what is left of
    it): at most gamma, and 0 where not one pass fits. The branches: the configured fan-out, or
    under "auto" the count that saves the most drafting in expectation, the hit mass of the first
    b candidates times the depth b branches reach (a verdict uses a branch as far as it got), the
    smaller count on a tie. Before the first wait is known: all it may, gamma deep. Never more
    branches than the candidates or max_branches."""
    limit = min(config.max_branches, len(probabilities))

    def depth(b: int) -> int:
        if wait_s is None:
            return gamma
        step_s = step_s_of_batch(b)
        return gamma if step_s <= 0 else min(gamma, int(max(wait_s, 0.0) / step_s + 1e-9))

    if config.fanout != AUTO or wait_s is None:
        n = min(config.fanout, limit) if isinstance(config.fanout, int) else limit
        return n, depth(n)
    best, best_value, mass = (1, depth(1)), -1.0, 0.0
    for b in range(1, limit + 1):
        mass += probabilities[b - 1]
        d = depth(b)
        if mass * d > best_value + 1e-12:
            best, best_value = (b, d), mass * d
    return best


def batch_step_s(measured_s: dict[int, float], branches: int, slope: float) -> float:
    """A batched draft pass over ``branches`` branches, from the passes measured so far
    (branches -> seconds; 1: a step alone): as measured; between two measured sizes, linear; above
    the largest, on the line through the single step and the largest (the single step scaled by
    1 + slope (branches - 1) while only it is known); 0.0 while nothing is."""
    if branches in measured_s:
        return measured_s[branches]
    sizes = sorted(measured_s)
    below = [b for b in sizes if b < branches]
    above = [b for b in sizes if b > branches]
    if below and above:
        lo, hi = below[-1], above[0]
        return measured_s[lo] + (measured_s[hi] - measured_s[lo]) * (branches - lo) / (hi - lo)
    if not sizes:
        return 0.0
    if not below:  # smaller than any measured: no cheaper than the smallest
        return measured_s[sizes[0]]
    top, one = sizes[-1], measured_s.get(1)
    if one is None or top == 1:
        base = measured_s[top]
        return base * (1.0 + slope * (branches - top))
    return measured_s[top] + (measured_s[top] - one) / (top - 1) * (branches - top)


@dataclass
class Branch:
    """The next block drafted for one outcome: on its prefix (committed + x_0..x_{j-1} + t), in
    its own KV cache ``seq_id``, from the draws of its start position (its ``block``)."""

    candidate: Candidate
    rank: int
    seq_id: str
    block: Block

    @property
    def prefix(self) -> list[int]:
        return self.block.prefix


@dataclass
class SpeculationCache:
    """One block's branches, drafted while it is verified."""

    base: list[int]  # the prefix the block was drafted on (committed tokens)
    block: list[int]
    candidates: list[Candidate]  # every outcome ranked, most probable first
    branches: list[Branch]
    fill_s: float = 0.0  # device time spent drafting the branches (and the bonus step)

    @property
    def predicted_hit(self) -> float:
        """The estimated probability that the verdict is one of the branches' outcomes."""
        return sum(b.candidate.probability for b in self.branches)

    def outcome_of(self, prefix: Sequence[int]) -> Outcome | None:
        """The outcome that committed ``prefix`` (the base, j block tokens, one more); None if it
        does not extend the base that way (an end of the request, a hand-over)."""
        n = len(self.base)
        j = len(prefix) - n - 1
        if not 0 <= j <= len(self.block) or list(prefix[:n]) != self.base or list(prefix[n : n + j]) != self.block[:j]:
            return None
        return Outcome(j, int(prefix[-1]))

    def rank_of(self, outcome: Outcome | None) -> int:
        """Where the outcome stood among all candidates (-1: not a candidate)."""
        return next((i for i, c in enumerate(self.candidates) if c.outcome == outcome), -1)

    def branch_for(self, prefix: Sequence[int]) -> Branch | None:
        prefix = list(prefix)
        return next((b for b in self.branches if b.block.prefix == prefix), None)
