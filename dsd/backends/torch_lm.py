"""Hugging Face causal LMs with one KV cache per sequence (CPU or CUDA, dtype selectable).

One forward pass serves one sequence or a batch of them (``logits_batch``): sequences of
different cached lengths and different numbers of new positions, packed into one row of the
model's input without padding (each position carries its own position id).
Each sequence keeps its own KV cache, preallocated per layer as [kv_heads, capacity, head_dim]
and grown by doubling; the model's attention (registered with transformers as ``dsd_rows``)
writes each row's new keys and values into its own cache and attends over that cache alone. So
there is no padded batch cache to gather and scatter, a pass copies nothing already cached (no
``torch.cat`` of the whole cache per step), and rolling a sequence back is a length change.
A sequence's attention is the same computation in a batch as alone; only the matrix products
over the packed positions differ in shape, so batched logits equal unbatched ones to float
rounding.

Only the positions whose logits are asked for go through the LM head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from dsd.backends.kernels import PATHS, KernelChoice, KernelConfig, install_kept_paths
from dsd.backends.protocol import ForwardStats, LogitsRequest
from dsd.backends.vocab_map import VocabMap
from dsd.sequence import common_prefix_length

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
ATTENTION = "dsd_rows"
_MIN_CAPACITY = 64
_FORK_HEADROOM = 32  # room a forked cache gets for a branch's block before it must grow


@dataclass(frozen=True)
class TorchLMConfig:
    path: str  # a local Hugging Face model folder (or a hub id where online)
    dtype: str = "float32"
    device: str = "cpu"
    # matrix-product paths to choose from by measurement at load (dsd.backends.kernels); ("aten",)
    # keeps PyTorch's default; a GPU always does
    kernel_paths: tuple[str, ...] = PATHS
    # take this machine's kept choice of paths for the model (dsd.backends.kernels.stored_choice)
    # where there is one, and keep the choice made here; False: time afresh, keep nothing
    kernel_store: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernel_paths", tuple(self.kernel_paths))
        KernelConfig(self.kernel_paths)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


class _SeqCache:
    """One sequence's KV cache: per layer, keys and values [kv_heads, capacity, head_dim], of
    which the first len(tokens) positions are valid."""

    def __init__(self, n_layers: int) -> None:
        self.tokens: list[int] = []
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    def buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer's (keys, values), None before its first pass."""
        keys, values = self.keys[layer], self.values[layer]
        return None if keys is None or values is None else (keys, values)

    def room(self, layer: int, like: torch.Tensor, length: int, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Make layer's buffers hold ``needed`` positions, keeping the first ``length``; returns
        them. like: [kv_heads, n, head_dim], the new keys (their shape, dtype and device)."""
        held = self.buffers(layer)
        if held is not None and held[0].shape[1] >= needed:
            return held
        capacity = max(needed, _MIN_CAPACITY, 2 * (held[0].shape[1] if held is not None else 0))
        shape = (like.shape[0], capacity, like.shape[2])
        new_keys, new_values = like.new_empty(shape), like.new_empty(shape)
        if held is not None and length:
            new_keys[:, :length] = held[0][:, :length]
            new_values[:, :length] = held[1][:, :length]
        self.keys[layer], self.values[layer] = new_keys, new_values
        return new_keys, new_values


class _Rows:
    """The sequences of one forward pass as the attention sees them, packed into one row of the
    model's input (no padding): sequence i is caches[i], with starts[i] positions cached and
    lengths[i] new ones, at offsets[i] in the packed row."""

    def __init__(self, caches: list[_SeqCache], starts: list[int], lengths: list[int]) -> None:
        self.caches, self.starts, self.lengths = caches, starts, lengths
        self.offsets = [sum(lengths[:i]) for i in range(len(lengths))]
        # Sequence i's new position j sees cached and new positions up to its own: start + j.
        self.masks = [
            None if n == 1 else torch.ones(n, start + n, dtype=torch.bool).tril(start)
            for start, n in zip(starts, lengths)
        ]  # [n, start + n] or None

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None
    ) -> torch.Tensor:
        """query [1, heads, T, head_dim], key/value [1, kv_heads, T, head_dim] (every sequence's
        new positions, packed) -> attention output [1, T, heads, head_dim]."""
        gqa = query.shape[1] != key.shape[1]
        outputs = []
        for i, (cache, start, n, offset) in enumerate(zip(self.caches, self.starts, self.lengths, self.offsets)):
            end = start + n
            mask = self.masks[i]
            if mask is not None and mask.device != query.device:
                mask = self.masks[i] = mask.to(query.device)
            keys, values = cache.room(layer, key[0], start, end)
            keys[:, start:end] = key[0, :, offset : offset + n]
            values[:, start:end] = value[0, :, offset : offset + n]
            out = F.scaled_dot_product_attention(
                query[:, :, offset : offset + n],
                keys[None, :, :end],
                values[None, :, :end],
                attn_mask=mask,
                scale=scaling,
                enable_gqa=gqa,
            )  # [1, heads, n, hd]
            outputs.append(out.transpose(1, 2))  # [1, n, heads, hd]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def _rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    rows: _Rows | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention of every TorchLM pass; called without ``rows`` (someone else calling the
    model directly, e.g. a test's reference forward) it is transformers' own sdpa."""
    if rows is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    layer: int = getattr(module, "layer_idx")  # transformers' attention modules number their layer
    return rows.attend(layer, query, key, value, scaling), None


AttentionInterface.register(ATTENTION, _rows_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


def model_positions(config: object) -> int | None:
    """The positions a transformers config's model has (learned or trained for), None if it names none."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_model(config: TorchLMConfig) -> tuple[PreTrainedModel, KernelChoice | None]:
    """(the transformers model at config.path in its dtype on its device, the KernelChoice its
    linear layers run on: the paths this machine keeps for it, else timed now; None on PyTorch's
    default path)."""
    model = AutoModelForCausalLM.from_pretrained(config.path, dtype=DTYPES[config.dtype])
    model.to(config.device)  # type: ignore[arg-type]  # transformers' wrapped .to types self as its argument
    if config.device != "cpu":
        return model, None
    return model, install_kept_paths(model, config.path, config.dtype, config.kernel_paths, config.kernel_store)


class TorchLM:
    """A LanguageModel over a transformers causal LM."""

    def __init__(
        self, model: PreTrainedModel, name: str, eos_token_id: int | None, vocab_map: VocabMap | None = None
    ) -> None:
        self.model = model.eval()
        config = model.config
        # NOTE: the per-row attention has no sliding window and no logit soft-capping: a model
        # that needs either would get wrong logits, so it is refused here.
        for feature in ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(config, feature, None):
                raise ValueError(
                    f"model {name!r}: config.{feature} = {getattr(config, feature)!r} "
                    "is not supported by the hf backend's attention"
                )
        model.set_attn_implementation(ATTENTION)
        self.name = name
        # A draft over part of the target's vocabulary reads and answers in target ids.
        self._vocab_map = vocab_map
        self._to_model_ids = vocab_map.to_draft().to(model.device) if vocab_map else None
        self.vocab_size = vocab_map.target_vocab_size if vocab_map else int(config.vocab_size)
        self.eos_token_id = eos_token_id
        self.max_positions = model_positions(config)
        self.device = next(model.parameters()).device
        self.stats = ForwardStats()
        self._base = model.base_model  # the transformer without the LM head
        self._head = model.get_output_embeddings()
        self._n_layers = int(config.num_hidden_layers)
        # A 4D mask makes transformers skip building one: _Rows.attend masks each row itself.
        self._no_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=self.device)
        self._caches: dict[str, _SeqCache] = {}
        self.kernel_choice: KernelChoice | None = None  # the paths chosen at load, if any

    @classmethod
    def load(cls, config: TorchLMConfig) -> TorchLM:
        model, choice = load_model(config)
        eos = model.config.eos_token_id
        lm = cls(model, name=Path(config.path).name, eos_token_id=eos, vocab_map=VocabMap.load(config.path))
        lm.kernel_choice = choice
        return lm

    def _after_pass(self, requests: Sequence[LogitsRequest], starts: list[int], lengths: list[int]) -> None:
        """A subclass's look at a pass's layers (dsd.backends.feature_target): request i fed
        positions starts[i]..starts[i] + lengths[i] - 1, packed in that order."""

    def cached_length(self, seq_id: str) -> int:
        cache = self._caches.get(seq_id)
        return len(cache.tokens) if cache else 0

    def release(self, seq_id: str) -> None:
        self._caches.pop(seq_id, None)

    def crop(self, seq_id: str, length: int) -> None:
        cache = self._caches.get(seq_id)
        if cache is not None:
            del cache.tokens[length:]  # the buffers' later positions are overwritten next

    def fork(self, seq_id: str, new_seq_id: str, length: int) -> None:
        source = self._caches.get(seq_id)
        keep = min(length, len(source.tokens)) if source is not None else 0
        copy = self._caches[new_seq_id] = _SeqCache(self._n_layers)
        if source is None or not keep:
            return
        copy.tokens = list(source.tokens[:keep])
        for layer in range(self._n_layers):
            held = source.buffers(layer)
            if held is None:
                raise RuntimeError(f"sequence {seq_id!r} holds {keep} tokens but no cache at layer {layer}")
            keys, values = held
            capacity = max(_MIN_CAPACITY, keep + _FORK_HEADROOM)
            new_keys = keys.new_empty((keys.shape[0], capacity, keys.shape[2]))
            new_values = values.new_empty((values.shape[0], capacity, values.shape[2]))
            new_keys[:, :keep] = keys[:, :keep]
            new_values[:, :keep] = values[:, :keep]
            copy.keys[layer], copy.values[layer] = new_keys, new_values

    def move(self, seq_id: str, new_seq_id: str) -> None:
        cache = self._caches.pop(seq_id, None)
        self._caches.pop(new_seq_id, None)
        if cache is not None:
            self._caches[new_seq_id] = cache

    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        return self.logits_batch([LogitsRequest(seq_id, tokens, n_last)])[0]

    @torch.inference_mode()
    def logits_batch(self, requests: Sequence[LogitsRequest]) -> list[torch.Tensor]:
        """One forward pass over every request's new positions; each answer as ``logits``."""
        if len({r.seq_id for r in requests}) != len(requests):
            raise ValueError(f"a batch holds each sequence once, got {[r.seq_id for r in requests]}")
        caches, starts, news = [], [], []
        for r in requests:
            if not 1 <= r.n_last <= len(r.tokens):
                raise ValueError(f"n_last must be in [1, {len(r.tokens)}], got {r.n_last}")
            cache = self._caches.get(r.seq_id)
            if cache is None:
                cache = self._caches[r.seq_id] = _SeqCache(self._n_layers)
            # Reuse the longest common prefix, but feed at least n_last positions.
            keep = min(common_prefix_length(cache.tokens, r.tokens), len(r.tokens) - r.n_last)
            del cache.tokens[keep:]
            caches.append(cache)
            starts.append(keep)
            news.append(list(r.tokens[keep:]))
        lengths = [len(new) for new in news]
        input_ids = torch.tensor([[t for new in news for t in new]], device=self.device)  # [1, T]
        if self._to_model_ids is not None:
            input_ids = self._to_model_ids[input_ids]
        positions = torch.tensor(
            [[p for start, n in zip(starts, lengths) for p in range(start, start + n)]], device=self.device
        )  # [1, T]
        rows = _Rows(caches, starts, lengths)
        hidden = self._base(
            input_ids=input_ids, position_ids=positions, attention_mask=self._no_mask, use_cache=False, rows=rows
        ).last_hidden_state[0]  # [T, d]
        self._after_pass(requests, starts, lengths)
        if len(requests) > 1 or requests[0].n_last < lengths[0]:
            wanted = [
                p
                for r, n, offset in zip(requests, lengths, rows.offsets)
                for p in range(offset + n - r.n_last, offset + n)
            ]
            hidden = hidden[torch.tensor(wanted, device=self.device)]  # [sum n_last, d]
        logits = self._head(hidden).float().cpu()  # [sum n_last, vocab]
        if self._vocab_map is not None:
            logits = self._vocab_map.full_logits(logits)
        for cache, new in zip(caches, news):
            cache.tokens.extend(new)
        self.stats.passes += 1
        self.stats.positions_fed += sum(len(new) for new in news)
        return list(logits.split([r.n_last for r in requests]))
