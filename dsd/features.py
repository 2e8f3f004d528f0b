"""The target's features on their way to a feature draft (dsd/backends/eagle_lm.py): what a
verdict carries, how it is packed for the wire, and the two abilities a model may declare.

A feature is the target's state at one position, one row of width d: its top layer's output, or
a fused projection of low, mid and top layers computed where the target runs. Row i of a
``FeatureBlock`` is the feature at sequence position ``start + i``. A verdict on a block that
starts at position s carries the rows s - 1 .. s + accepted - 1: the last committed token before
the block and every accepted draft token, the positions whose next token the verdict decided (the
bonus's predecessor included). A prefill carries rows 0 .. len(prompt) - 2.

Encoded, rows travel in one of FEATURE_DTYPES: bfloat16 (2 bytes a value), or int8 with one
float32 scale per row (max |x| / 127: 1 byte a value + 4 a row), after a 9-byte header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

FEATURE_DTYPES = ("bfloat16", "int8")
SCALE_BYTES = 4


def check_feature_dtype(value: str, name: str = "feature dtype") -> str:
    if value not in FEATURE_DTYPES:
        raise ValueError(f"{name} must be one of {FEATURE_DTYPES}, got {value!r}")
    return value


@dataclass(frozen=True)
class FeatureBlock:
    start: int  # sequence position of row 0
    values: torch.Tensor  # [rows, d]

    def __post_init__(self) -> None:
        if self.start < 0 or self.values.dim() != 2:
            raise ValueError(
                f"a FeatureBlock is rows [n, d] from a position >= 0, got start {self.start} "
                f"and shape {tuple(self.values.shape)}"
            )

    @property
    def end(self) -> int:
        return self.start + self.values.shape[0]


HEADER = struct.Struct("<IHHB")  # start, rows, width, dtype code
_CODES = {name: code for code, name in enumerate(FEATURE_DTYPES)}


def feature_bytes_per_row(width: int, dtype: str) -> int:
    """Payload bytes of one packed row (its values, and an int8 row's scale)."""
    check_feature_dtype(dtype)
    return 2 * width if dtype == "bfloat16" else width + SCALE_BYTES


def encoded_bytes(rows: int, width: int, dtype: str) -> int:
    """The size of ``encode``'s bytes for a block of rows x width."""
    return HEADER.size + rows * feature_bytes_per_row(width, dtype)


def encode(block: FeatureBlock, dtype: str) -> bytes:
    """A block as bytes: the header (start, rows, width, dtype), the rows row-major, then an int8
    block's per-row float32 scales; little-endian throughout."""
    check_feature_dtype(dtype)
    rows, width = block.values.shape
    if rows >= 1 << 16 or width >= 1 << 16 or block.start >= 1 << 32:
        raise ValueError(f"features: {rows} rows of width {width} from {block.start} do not fit the header")
    header = HEADER.pack(block.start, rows, width, _CODES[dtype])
    if dtype == "bfloat16":
        raw = block.values.to(torch.bfloat16).contiguous().view(torch.int16).numpy().astype("<i2")
        return header + raw.tobytes()
    values = block.values.float()
    scale = values.abs().amax(dim=-1).clamp(min=1e-12) / 127.0  # [rows]
    quantized = torch.round(values / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return header + quantized.numpy().tobytes() + scale.numpy().astype("<f4").tobytes()


def decode(data: bytes) -> tuple[FeatureBlock, str]:
    """-> (the block, float32 rows; its dtype on the wire); ValueError if the bytes do not fit."""
    if len(data) < HEADER.size:
        raise ValueError(f"features: {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    start, rows, width, code = HEADER.unpack_from(data)
    if code >= len(FEATURE_DTYPES) or width < 1:
        raise ValueError(f"features: dtype code {code}, width {width}")
    dtype = FEATURE_DTYPES[code]
    if len(data) != encoded_bytes(rows, width, dtype):
        raise ValueError(
            f"features: {len(data)} bytes for {rows} rows of width {width} in {dtype}, "
            f"expected {encoded_bytes(rows, width, dtype)}"
        )
    body = data[HEADER.size :]
    if dtype == "bfloat16":
        raw = np.frombuffer(body, dtype="<i2").astype(np.int16)
        values = torch.from_numpy(raw).view(torch.bfloat16).float()
    else:
        quantized = torch.from_numpy(np.frombuffer(body[: rows * width], dtype=np.int8).astype(np.float32))
        scale = torch.from_numpy(np.frombuffer(body[rows * width :], dtype="<f4").astype(np.float32))
        values = quantized.view(rows, width) * scale[:, None]
    return FeatureBlock(start, values.reshape(rows, width)), dtype


def round_trip(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """values [n, d] as the receiver sees them after encode and decode."""
    return decode(encode(FeatureBlock(0, values), dtype))[0].values


@runtime_checkable
class TakesFeatures(Protocol):
    """A draft that reads the target's features (the feature draft)."""

    def add_features(self, seq_id: str, block: FeatureBlock) -> None:
        """The target's features at block's positions of this sequence (they replace any the
        draft predicted there)."""


@runtime_checkable
class ProvidesFeatures(Protocol):
    """A target that keeps its features of every position it computed (the verifier's)."""

    def features(self, seq_id: str, start: int, end: int) -> FeatureBlock:
        """Rows start..end - 1 of this sequence, all computed by earlier passes."""


def hand_features(draft: object, seq_id: str, block: FeatureBlock | None) -> None:
    """Give the target's features to a draft that takes them; any other draft ignores them."""
    if block is not None and isinstance(draft, TakesFeatures):
        draft.add_features(seq_id, block)
