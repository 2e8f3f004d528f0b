"""A draft whose head covers part of the target's vocabulary (vocab_map.json in its folder).

Draft id i stands for target id ``kept[i]``; one more draft id, ``unknown_id``, stands for every
target token the draft dropped: it is a valid input (an embedding row) and never a proposal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

VOCAB_MAP = "vocab_map.json"


@dataclass(frozen=True)
class VocabMap:
    kept: list[int]
    target_vocab_size: int

    def __post_init__(self) -> None:
        if not self.kept or len(set(self.kept)) != len(self.kept):
            raise ValueError("VocabMap.kept must be non-empty target ids without repeats")
        if min(self.kept) < 0 or max(self.kept) >= self.target_vocab_size:
            raise ValueError(
                f"VocabMap.kept must lie in [0, {self.target_vocab_size}), got {min(self.kept)}..{max(self.kept)}"
            )

    @property
    def unknown_id(self) -> int:
        return len(self.kept)

    @cached_property
    def kept_tensor(self) -> torch.Tensor:
        return torch.tensor(self.kept, dtype=torch.long)

    def to_draft(self) -> torch.Tensor:
        """[target_vocab_size] long: each target id's draft id (unknown_id for dropped tokens)."""
        table = torch.full((self.target_vocab_size,), self.unknown_id, dtype=torch.long)
        table[self.kept_tensor] = torch.arange(len(self.kept))
        return table

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., >= K] draft logits -> [..., target_vocab_size], -inf where the draft cannot
        propose (its unknown row included)."""
        full = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        full[..., self.kept_tensor.to(logits.device)] = logits[..., : len(self.kept)]
        return full

    def save(self, folder: Path) -> None:
        (Path(folder) / VOCAB_MAP).write_text(
            json.dumps({"target_vocab_size": self.target_vocab_size, "kept_target_ids": self.kept}) + "\n"
        )

    @classmethod
    def load(cls, folder: Path | str) -> VocabMap | None:
        """The folder's map, or None for a model over the full vocabulary."""
        path = Path(folder) / VOCAB_MAP
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return cls(list(data["kept_target_ids"]), int(data["target_vocab_size"]))
