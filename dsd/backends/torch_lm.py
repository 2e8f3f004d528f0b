"""Hugging Face causal LMs with one KV cache per sequence (CPU or CUDA, dtype selectable)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from dsd.backends.protocol import ForwardStats
from dsd.sequence import common_prefix_length

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


@dataclass(frozen=True)
class TorchLMConfig:
    path: str                   # a local Hugging Face model folder (or a hub id where online)
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


class _SeqCache:
    def __init__(self, config) -> None:
        self.tokens: list[int] = []
        self.kv = DynamicCache(config=config)


class TorchLM:
    """A LanguageModel over a transformers causal LM."""

    def __init__(self, model: PreTrainedModel, name: str, eos_token_id: int | None) -> None:
        self.model = model.eval()
        self.name = name
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_id = eos_token_id
        self.device = next(model.parameters()).device
        self.stats = ForwardStats()
        self._caches: dict[str, _SeqCache] = {}

    @classmethod
    def load(cls, config: TorchLMConfig) -> "TorchLM":
        model = AutoModelForCausalLM.from_pretrained(config.path, dtype=DTYPES[config.dtype])
        model.to(config.device)
        eos = model.config.eos_token_id
        return cls(model, name=Path(config.path).name, eos_token_id=eos)

    def cached_length(self, seq_id: str) -> int:
        cache = self._caches.get(seq_id)
        return len(cache.tokens) if cache else 0

    def release(self, seq_id: str) -> None:
        self._caches.pop(seq_id, None)

    def crop(self, seq_id: str, length: int) -> None:
        cache = self._caches.get(seq_id)
        if cache is not None and length < len(cache.tokens):
            cache.kv.crop(-(len(cache.tokens) - length))
            del cache.tokens[length:]

    @torch.inference_mode()
    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        if not 1 <= n_last <= len(tokens):
            raise ValueError(f"n_last must be in [1, {len(tokens)}], got {n_last}")
        cache = self._caches.get(seq_id)
        if cache is None:
            cache = self._caches[seq_id] = _SeqCache(self.model.config)
        # Reuse the longest common prefix, but feed at least n_last positions.
        keep = min(common_prefix_length(cache.tokens, tokens), len(tokens) - n_last)
        self.crop(seq_id, keep)
        new_tokens = list(tokens[keep:])
        input_ids = torch.tensor([new_tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=cache.kv, use_cache=True)
        cache.tokens.extend(new_tokens)
        self.stats.passes += 1
        self.stats.positions_fed += len(new_tokens)
        return out.logits[0, -n_last:].float().cpu()  # [n_last, vocab]
