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
        self.max_positions = None  # rotary positions: the target's limit is the one that binds
        self.stats = ForwardStats()
        self.dtype = model.fc.weight.dtype
        c = model.config
        self._group = c.heads // c.kv_heads
        self._to_draft = vocab_map.to_draft()
        self._seqs: dict[str, _EagleSeq] = {}
        # the head as a linear layer over the kept rows of the tied embedding (a view: one copy of
        # the weights), so that kernel paths can take it like the layer's own products
        head = nn.Linear(c.hidden_size, c.vocab_kept, bias=False, device="meta")  # no weights of its own
        head.weight = nn.Parameter(model.embed.weight.detach()[: c.vocab_kept], requires_grad=False)
        self.head: nn.Module = head  # a PathLinear once kernel paths are installed
        self.kernel_choice: KernelChoice | None = None

    @classmethod
    def load(
        cls,
        folder: str | Path,
        dtype: str = "float32",
        eos_token_id: int | None = None,
        kernel_paths: tuple[str, ...] = PATHS,
        kernel_store: bool = True,
    ) -> EagleLM:
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
        lm.head = modules[1]  # a PathLinear now, where paths were installed
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
            raise ValueError(
                f"{seq_id}: features from position {block.start}, but only {seq.m} are known "
                "(they come in order, without gaps)"
            )
        if block.values.shape[1] != self.feature_width:
            raise ValueError(
                f"{seq_id}: features of width {block.values.shape[1]}, the draft reads {self.feature_width}"
            )
        if block.end > seq.true.shape[0]:
            seq.true = _grown(seq.true, max(block.end, _MIN_CAPACITY, 2 * seq.true.shape[0]), dim=0)
        seq.true[block.start : block.end] = block.values.to(self.dtype)
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
        copy.m = min(source.m, length)  # a true feature past the fork describes the source's tokens
        copy.true = source.true[: copy.m].clone()

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
            self.add_features(new_seq_id, FeatureBlock(seq.m, replaced.true[seq.m : replaced.m]))

    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        return self.logits_batch([LogitsRequest(seq_id, tokens, n_last)])[0]

    @torch.inference_mode()
    def logits_batch(self, requests: Sequence[LogitsRequest]) -> list[torch.Tensor]:
        """Each answer as ``logits``. A sequence's positions go through in passes as the module's
        docstring says; the one-position passes of several sequences (a drafting step's, one per
        sequence) go through together: one batched pass a step."""
        if len({r.seq_id for r in requests}) != len(requests):
            raise ValueError(f"a batch holds each sequence once, got {[r.seq_id for r in requests]}")
        if not requests:
            return []
        seqs = []
        for r in requests:
            n = len(r.tokens)
            if not 1 <= r.n_last <= n:
                raise ValueError(f"n_last must be in [1, {n}], got {r.n_last}")
            seq = self._seq(r.seq_id)
            seq.crop(min(common_prefix_length(seq.tokens, r.tokens), n - r.n_last))
            seqs.append(seq)
        pending = [i for i, r in enumerate(requests) if len(seqs[i].tokens) < len(r.tokens)]
        while pending:
            singles = []
            for i in pending:
                seq, tokens = seqs[i], requests[i].tokens
                j = len(seq.tokens)
                end = max(j + 1, min(len(tokens), seq.m + 1))  # positions that read only known features
                if end - j > 1:
                    self._feed(seq, tokens, j, end)
                else:
                    singles.append(i)
            if len(singles) == 1:
                seq = seqs[singles[0]]
                self._feed(seq, requests[singles[0]].tokens, len(seq.tokens), len(seq.tokens) + 1)
            elif singles:
                self._feed_one_each([seqs[i] for i in singles], [requests[i].tokens for i in singles])
            pending = [i for i in pending if len(seqs[i].tokens) < len(requests[i].tokens)]
        h = torch.cat([seq.outputs[len(r.tokens) - r.n_last : len(r.tokens)] for seq, r in zip(seqs, requests)])
        logits = self.vocab_map.full_logits(self.head(self.model.norm(h)).float())  # [rows, vocab]
        return list(logits.split([r.n_last for r in requests]))

    def _feed(self, seq: _EagleSeq, tokens: Sequence[int], start: int, end: int) -> None:
        """One pass over positions start..end-1 (each reads the feature at its j - 1)."""
        model = self.model
        count = end - start
        seq.room(end)
        features = torch.zeros(count, self.feature_width, dtype=self.dtype)
        read_true = [_read_feature(seq, j, features[i]) for i, j in enumerate(range(start, end))]
        ids = self._to_draft[torch.tensor(list(tokens[start:end]))][None]  # [1, count]
        positions = torch.arange(start, end)[None]
        q, k, v = model.qkv(model.project(ids, features[None]), positions)  # [1, H|KV, count, hd]
        seq.keys[:, start:end] = k[0]
        seq.values[:, start:end] = v[0]
        mask = None if count == 1 else torch.ones(count, end, dtype=torch.bool).tril(start)
        attended = F.scaled_dot_product_attention(
            q, seq.keys[None, :, :end], seq.values[None, :, :end], attn_mask=mask, enable_gqa=self._group > 1
        )
        seq.outputs[start:end] = model.finish(features[None], attended)[0]
        seq.tokens.extend(int(t) for t in tokens[start:end])
        seq.read_true.extend(read_true)
        self.stats.passes += 1
        self.stats.positions_fed += count

    def _feed_one_each(self, seqs: list[_EagleSeq], tokens: list[Sequence[int]]) -> None:
        """One pass over the next position of each of B sequences: the shorter ones' keys and
        values padded to the longest and masked."""
        model = self.model
        B = len(seqs)
        starts = [len(seq.tokens) for seq in seqs]
        length = max(starts) + 1
        features = torch.zeros(B, 1, self.feature_width, dtype=self.dtype)
        read_true = [_read_feature(seq, j, features[b, 0]) for b, (seq, j) in enumerate(zip(seqs, starts))]
        ids = self._to_draft[torch.tensor([int(t[j]) for t, j in zip(tokens, starts)])][:, None]  # [B, 1]
        q, k, v = model.qkv(model.project(ids, features), torch.tensor(starts)[:, None])  # [B, H|KV, 1, hd]
        keys = k.new_zeros(B, k.shape[1], length, k.shape[3])
        values = torch.zeros_like(keys)
        mask = torch.zeros(B, 1, 1, length, dtype=torch.bool)
        for b, (seq, j) in enumerate(zip(seqs, starts)):
            seq.room(j + 1)
            seq.keys[:, j], seq.values[:, j] = k[b, :, 0], v[b, :, 0]
            keys[b, :, : j + 1], values[b, :, : j + 1] = seq.keys[:, : j + 1], seq.values[:, : j + 1]
            mask[b, ..., : j + 1] = True
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self._group > 1)
        outputs = model.finish(features, attended)  # [B, 1, d]
        for b, (seq, j) in enumerate(zip(seqs, starts)):
            seq.outputs[j] = outputs[b, 0]
            seq.tokens.append(int(tokens[b][j]))
            seq.read_true.append(read_true[b])
        self.stats.passes += 1
        self.stats.positions_fed += B


def _read_feature(seq: _EagleSeq, j: int, into: torch.Tensor) -> bool:
    """Write the feature position j reads (the one at j - 1) into ``into``; whether it is a true
    one (position 0 reads zeros: nothing comes before it)."""
    if j == 0:
        return True
    if j - 1 < seq.m:
        into.copy_(seq.true[j - 1])
        return True
    into.copy_(seq.outputs[j - 1])  # only ever a pass's first position
    return False
