"""The feature draft as a backend: a LanguageModel over dsd.backends.eagle_model that also takes
the target's features (dsd.features.TakesFeatures).

Per sequence it keeps the target's true features (rows 0..m-1, from the verifier's prefill and
verdicts), the draft's KV cache and its own output at each position it fed. Draft position j reads
the feature at j - 1: the true one where it is known (j - 1 < m), else the draft's own output at
j - 1 (position 0 reads zeros). Positions whose inputs are all known go through in one pass (the
catch-up on a verdict's committed positions); beyond them each position waits for the one before.
When true features arrive for positions the draft fed with its own, those positions leave the cache
and are fed again, so a cached position always read the best feature known.

``logits`` answers as every backend does (rows for the last n_last positions, over the target's
vocabulary, -inf where the draft's head has no row), so drafting draws from these rows and the
q it draws from is exactly what the verifier's rejection sampling gets.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dsd.backends.eagle_model import EagleDraft, load_eagle
from dsd.backends.kernels import PATHS, KernelChoice, install_kept_paths
from dsd.backends.protocol import ForwardStats, LogitsRequest
from dsd.backends.vocab_map import VocabMap
from dsd.features import FeatureBlock
from dsd.sequence import common_prefix_length

_MIN_CAPACITY = 64


class _EagleSeq:
    """One sequence: tokens fed (cache positions 0..len-1), whether each read a true feature, and
    per position the keys, values and output; the true features known (rows 0..m-1)."""

    def __init__(self, kv_heads: int, head_dim: int, d: int, dtype: torch.dtype) -> None:
        self.tokens: list[int] = []
        self.read_true: list[bool] = []
        self.keys = torch.empty(kv_heads, 0, head_dim, dtype=dtype)
        self.values = torch.empty(kv_heads, 0, head_dim, dtype=dtype)
        self.outputs = torch.empty(0, d, dtype=dtype)
        self.true = torch.empty(0, d, dtype=dtype)
        self.m = 0

    def room(self, needed: int) -> None:
        if self.outputs.shape[0] >= needed:
            return
        capacity = max(needed, _MIN_CAPACITY, 2 * self.outputs.shape[0])
        self.keys = _grown(self.keys, capacity, dim=1)
        self.values = _grown(self.values, capacity, dim=1)
        self.outputs = _grown(self.outputs, capacity, dim=0)

    def crop(self, length: int) -> None:
        del self.tokens[length:]
        del self.read_true[length:]


def _grown(x: torch.Tensor, capacity: int, dim: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] = capacity
    out = x.new_zeros(shape)
    out.narrow(dim, 0, x.shape[dim]).copy_(x)
    return out


class EagleLM:
    """A LanguageModel, TakesFeatures and ForksCaches over an EagleDraft."""

    def __init__(self, model: EagleDraft, vocab_map: VocabMap, name: str, eos_token_id: int | None) -> None:
        self.model = model.eval()
        self.name = name
        self.vocab_map = vocab_map
        self.vocab_size = vocab_map.target_vocab_size
        self.eos_token_id = eos_token_id
        self.max_positions = None          # rotary positions: the target's limit is the one that binds
        self.stats = ForwardStats()
        self.dtype = model.fc.weight.dtype
        c = model.config
        self._group = c.heads // c.kv_heads
        self._to_draft = vocab_map.to_draft()
        self._seqs: dict[str, _EagleSeq] = {}
        # the head as a linear layer over the kept rows of the tied embedding (a view: one copy of
        # the weights), so that kernel paths can take it like the layer's own products
        self.head = nn.Linear(c.hidden_size, c.vocab_kept, bias=False, device="meta")     # no weights of its own
        self.head.weight = nn.Parameter(model.embed.weight.detach()[:c.vocab_kept], requires_grad=False)
        self.kernel_choice: KernelChoice | None = None

    @classmethod
    def load(cls, folder: str | Path, dtype: str = "float32", eos_token_id: int | None = None,
             kernel_paths: tuple[str, ...] = PATHS, kernel_store: bool = True) -> "EagleLM":
        """The draft in ``folder``; its products on the paths this machine keeps for it or times
        now among ``kernel_paths`` (dsd.backends.kernels; ("aten",): PyTorch's default), as a
        target's are."""
        from dsd.backends.torch_lm import DTYPES
        vocab_map = VocabMap.load(folder)
        if vocab_map is None:
            raise ValueError(f"{folder}: a feature draft needs its vocab_map.json")
        lm = cls(load_eagle(folder, DTYPES[dtype]), vocab_map, Path(folder).name, eos_token_id)
        modules = nn.ModuleList([lm.model, lm.head])
        lm.kernel_choice = install_kept_paths(modules, str(folder), dtype, tuple(kernel_paths), kernel_store)
        lm.head = modules[1]                            # a PathLinear now, where paths were installed
        return lm

    @property
    def feature_width(self) -> int:
        return self.model.config.hidden_size

    def _seq(self, seq_id: str) -> _EagleSeq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            c = self.model.config
            seq = self._seqs[seq_id] = _EagleSeq(c.kv_heads, c.head_dim, c.hidden_size, self.dtype)
        return seq

    # ---- TakesFeatures ---------------------------------------------------------------------------

    def add_features(self, seq_id: str, block: FeatureBlock) -> None:
        seq = self._seq(seq_id)
        if block.start > seq.m:
            raise ValueError(f"{seq_id}: features from position {block.start}, but only {seq.m} are known "
                             "(they come in order, without gaps)")
        if block.values.shape[1] != self.feature_width:
            raise ValueError(f"{seq_id}: features of width {block.values.shape[1]}, the draft reads "
                             f"{self.feature_width}")
        if block.end > seq.true.shape[0]:
            seq.true = _grown(seq.true, max(block.end, _MIN_CAPACITY, 2 * seq.true.shape[0]), dim=0)
        seq.true[block.start:block.end] = block.values.to(self.dtype)
        seq.m = max(seq.m, block.end)
        # a cached position j that read its own feature at j - 1 where a true one is now known
        for j in range(block.start + 1, min(len(seq.tokens), block.end + 1)):
            if not seq.read_true[j]:
                seq.crop(j)
                break

    def known_features(self, seq_id: str) -> int:
        seq = self._seqs.get(seq_id)
        return seq.m if seq else 0

    # ---- LanguageModel ---------------------------------------------------------------------------

    def cached_length(self, seq_id: str) -> int:
        seq = self._seqs.get(seq_id)
        return len(seq.tokens) if seq else 0

    def crop(self, seq_id: str, length: int) -> None:
        seq = self._seqs.get(seq_id)
        if seq is not None:
            seq.crop(length)

    def release(self, seq_id: str) -> None:
        self._seqs.pop(seq_id, None)

    # ---- ForksCaches (a speculation cache's branches) ---------------------------------------------

    def fork(self, seq_id: str, new_seq_id: str, length: int) -> None:
        source = self._seqs.get(seq_id)
        self._seqs.pop(new_seq_id, None)
        copy = self._seq(new_seq_id)
        if source is None:
            return
        keep = min(length, len(source.tokens))
        copy.room(keep)
        copy.tokens, copy.read_true = source.tokens[:keep], source.read_true[:keep]
        copy.keys[:, :keep], copy.values[:, :keep] = source.keys[:, :keep], source.values[:, :keep]
        copy.outputs[:keep] = source.outputs[:keep]
        copy.m = min(source.m, length)         # a true feature past the fork describes the source's tokens
        copy.true = source.true[:copy.m].clone()

    def move(self, seq_id: str, new_seq_id: str) -> None:
        """As ForksCaches says, but the true features ``new_seq_id`` knew stay known: a branch moves
        over the request's sequence when its guess of a verdict was right, so it shares every
        committed position those features describe (a verdict that came while it was filled, or
        just before the move, gave them to the request's sequence alone)."""
        seq = self._seqs.pop(seq_id, None)
        replaced = self._seqs.pop(new_seq_id, None)
        if seq is None:
            return
        self._seqs[new_seq_id] = seq
        if replaced is not None and replaced.m > seq.m:
            self.add_features(new_seq_id, FeatureBlock(seq.m, replaced.true[seq.m:replaced.m]))

    def logits_batch(self, requests: Sequence[LogitsRequest]) -> list[torch.Tensor]:
        # NOTE: one sequence after another: a co-located server drafting for many sessions pays a
        # pass per session and step with this draft (a batched pass is not written yet).
        return [self.logits(r.seq_id, r.tokens, r.n_last) for r in requests]

    @torch.inference_mode()
    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        n = len(tokens)
        if not 1 <= n_last <= n:
            raise ValueError(f"n_last must be in [1, {n}], got {n_last}")
        seq = self._seq(seq_id)
        seq.crop(min(common_prefix_length(seq.tokens, tokens), n - n_last))
        j = len(seq.tokens)
        while j < n:
            # positions j..end-1 read only features known now: true ones, or the output at j - 1
            end = max(j + 1, min(n, seq.m + 1))
            self._feed(seq, tokens, j, end)
            j = end
        h = seq.outputs[n - n_last:n]                                                   # [n_last, d]
        return self.vocab_map.full_logits(self.head(self.model.norm(h)).float())        # [n_last, vocab]

    def _feed(self, seq: _EagleSeq, tokens: Sequence[int], start: int, end: int) -> None:
        """One pass over positions start..end-1 (each reads the feature at its j - 1)."""
        model = self.model
        count = end - start
        seq.room(end)
        features = torch.zeros(count, self.feature_width, dtype=self.dtype)
        read_true = []
        for i, j in enumerate(range(start, end)):
            if j == 0:
                read_true.append(True)
            elif j - 1 < seq.m:
                features[i] = seq.true[j - 1]
                read_true.append(True)
            else:
                features[i] = seq.outputs[j - 1]          # only ever the pass's first position
                read_true.append(False)
        ids = self._to_draft[torch.tensor(list(tokens[start:end]))][None]               # [1, count]
        positions = torch.arange(start, end)[None]
        q, k, v = model.qkv(model.project(ids, features[None]), positions)              # [1, H|KV, count, hd]
        seq.keys[:, start:end] = k[0]
        seq.values[:, start:end] = v[0]
        mask = None if count == 1 else torch.ones(count, end, dtype=torch.bool).tril(start)
        attended = F.scaled_dot_product_attention(q, seq.keys[None, :, :end], seq.values[None, :, :end],
                                                  attn_mask=mask, enable_gqa=self._group > 1)
        seq.outputs[start:end] = model.finish(features[None], attended)[0]
        seq.tokens.extend(int(t) for t in tokens[start:end])
        seq.read_true.extend(read_true)
        self.stats.passes += 1
        self.stats.positions_fed += count
