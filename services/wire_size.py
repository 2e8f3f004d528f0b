"""Bytes a decoding round puts on the wire, predicted from (gamma, vocab, sampling): pure
arithmetic over the wire schema (services/wire.py) and msgpack's encoding, then WebSocket and
TCP/IP framing. What the closed form's serialisation term charges a rate-capped link.

A round is one Verify up (edge -> verifier) and one Verified down. What a Verify carries depends
on the sampling (`wire.probs_encoding`):

    none    greedy: gamma token ids
    dense   sampling without truncation: q as float32, gamma x vocab x 4 bytes
    sparse  top-k / top-p: per row the kept ids and their values (msgpack float64: 9 bytes each)

Assumptions (each off by a few bytes at most, named so a test can hold them to it): token ids
uniform over the vocabulary (msgpack spends 1, 2, 3 or 5 bytes on an id by its size); seq and
start_pos below 65,536 and session below 128; base_digest a full 64-bit digest; a sparse row keeps
top_k ids (top-p alone keeps a data-dependent number: the caller gives `kept_per_row`).
With a feature draft (`FeatureWire`) every Verified and Tokens also carries the target's features
at the positions the round decided (dsd.features: one row per emitted token, `feature_rows` a
round, the expected count where it varies); without one the field is an empty nil byte.
Framing: a WebSocket header (the edge's frames masked, as a client's must be), 52 bytes of IPv4 +
TCP (with timestamps) per segment of at most MSS_BYTES, and the reverse direction's pure ACKs
(one per two segments received, at least one per message), as counted in IP bytes by the shaper.
A rate cap delays a round by its data segments only (`acks=False`): a pure ACK leaves while the
other side computes its reply or next block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dsd.checks import is_int
from dsd.features import check_feature_dtype, encoded_bytes, feature_bytes_per_row
from services import wire

MSS_BYTES = 1448  # Ethernet MTU 1500 - IPv4 20 - TCP 20 - timestamps option 12
TCP_IP_HEADER_BYTES = 52  # on every segment and every pure ACK
FLOAT_BYTES = 9  # msgpack packs a Python float as float64
SMALL_INT_BYTES = 3  # seq, start_pos: uint16
DIGEST_BYTES = 9  # uint64
TIME_FIELDS = ("queue_s", "compute_s")


@dataclass(frozen=True)
class FeatureWire:
    """What a feature draft's rows are on the wire: d values a row, in a dsd.features dtype."""

    width: int
    dtype: str

    def __post_init__(self) -> None:
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"FeatureWire.width must be a whole number >= 1, got {self.width!r}")
        check_feature_dtype(self.dtype, "FeatureWire.dtype")

    def field_bytes(self, rows: float) -> float:
        """The msgpack size of a message's features field holding `rows` rows (bin header + bytes)."""
        n = encoded_bytes(0, self.width, self.dtype) + rows * feature_bytes_per_row(self.width, self.dtype)
        return n + bin_bytes(round(n)) - round(n)


def features_field_bytes(features: FeatureWire | None, rows: float) -> float:
    """The features field of a Verified or Tokens: nil (1 byte) without a feature draft."""
    return 1.0 if features is None else features.field_bytes(rows)


def uint_bytes(n: int) -> int:
    """msgpack's size of a non-negative int."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    return 1 if n < 128 else 2 if n < 256 else 3 if n < 65_536 else 5 if n < 2**32 else 9


def mean_id_bytes(vocab: int) -> float:
    """msgpack's mean size of a token id drawn uniformly from [0, vocab)."""
    edges = [(128, 1), (256, 2), (65_536, 3), (2**32, 5)]
    total, lo = 0.0, 0
    for hi, size in edges:
        total += max(0, min(hi, vocab) - lo) * size
        lo = hi
    return total / vocab


def header_bytes(n: int, small: int) -> int:
    """An array/str/bin header for n items: fix (1 byte, n < small) or 8/16/32-bit length."""
    return 1 if n < small else 3 if n < 65_536 else 5


def bin_bytes(n: int) -> int:
    return n + (2 if n < 256 else 3 if n < 65_536 else 5)


def _envelope_bytes(cls) -> int:
    """The map header, every key, "v" and the type's name: what a message spends besides values."""
    keys = ["v", "type", *(f.name for f in fields(cls))]
    name = cls.__name__
    return header_bytes(len(keys), 16) + sum(1 + len(k) for k in keys) + 1 + (1 + len(name))


def verify_bytes(
    gamma: int,
    vocab: int,
    temperature: float,
    top_k: int | None = None,
    top_p: float = 1.0,
    kept_per_row: float | None = None,
) -> float:
    """The msgpack size of one Verify with a gamma-token block (the expected size, see the module)."""
    _check_gamma_vocab(gamma, vocab)
    encoding = wire.probs_encoding(temperature, top_k, top_p)
    ids = mean_id_bytes(vocab)
    size = (
        _envelope_bytes(wire.Verify)
        + 2 * SMALL_INT_BYTES
        + 1
        + DIGEST_BYTES  # seq, start_pos, session
        + header_bytes(gamma, 16)
        + gamma * ids
    )  # draft_tokens
    if encoding == "dense":
        return size + bin_bytes(4 * gamma * vocab) + 2  # probs_ids, values nil
    if encoding == "sparse":
        kept = kept_per_row if kept_per_row is not None else _kept(vocab, top_k, top_p)
        rows = 2 * (header_bytes(gamma, 16) + gamma * header_bytes(round(kept), 16))
        return size + 1 + rows + gamma * kept * (ids + FLOAT_BYTES)  # probs_dense nil
    return size + 3  # three nils


def verified_bytes(vocab: int, gamma: int, features: FeatureWire | None = None, feature_rows: float = 0.0) -> float:
    """The msgpack size of one Verified (independent of the sampling: a verdict is a count and a
    token; with a feature draft, feature_rows rows)."""
    _check_gamma_vocab(gamma, vocab)
    return (
        _envelope_bytes(wire.Verified)
        + 2 * SMALL_INT_BYTES
        + 1
        + 2 * uint_bytes(gamma)  # seq, start_pos,
        + mean_id_bytes(vocab)
        + 1
        + len(TIME_FIELDS) * FLOAT_BYTES
        + 1  # session, counts, token, stale, batch
        + features_field_bytes(features, feature_rows)
    )


def tokens_bytes(n_tokens: int, vocab: int, gamma: int, features: FeatureWire | None = None) -> float:
    """The msgpack size of one Tokens (a round of a Generate: AR's one token, co-located SD's
    accepted + 1; with a feature draft, as many rows)."""
    _check_gamma_vocab(gamma, vocab)
    if not (is_int(n_tokens) and n_tokens >= 1):
        raise ValueError(f"n_tokens must be a whole number >= 1, got {n_tokens!r}")
    return (
        _envelope_bytes(wire.Tokens)
        + 2 * SMALL_INT_BYTES
        + 1
        + 2 * uint_bytes(gamma)  # seq, round, session
        + header_bytes(n_tokens, 16)
        + n_tokens * mean_id_bytes(vocab)
        + 1  # tokens, done
        + len(TIME_FIELDS) * FLOAT_BYTES
        + 1  # times, batch_size
        + features_field_bytes(features, n_tokens)
    )


def websocket_frame_bytes(payload_bytes: float, masked: bool) -> float:
    """A binary frame's header (RFC 6455: 2, 4 or 10 bytes, + 4 for a client's mask) + payload."""
    length = 0 if payload_bytes < 126 else 2 if payload_bytes < 65_536 else 8
    return payload_bytes + 2 + length + (4 if masked else 0)


def segments(frame_bytes: float) -> int:
    return max(1, math.ceil(frame_bytes / MSS_BYTES))


def round_wire_bytes(
    gamma: int,
    vocab: int,
    temperature: float,
    top_k: int | None = None,
    top_p: float = 1.0,
    kept_per_row: float | None = None,
    acks: bool = True,
    features: FeatureWire | None = None,
    feature_rows: float = 0.0,
) -> tuple[float, float]:
    """(up, down) IP bytes of one edge-drafted round (sync, pipelined): its Verify and Verified,
    framed, and each one's ACKs (acks=False: without them; a pure ACK leaves while the other side
    computes, off the round's critical path)."""
    return _on_the_wire(
        websocket_frame_bytes(verify_bytes(gamma, vocab, temperature, top_k, top_p, kept_per_row), masked=True),
        websocket_frame_bytes(verified_bytes(vocab, gamma, features, feature_rows), masked=False),
        acks,
    )


def stream_round_wire_bytes(
    n_tokens: int, vocab: int, gamma: int, acks: bool = True, features: FeatureWire | None = None
) -> tuple[float, float]:
    """(up, down) IP bytes of one round of a verifier-run request (ar, colocated): a Tokens
    message down, and its ACKs up."""
    return _on_the_wire(0.0, websocket_frame_bytes(tokens_bytes(n_tokens, vocab, gamma, features), masked=False), acks)


def _on_the_wire(up: float, down: float, acks: bool) -> tuple[float, float]:
    """Frames of `up` and `down` bytes as IP bytes each way: TCP/IP headers, and the ACKs."""
    up_segments, down_segments = (segments(up) if up else 0), (segments(down) if down else 0)
    acks_up, acks_down = (math.ceil(down_segments / 2), math.ceil(up_segments / 2)) if acks else (0, 0)
    return (
        up + TCP_IP_HEADER_BYTES * (up_segments + acks_up),
        down + TCP_IP_HEADER_BYTES * (down_segments + acks_down),
    )


def _kept(vocab: int, top_k: int | None, top_p: float) -> float:
    if top_k:
        return float(min(top_k, vocab))
    raise ValueError(
        f"kept_per_row: needed for top_p={top_p!r} without top_k (how many ids a nucleus "
        f"keeps depends on the drafter's distribution), got None"
    )


def _check_gamma_vocab(gamma: int, vocab: int) -> None:
    if not (is_int(gamma) and gamma >= 1):
        raise ValueError(f"gamma must be a whole number >= 1, got {gamma!r}")
    if not (is_int(vocab) and vocab >= 2):
        raise ValueError(f"vocab must be a whole number >= 2, got {vocab!r}")
