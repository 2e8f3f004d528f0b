"""Filling a speculation cache (dsd.cache.speculation_cache) while a block is verified: the cached mode's
drafting, for dsd.drive.driver.

After a block goes out, ``next_work`` hands the driver one device pass at a time: first one
draft step after the block (the draft's distribution over the bonus token; the block's own
positions' distributions were kept while it was drafted), which ranks the outcomes and starts a
branch per chosen outcome on a fork of the request's KV cache; then, per depth, one batched pass
over every branch, as many passes as the plan lets end before the expected verdict
(dsd.cache.speculation_cache.fill_plan). Between passes the driver delivers what has arrived, so a verdict
stops the fill: ``on_verdict`` records what the cache held and keeps the branch drafted on the
committed prefix, if any, for ``take``, which hands it (complete, or part-way with its generator
to go on) to the next block. Everything else is released. ``CacheMemory`` carries what the fills
learn (pass times, the ranking's calibration) from one request to the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from dsd.backends.protocol import ForksCaches, LanguageModel, SamplingParams, Verdict
from dsd.speculation.drafting import Block, ranking_row
from dsd.speculation.draws import Draws
from dsd.cache.speculation_cache import (
    Branch,
    CacheConfig,
    Calibration,
    SpeculationCache,
    batch_step_s,
    fill_plan,
    rank_outcomes,
)

_EMA = 0.3  # weight of the newest sample in the running wait and step-time estimates


@dataclass(frozen=True)
class CacheRecord:
    """What one round's verdict met in the cache (a rounds.csv row's cache_* columns)."""

    hit: bool  # a branch was drafted on the committed prefix
    depth: int  # its tokens drafted by the verdict (0 at a miss)
    rank: int  # the verdict's outcome among the ranked candidates (-1: not a candidate)
    branches: int  # branches drafted for this block
    fill_s: float  # device time spent on the fill by the verdict
    predicted_hit: float  # the estimated probability of a hit, summed over the branches
    filled: bool = False  # every branch was drafted as deep as planned by the verdict (fill_s is the whole fill)


class PassTimes:
    """What the draft's passes have taken on this device: branches -> seconds of one batched pass
    (1: a step alone), a running estimate."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def note(self, branches: int, elapsed_s: float) -> None:
        old = self.seconds.get(branches)
        self.seconds[branches] = elapsed_s if old is None else (1 - _EMA) * old + _EMA * elapsed_s

    def step_s(self, branches: int, slope: float) -> float:
        """One batched pass over ``branches`` (dsd.cache.speculation_cache.batch_step_s)."""
        return batch_step_s(self.seconds, branches, slope)


@dataclass
class CacheMemory:
    """What the fills of earlier requests learnt: kept by whoever runs requests one after another
    on one draft (an edge's run), so every request's first fill is planned on what was seen."""

    pass_times: PassTimes = field(default_factory=PassTimes)
    calibration: Calibration = field(default_factory=Calibration)


@dataclass
class _Sent:
    base: list[int]  # committed tokens the block was drafted on
    block: list[int]
    rows: list[torch.Tensor]  # the draft's distribution at each block position


class CacheFiller:
    def __init__(
        self,
        draft: LanguageModel,
        seq_id: str,
        sampling: SamplingParams,
        draws: Draws | None,
        config: CacheConfig,
        memory: CacheMemory | None = None,
    ) -> None:
        if not isinstance(draft, ForksCaches):
            raise ValueError(f"the cached mode needs a draft that can fork its KV cache; {draft.name!r} cannot")
        self.draft, self.seq_id, self.sampling, self.draws, self.config = draft, seq_id, sampling, draws, config
        self.sent: _Sent | None = None
        self.spec: SpeculationCache | None = None
        self.depth = 0  # passes the current fill plans (dsd.cache.speculation_cache.fill_plan)
        self.hit: Branch | None = None
        self.accepted, self.proposed = 0, 0
        self.wait_s: float | None = None  # send -> verdict, running estimate
        self.memory = memory if memory is not None else CacheMemory()

    @property
    def alpha(self) -> float:
        c = self.config
        return (self.accepted + c.alpha_prior * c.alpha_prior_tokens) / (self.proposed + c.alpha_prior_tokens)

    def block_sent(self, base: Sequence[int], block: Sequence[int], rows: Sequence[torch.Tensor]) -> None:
        """The block on ``base`` just went out; ``rows`` [gamma] are the draft's distributions it was
        drawn from (dsd.speculation.drafting.ranking_row)."""
        self.release()
        self.sent = _Sent(list(base), list(block), list(rows))

    @property
    def wants_work(self) -> bool:
        if self.sent is None:
            return False
        return self.spec is None or bool(self._live())

    def next_work(self) -> tuple[Callable[[], None], float, int]:
        """One device pass of the fill, its cost in draft steps (for an emulated device), and the
        branches it drafts (0: the step after the block, which starts them)."""
        if self.spec is None:
            return self._rank, 1.0, 0
        live = self._live()
        return (lambda: self._depth(live)), 1.0 + self.config.batch_slope * (len(live) - 1), len(live)

    def note_pass(self, branches: int, elapsed_s: float) -> None:
        """A fill pass over ``branches`` branches (0: the bonus step) took ``elapsed_s`` on the device."""
        if self.spec is not None:
            self.spec.fill_s += elapsed_s
        self.memory.pass_times.note(max(branches, 1), elapsed_s)

    def on_verdict(self, verdict: Verdict, committed: Sequence[int], wait_s: float) -> CacheRecord | None:
        """Apply a verdict of the block in flight: what the cache held (None if none was
        started), and the branch drafted on ``committed`` kept for ``take``."""
        self.accepted += verdict.accepted
        self.proposed += verdict.proposed
        self.wait_s = wait_s if self.wait_s is None else (1 - _EMA) * self.wait_s + _EMA * wait_s
        spec, sent, self.sent = self.spec, self.sent, None
        if spec is None:  # the verdict came before the fill began
            return None if sent is None else CacheRecord(False, 0, -1, 0, 0.0, 0.0)
        branch = spec.branch_for(committed)
        outcome = spec.outcome_of(committed)
        if outcome is not None:
            self.memory.calibration.note(spec.candidates, outcome)
        filled = all(len(b.block.drafted) >= min(len(spec.block), self.depth) for b in spec.branches)
        record = CacheRecord(
            branch is not None,
            len(branch.block.drafted) if branch else 0,
            spec.rank_of(outcome),
            len(spec.branches),
            spec.fill_s,
            spec.predicted_hit,
            filled,
        )
        self.hit = branch
        self._release_branches(keep=branch)
        self.spec = None
        return record

    def take(self, prefix: Sequence[int]) -> Branch | None:
        """The branch drafted on ``prefix``, its KV cache now the request's; None at a miss."""
        branch, self.hit = self.hit, None
        if branch is None or branch.block.prefix != list(prefix):
            if branch is not None:
                self.draft.release(branch.seq_id)
            return None
        self.draft.move(branch.seq_id, self.seq_id)
        return branch

    def release(self) -> None:
        """Drop every branch (the request ends, or a new block starts a new cache)."""
        if self.hit is not None:
            self.draft.release(self.hit.seq_id)
            self.hit = None
        self._release_branches(keep=None)
        self.spec, self.sent = None, None

    def _release_branches(self, keep: Branch | None) -> None:
        for branch in self.spec.branches if self.spec is not None else ():
            if branch is not keep:
                self.draft.release(branch.seq_id)

    def _rank(self) -> None:
        """The draft's step after the block, the ranking, and a fork per chosen outcome."""
        sent = self.sent
        if sent is None:
            raise RuntimeError("a speculation cache ranks outcomes only after a block was sent")
        tokens = sent.base + sent.block
        bonus_row = ranking_row(self.draft.logits(self.seq_id, tokens, 1), self.sampling)
        rows = torch.stack([*sent.rows, bonus_row])  # [gamma + 1, vocab]
        candidates = rank_outcomes(
            sent.block,
            rows,
            self.alpha,
            self.config.tokens_per_position,
            self.memory.calibration.coverage(len(sent.block)) if self.config.calibrate else None,
        )
        wait_s = None if self.wait_s is None else self.wait_s - self._step_s_of(1)
        n, self.depth = fill_plan(
            self.config, [c.probability for c in candidates], wait_s, len(sent.block), self._step_s_of
        )
        branches = []
        for i, candidate in enumerate(candidates[:n] if self.depth else []):  # no pass fits: no branch
            j, t = candidate.outcome.accepted, candidate.outcome.token
            prefix = sent.base + sent.block[:j] + [t]
            seq_id = f"{self.seq_id}#cache{i}"
            self.draft.fork(self.seq_id, seq_id, len(sent.base) + j)
            branches.append(Branch(candidate, i, seq_id, Block(prefix, self.sampling, self.draws, keep_rows=True)))
        self.spec = SpeculationCache(sent.base, sent.block, candidates, branches)

    def _depth(self, live: list[Branch]) -> None:
        """One batched draft pass: the next token of every live branch."""
        rows = self.draft.logits_batch([b.block.request(b.seq_id) for b in live])
        for branch, logits in zip(live, rows):  # logits [1, vocab]
            branch.block.take(logits)

    def _live(self) -> list[Branch]:
        """The branches short of the depth the fill plans."""
        sent, spec = self.sent, self.spec
        if sent is None or spec is None:
            raise RuntimeError("a speculation cache has branches only after a block was sent and ranked")
        depth = min(len(sent.block), self.depth)
        return [b for b in spec.branches if len(b.block.drafted) < depth]

    def _step_s_of(self, branches: int) -> float:
        return self.memory.pass_times.step_s(branches, self.config.batch_slope)
