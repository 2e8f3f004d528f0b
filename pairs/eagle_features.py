"""The target's features over its own answers, the feature draft's training inputs: for every
answer (pairs.chat_data), the outputs of the target's chosen layers at every position of
prompt + answer[:-1], teacher-forced in one pass (bfloat16, as the verifier computes them).

Kept in a file per set of answers: ``features`` [positions, layers, d] bfloat16, and each
answer's row ``offsets`` into it (its rows are its sequence's positions 0..L-1).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from dsd.backends.feature_target import LayerTap
from pairs.chat_data import ChatSample
from pairs.common import log


@dataclass(frozen=True)
class FeatureSet:
    features: torch.Tensor  # [positions, layers, d] bfloat16
    offsets: torch.Tensor  # [answers + 1] long: answer i's rows are offsets[i]:offsets[i + 1]
    layers: tuple[int, ...]

    def of(self, index: int) -> torch.Tensor:
        """[L, layers, d]: answer index's sequence, position by position."""
        return self.features[self.offsets[index] : self.offsets[index + 1]]


def sequence(sample: ChatSample) -> list[int]:
    """What the target reads for a sample: the prompt and the answer but its last token."""
    return sample.prompt_ids + sample.answer_ids[:-1]


@torch.inference_mode()
def compute_features(target, samples: list[ChatSample], layers: tuple[int, ...], batch_size: int = 16) -> FeatureSet:
    """One teacher-forced pass per batch of similar-length answers, right-padded (a causal model's
    real positions never see the padding)."""
    seqs = [sequence(s) for s in samples]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    d = target.config.hidden_size
    per_sample: list[torch.Tensor | None] = [None] * len(seqs)
    tap = LayerTap(target, layers)
    try:
        for n, start in enumerate(range(0, len(order), batch_size)):
            batch = order[start : start + batch_size]
            width = max(len(seqs[i]) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
                mask[row, : len(seqs[i])] = 1
            target.model(input_ids=ids, attention_mask=mask)
            stacked = tap.stacked().to(torch.bfloat16)  # [B, width, layers, d]
            for row, i in enumerate(batch):
                per_sample[i] = stacked[row, : len(seqs[i])].clone()
            if n % 20 == 0:
                log(f"[features] {start + len(batch)}/{len(seqs)} answers")
    finally:
        tap.close()
    lengths = torch.tensor([len(s) for s in seqs])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    features = torch.cat(per_sample) if per_sample else torch.zeros(0, len(layers), d, dtype=torch.bfloat16)
    return FeatureSet(features, offsets, tuple(layers))


def cache_key(answers_key: str, layers: tuple[int, ...], dtype: str) -> str:
    return hashlib.sha256(repr((answers_key, tuple(layers), dtype)).encode()).hexdigest()[:16]


def save_features(feature_set: FeatureSet, path: Path) -> None:
    """Written to a temporary file, then renamed: a stop mid-write leaves no half file."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    torch.save(
        {"features": feature_set.features, "offsets": feature_set.offsets, "layers": list(feature_set.layers)},
        temporary,
    )
    temporary.replace(path)


def load_features(path: Path) -> FeatureSet:
    data = torch.load(path, weights_only=True)
    return FeatureSet(data["features"], data["offsets"], tuple(data["layers"]))


def cached_features(
    target,
    samples: list[ChatSample],
    layers: tuple[int, ...],
    cache: Path | None,
    answers_key: str,
    dtype: str,
    kept_layers: tuple[int, ...] = (),
) -> FeatureSet:
    """compute_features of ``layers``, read from (or kept in) ``cache`` under a key of the
    answers, the layers kept and the dtype. ``kept_layers``: compute and keep these too, so that
    the builds of drafts on other layers among them find their features here."""
    kept = tuple(sorted(set(layers) | set(kept_layers)))
    path = None if cache is None else Path(cache) / f"eagle-features-{cache_key(answers_key, kept, dtype)}.pt"
    if path is not None and path.is_file():
        log(f"[features] reusing {path}")
        feature_set = load_features(path)
        if len(feature_set.offsets) != len(samples) + 1:
            raise ValueError(
                f"{path}: features of {len(feature_set.offsets) - 1} answers, expected "
                f"{len(samples)}; delete it to compute them again"
            )
    else:
        feature_set = compute_features(target, samples, kept)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_features(feature_set, path)
    return select_layers(feature_set, layers)


def select_layers(feature_set: FeatureSet, layers: tuple[int, ...]) -> FeatureSet:
    if tuple(layers) == feature_set.layers:
        return feature_set
    index = [feature_set.layers.index(i) for i in layers]
    return FeatureSet(feature_set.features[:, index], feature_set.offsets, tuple(layers))
