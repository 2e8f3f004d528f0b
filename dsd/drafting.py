"""Drafting: the draft model proposes tokens autoregressively on a given prefix.

A ``DraftJob`` is one session's draft block; several sessions' blocks on one model run together
with ``run_draft_jobs``: one batched pass of the draft (``logits_batch``) per draft step, each
session on its own KV cache, so a co-located server that drafts for many sessions at once pays
one pass per step, not one per session and step. Each session draws its tokens from its own
logits with its own draws in the same order as alone, so batched drafting is the unbatched
one: greedy token for token, sampled the same draws from the same q (to float rounding). A
block's draws are keyed by where it starts (dsd.draws).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsd.backends.protocol import LanguageModel, LogitsRequest, SamplingParams
from dsd.draws import DRAFT, Draws
from dsd.verification import sample_index, sampling_probs


def begin_request(model: LanguageModel, seq_id: str, prompt: Sequence[int], gamma: int) -> None:
    """Tell the draft a request's prompt and gamma before its first draft. Only the synthetic
    draft with stratified acceptance uses them (it lays out the request's rounds); other models
    have no ``begin_request`` and need nothing."""
    begin = getattr(model, "begin_request", None)
    if begin is not None:
        begin(seq_id, prompt, gamma)


def draft_step(model: LanguageModel, seq_id: str, tokens: Sequence[int], sampling: SamplingParams,
               generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """One draft token after ``tokens``, and the distribution q it was drawn from ([vocab], or
    None under greedy decoding)."""
    return pick_token(model.logits(seq_id, tokens, 1), sampling, generator)


def pick_token(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
               ) -> tuple[int, torch.Tensor | None]:
    """The draft token from one position's logits [1, vocab], and its q ([vocab] or None)."""
    if sampling.greedy:
        return int(logits[0].argmax()), None
    q = sampling_probs(logits, sampling)[0]                           # [vocab]
    return sample_index(q, generator), q


def ranking_row(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The draft's distribution at one position [vocab], as a speculation cache ranks what the
    verifier may send back (dsd.spec_cache): softmax(logits / temperature), greedy as temperature
    1, with no nucleus cut: a correction comes from where the target puts more mass than the
    draft, which is often outside the draft's own nucleus."""
    temperature = 1.0 if sampling.greedy else sampling.temperature
    return torch.softmax(logits[0].float() / temperature, dim=-1)


def block_generator(draws: Draws | None, prefix: Sequence[int], sampling: SamplingParams) -> torch.Generator | None:
    """The generator of a draft block that starts after ``prefix`` (None under greedy decoding,
    which draws nothing; draws may then be None)."""
    return None if sampling.greedy else draws.at(len(prefix), DRAFT)


def draft_block(model: LanguageModel, seq_id: str, prefix: Sequence[int], n_tokens: int,
                sampling: SamplingParams, draws: Draws | None) -> tuple[list[int], torch.Tensor | None]:
    """n_tokens draft tokens after ``prefix`` and their q ([n_tokens, vocab] or None)."""
    generator = block_generator(draws, prefix, sampling)
    tokens = list(prefix)
    probs = []
    for _ in range(n_tokens):
        token, q = draft_step(model, seq_id, tokens, sampling, generator)
        tokens.append(token)
        probs.append(q)
    drafted = tokens[len(prefix):]
    return drafted, (torch.stack(probs) if not sampling.greedy else None)


@dataclass(frozen=True)
class DraftJob:
    """One session's draft block of ``n_tokens`` after ``prefix``: run alone with ``run()``
    (``draft_block``), or with other sessions' blocks on the same model (``run_draft_jobs``)."""
    model: LanguageModel
    seq_id: str
    prefix: Sequence[int]
    n_tokens: int
    sampling: SamplingParams
    draws: Draws | None               # None: greedy

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
    tokens = [list(job.prefix) for job in jobs]
    generators = [block_generator(job.draws, job.prefix, job.sampling) for job in jobs]
    probs: list[list[torch.Tensor | None]] = [[] for _ in jobs]
    alone: list[int] = []                        # jobs whose batched pass failed
    for step in range(max(job.n_tokens for job in jobs)):
        live = [i for i, job in enumerate(jobs) if step < job.n_tokens and i not in alone]
        try:
            rows = model.logits_batch([LogitsRequest(jobs[i].seq_id, tokens[i], 1) for i in live])
        except Exception:
            alone.extend(live)
            continue
        for i, logits in zip(live, rows):                               # logits [1, vocab]
            token, q = pick_token(logits, jobs[i].sampling, generators[i])
            tokens[i].append(token)
            probs[i].append(q)
    return [_finish(job, tokens[i], probs[i], generators[i]) if i in alone
            else (True, _block(job, tokens[i], probs[i])) for i, job in enumerate(jobs)]


def _block(job: DraftJob, tokens: list[int], probs: list) -> tuple[list[int], torch.Tensor | None]:
    """draft_block's result from a job's tokens (prefix + drafted) and its q rows."""
    return tokens[len(job.prefix):], (torch.stack(probs) if not job.sampling.greedy else None)


def _finish(job: DraftJob, tokens: list[int], probs: list, generator: torch.Generator | None
            ) -> tuple[bool, object]:
    """The rest of a job's block, drafted alone, as (ok, result or the exception it raised)."""
    try:
        while len(tokens) - len(job.prefix) < job.n_tokens:
            token, q = draft_step(job.model, job.seq_id, tokens, job.sampling, generator)
            tokens.append(token)
            probs.append(q)
        return True, _block(job, tokens, probs)
    except Exception as exc:         # handed to that job's caller
        return False, exc
