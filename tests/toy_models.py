"""Small exact language models for tests: a bigram table behind the LanguageModel interface."""

from __future__ import annotations

import torch

from dsd.backends.protocol import ForwardStats


class BigramLM:
    """p(next | previous token) from a fixed table; logits are log-probabilities."""

    def __init__(self, probs: torch.Tensor, name: str = "bigram") -> None:
        self.probs = probs  # [vocab, vocab], rows sum to one
        self.name = name
        self.vocab_size = probs.shape[0]
        self.eos_token_id = None
        self.max_positions = None
        self.stats = ForwardStats()
        self._cached: dict[str, int] = {}

    def logits(self, seq_id, tokens, n_last):
        self.stats.passes += 1
        self._cached[seq_id] = len(tokens)
        previous = torch.tensor(list(tokens[len(tokens) - n_last :]))
        return torch.log(self.probs[previous])  # [n_last, vocab]

    def logits_batch(self, requests):
        return [self.logits(r.seq_id, r.tokens, r.n_last) for r in requests]

    def cached_length(self, seq_id):
        return self._cached.get(seq_id, 0)

    def crop(self, seq_id, length):
        if seq_id in self._cached:
            self._cached[seq_id] = min(self._cached[seq_id], length)

    def release(self, seq_id):
        self._cached.pop(seq_id, None)

    def fork(self, seq_id, new_seq_id, length):
        self._cached[new_seq_id] = min(self._cached.get(seq_id, 0), length)

    def move(self, seq_id, new_seq_id):
        self._cached.pop(new_seq_id, None)
        if seq_id in self._cached:
            self._cached[new_seq_id] = self._cached.pop(seq_id)


def random_bigram(vocab: int, seed: int, sharpness: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharpness * torch.randn(vocab, vocab, generator=g), dim=-1)
