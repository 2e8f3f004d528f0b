"""The one interface every backend implements, and the messages built on it.

A backend is a causal language model that keeps one KV cache per sequence id. Drafting,
verification and autoregressive steps are all ``logits`` calls; the model itself decides what it
can reuse from the cache (the longest common prefix) and crops the rest, so a rejected draft is
thrown away and the accepted prefix is never recomputed.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class ForwardStats:
    """What a model has computed, to show that nothing is computed twice."""
    passes: int = 0           # forward calls
    positions_fed: int = 0    # input positions processed, summed over calls


class LanguageModel(Protocol):
    name: str
    vocab_size: int
    eos_token_id: int | None
    stats: ForwardStats

    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        """Logits [n_last, vocab] at the last n_last positions of ``tokens``: row j predicts the
        token that follows ``tokens[:len(tokens) - n_last + 1 + j]``."""

    def cached_length(self, seq_id: str) -> int:
        """How many tokens of this sequence the KV cache holds."""

    def crop(self, seq_id: str, length: int) -> None:
        """Drop cached positions from ``length`` on (no-op if the cache is shorter)."""

    def release(self, seq_id: str) -> None:
        """Forget the sequence and free its cache."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0    # 0 means greedy
    top_k: int | None = None
    seed: int = 0
    top_p: float = 1.0          # nucleus: keep the smallest set of tokens holding top_p of the mass

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Proposal:
    """A draft block sent for verification: what the edge assumed and what it drafted."""
    start_pos: int                     # position of the first draft token in the sequence
    base_digest: int                   # dsd.sequence digest of the assumed tokens[:start_pos]
    draft_tokens: tuple[int, ...]      # [gamma]
    draft_probs: torch.Tensor | None = field(default=None, compare=False)  # [gamma, vocab] q

    @property
    def gamma(self) -> int:
        return len(self.draft_tokens)


@dataclass(frozen=True)
class Verdict:
    """The target's answer to a Proposal."""
    start_pos: int
    proposed: int
    accepted: int            # 0..proposed; 0 if stale
    next_token: int          # corrected or bonus token; -1 if stale
    stale: bool = False

    @property
    def emitted(self) -> int:
        return 0 if self.stale else self.accepted + 1
