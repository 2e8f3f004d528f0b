"""Drafting: the draft model proposes tokens autoregressively on a given prefix.

A ``DraftJob`` is one session's draft block; several sessions' blocks on one model run together
with ``run_draft_jobs``: one batched pass of the draft (``logits_batch``) per draft step, each
session on its own KV cache, so a co-located server that drafts for many sessions at once pays
one pass per step, not one per session and step. Each session draws its tokens from its own
logits with its own draws in the same order as alone, so batched drafting is the unbatched
one: greedy token for token, sampled the same draws from the same q (to float rounding). A
block's draws are keyed by where it starts (dsd.speculation.draws).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsd.backends.protocol import LanguageModel, LogitsRequest, SamplingParams
from dsd.speculation.draws import DRAFT, Draws
from dsd.speculation.verification import sample_index, sampling_probs


def begin_request(model: LanguageModel, seq_id: str, prompt: Sequence[int], gamma: int) -> None:
    """Tell the draft a request's prompt and gamma before its first draft. Only the synthetic
    draft with stratified acceptance uses them (it lays out the request's rounds); other models
    have no ``begin_request`` and need nothing."""
    begin = getattr(model, "begin_request", None)
    if begin is not None:
        begin(seq_id, prompt, gamma)


def pick_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[int, torch.Tensor | None]:
    """The draft token from one position's logits [1, vocab], and its q ([vocab] or None)."""
    if sampling.greedy:
        return int(logits[0].argmax()), None
    q = sampling_probs(logits, sampling)[0]  # [vocab]
    return sample_index(q, generator), q


def ranking_row(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The draft's distribution at one position [vocab], as a speculation cache ranks what the
    verifier may send back (dsd.cache.speculation_cache): softmax(logits / temperature), greedy as temperature
    1, with no nucleus cut: a correction comes from where the target puts more mass than the
    draft, which is often outside the draft's own nucleus."""
    temperature = 1.0 if sampling.greedy else sampling.temperature
    return torch.softmax(logits[0].float() / temperature, dim=-1)


def block_generator(draws: Draws | None, prefix: Sequence[int], sampling: SamplingParams) -> torch.Generator | None:
    """The generator of a draft block that starts after ``prefix`` (None under greedy decoding,
    which draws nothing; draws may then be None)."""
    if sampling.greedy:
        return None
    if draws is None:
        raise ValueError("a sampled draft block needs the request's draws")
    return draws.at(len(prefix), DRAFT)


class Block:
    """A draft block in the making after ``prefix``: ``take(logits)`` is the one draft step every
    drafting loop runs (alone, batched across sessions, the edge's, a speculation cache's
    branches): pick the next token from the position's logits with the block's generator, keep
    the q it was drawn from, and (``keep_rows``) the draft's distribution for a speculation cache
    to rank (``ranking_row``)."""

    def __init__(
        self, prefix: Sequence[int], sampling: SamplingParams, draws: Draws | None, keep_rows: bool = False
    ) -> None:
        self.prefix, self.sampling, self.keep_rows = list(prefix), sampling, keep_rows
        self.generator = block_generator(draws, prefix, sampling)
        self.drafted: list[int] = []
        self.probs: list[torch.Tensor | None] = []  # q per token (None: greedy)
        self.rows: list[torch.Tensor] = []  # ranking rows, with keep_rows

    @property
    def tokens(self) -> list[int]:
        """The prefix and what is drafted so far: the next step's input."""
        return self.prefix + self.drafted

    def request(self, seq_id: str) -> LogitsRequest:
        return LogitsRequest(seq_id, self.tokens, 1)

    def take(self, logits: torch.Tensor) -> int:
        """One draft step from the next position's logits [1, vocab]; returns the token."""
        token, q = pick_token(logits, self.sampling, self.generator)
        self.drafted.append(token)
        self.probs.append(q)
        if self.keep_rows:
            self.rows.append(ranking_row(logits, self.sampling))
        return token

    def step(self, model: LanguageModel, seq_id: str) -> int:
        """One draft step on ``model`` alone."""
        return self.take(model.logits(seq_id, self.tokens, 1))

    def result(self) -> tuple[list[int], torch.Tensor | None]:
        """(the drafted tokens, their q [n_tokens, vocab] or None under greedy)."""
        probs = [q for q in self.probs if q is not None]
        return list(self.drafted), (torch.stack(probs) if not self.sampling.greedy and probs else None)


def draft_block(
    model: LanguageModel,
    seq_id: str,
    prefix: Sequence[int],
    n_tokens: int,
    sampling: SamplingParams,
    draws: Draws | None,
) -> tuple[list[int], torch.Tensor | None]:
    """n_tokens draft tokens after ``prefix`` and their q ([n_tokens, vocab] or None)."""
    block = Block(prefix, sampling, draws)
    for _ in range(n_tokens):
        block.step(model, seq_id)
    return block.result()


@dataclass(frozen=True)
class DraftJob:
    """One session's draft block of ``n_tokens`` after ``prefix``: run alone with ``run()``
    (``draft_block``), or with other sessions' blocks on the same model (``run_draft_jobs``)."""

    model: LanguageModel
    seq_id: str
    prefix: Sequence[int]
    n_tokens: int
    sampling: SamplingParams
    draws: Draws | None  # None: greedy

    def run(self) -> tuple[list[int], torch.Tensor | None]:
        return draft_block(self.model, self.seq_id, self.prefix, self.n_tokens, self.sampling, self.draws)

    __call__ = run


def run_draft_jobs(jobs: Sequence[DraftJob]) -> list[tuple[bool, object]]:
    """Every job's block with one batched pass of the model per draft step (step k holds the jobs
    that draft a k-th token: blocks may differ in length); each as (ok, draft_block's result or the
    exception). If a batched pass fails, its jobs finish their blocks alone, so only the job at
    fault fails (a failed pass leaves the caches as before it)."""
    model = jobs[0].model
    if any(job.model is not model for job in jobs):
        raise ValueError("batched drafting runs one model; these jobs name several")
    if len({job.seq_id for job in jobs}) != len(jobs):
        raise ValueError(f"a batch holds each sequence once, got {[job.seq_id for job in jobs]}")
    blocks = [Block(job.prefix, job.sampling, job.draws) for job in jobs]
    alone: list[int] = []  # jobs whose batched pass failed
    for step in range(max(job.n_tokens for job in jobs)):
        live = [i for i, job in enumerate(jobs) if step < job.n_tokens and i not in alone]
        try:
            rows = model.logits_batch([blocks[i].request(jobs[i].seq_id) for i in live])
        except Exception:
            alone.extend(live)
            continue
        for i, logits in zip(live, rows):  # logits [1, vocab]
            blocks[i].take(logits)
    return [
        _finish_alone(job, block) if i in alone else (True, block.result())
        for i, (job, block) in enumerate(zip(jobs, blocks))
    ]


def _finish_alone(job: DraftJob, block: Block) -> tuple[bool, object]:
    """The rest of a job's block, drafted alone, as (ok, result or the exception it raised)."""
    try:
        while len(block.drafted) < job.n_tokens:
            block.step(job.model, job.seq_id)
        return True, block.result()
    except Exception as exc:  # handed to that job's caller
        return False, exc
