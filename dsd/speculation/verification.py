"""Verifying a draft block against the target: greedy exact match and speculative sampling.

Leviathan et al. 2023, Algorithm 1 (and Chen et al. 2023), with p the target's distribution and
q the draft's: accept draft token x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection sample the corrected token from norm(max(0, p_i - q_i)); if all gamma are accepted,
sample the bonus token from p_gamma. Greedy decoding is the special case where acceptance is
exact match with argmax p_i, and the corrected/bonus token is argmax p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dsd.backends.protocol import SamplingParams


@dataclass(frozen=True)
class BlockOutcome:
    accepted: int  # draft tokens accepted, 0..gamma
    next_token: int  # corrected (accepted < gamma) or bonus (accepted == gamma)


def greedy_verify(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> BlockOutcome:
    """target_logits: [gamma+1, vocab], row i predicts position i of the block; draft_tokens: [gamma]."""
    target_tokens = target_logits.argmax(dim=-1)  # [gamma+1]
    gamma = draft_tokens.shape[0]
    mismatch = (target_tokens[:gamma] != draft_tokens).nonzero()
    accepted = int(mismatch[0, 0]) if mismatch.numel() else gamma
    return BlockOutcome(accepted, int(target_tokens[accepted]))


def speculative_sample(
    p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator
) -> BlockOutcome:
    """p: [gamma+1, vocab] target probabilities; q: [gamma, vocab] draft probabilities the draft
    tokens were sampled from; draft_tokens: [gamma]. Returns the accepted count and next token.
    """
    gamma = draft_tokens.shape[0]
    rows = torch.arange(gamma)
    p_x = p[rows, draft_tokens]  # [gamma]
    q_x = q[rows, draft_tokens]  # [gamma]
    r = torch.rand(gamma, generator=generator, dtype=p.dtype)  # [gamma]
    # Accept if r < p/q, written as r*q < p so that q_x = 0 (impossible draft) never divides.
    rejected = (r * q_x >= p_x).nonzero()
    if not rejected.numel():
        return BlockOutcome(gamma, sample_index(p[gamma], generator))
    accepted = int(rejected[0, 0])
    residual = torch.clamp(p[accepted] - q[accepted], min=0.0)  # [vocab]
    if float(residual.sum()) <= 0.0:
        # Deviation from the paper: p == q at this row makes the residual empty, and then a
        # rejection has probability 0; floating-point noise can still get here, so fall back to p.
        residual = p[accepted]
    return BlockOutcome(accepted, sample_index(residual, generator))


def sample_index(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one index from non-negative weights [vocab] (need not sum to one). The draw is over
    the non-zero entries only: after nucleus truncation they are a few dozen of a 49,152-token
    row, and torch.multinomial's time grows with the row (~1 ms for 49,152 on one core)."""
    support = weights.nonzero()[:, 0]
    if not support.numel():
        raise ValueError("cannot sample from weights that are all zero")
    return int(support[torch.multinomial(weights[support], 1, generator=generator)])


def probs_from_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution over the vocabulary for each row of logits [n, vocab]: temperature,
    then top-k, then top-p (nucleus) truncation, renormalised. Drafter and target apply the same
    truncation to their own logits, so speculative sampling is exact for the target's truncated
    distribution (Leviathan et al. only need p and q to be the distributions actually sampled)."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [n, vocab]
    if top_p < 1.0:
        probs = _nucleus(probs, top_p)
    return probs


NUCLEUS_FIRST_KS = (64, 1024)  # look for the nucleus among this many top tokens before sorting all


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep, per row, the most probable tokens until their mass reaches top_p (the token that
    crosses top_p is kept, so at least one always is); renormalise. probs: [n, vocab].

    The nucleus is looked for among the top k tokens first, for each k of NUCLEUS_FIRST_KS: when
    the mass ahead of the last of them already reaches top_p in every row, no token outside them
    is kept and the result is the full sort's. A chat answer's nucleus is mostly a few tokens, and
    a top-64 of a 49,152-token row costs a quarter of a top-1024, itself a fifth of the sort."""
    for k in NUCLEUS_FIRST_KS:
        if k >= probs.shape[-1]:
            break
        top_probs, top_ids = torch.topk(probs, k, dim=-1)  # [n, k], descending
        mass_before = torch.cumsum(top_probs, dim=-1) - top_probs
        if bool((mass_before[..., -1] >= top_p).all()):
            kept = top_probs * (mass_before < top_p)
            out = torch.zeros_like(probs).scatter(-1, top_ids, kept)
            return out / kept.sum(dim=-1, keepdim=True)
    return _nucleus_by_sort(probs, top_p)


def _nucleus_by_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)  # [n, vocab]
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the tokens ahead
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def sampling_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """probs_from_logits with a SamplingParams' settings."""
    return probs_from_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
