"""Drafting: the draft model proposes tokens autoregressively on a given prefix."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from dsd.backends.protocol import LanguageModel, SamplingParams
from dsd.verification import probs_from_logits


def begin_request(model: LanguageModel, seq_id: str, prompt: Sequence[int], gamma: int) -> None:
    """Tell the draft a request's prompt and gamma before its first draft. Only the synthetic
    draft with stratified acceptance uses them (it lays out the request's rounds); other models
    have no ``begin_request`` and need nothing."""
    begin = getattr(model, "begin_request", None)
    if begin is not None:
        begin(seq_id, prompt, gamma)


def draft_step(model: LanguageModel, seq_id: str, tokens: Sequence[int], sampling: SamplingParams,
               generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """One draft token after ``tokens``, and the distribution q it was drawn from ([vocab], or
    None under greedy decoding)."""
    logits = model.logits(seq_id, tokens, 1)                          # [1, vocab]
    if sampling.greedy:
        return int(logits[0].argmax()), None
    q = probs_from_logits(logits, sampling.temperature, sampling.top_k)[0]  # [vocab]
    return int(torch.multinomial(q, 1, generator=generator)), q


def draft_block(model: LanguageModel, seq_id: str, prefix: Sequence[int], n_tokens: int,
                sampling: SamplingParams, generator: torch.Generator
                ) -> tuple[list[int], torch.Tensor | None]:
    """n_tokens draft tokens after ``prefix`` and their q ([n_tokens, vocab] or None)."""
    tokens = list(prefix)
    probs = []
    for _ in range(n_tokens):
        token, q = draft_step(model, seq_id, tokens, sampling, generator)
        tokens.append(token)
        probs.append(q)
    drafted = tokens[len(prefix):]
    return drafted, (torch.stack(probs) if not sampling.greedy else None)
