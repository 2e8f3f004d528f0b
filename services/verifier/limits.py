"""Admission and limits: ``VerifierLimits`` (global and per connection) and the field checks
that answer a malformed or out-of-range message with an Error naming the field."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsd.checks import is_int
from services import wire


INT63_MAX = (1 << 63) - 1
INFLIGHT = (wire.Open, wire.Verify, wire.Generate)  # what max_inflight_per_connection counts


@dataclass(frozen=True)
class VerifierLimits:
    max_sessions: int = 256  # open sessions, all connections together
    max_gamma: int = 32
    max_tokens_per_session: int = 4096  # prompt + max_new_tokens
    max_message_bytes: int = 1 << 20
    idle_timeout_s: float = 300.0  # a connection with nothing to do and no message
    # per connection (one client)
    max_sessions_per_connection: int = 64
    max_inflight_per_connection: int = 32  # Open, Verify, Generate queued or being served
    max_prompt_tokens: int = 2048
    max_tokens_per_connection: int = 65536  # prompt + max_new_tokens over its open sessions
    tcp_rto_max_ms: int = 0  # frames.cap_retransmission_backoff on every connection

    def __post_init__(self) -> None:
        for name in (
            "max_sessions",
            "max_gamma",
            "max_tokens_per_session",
            "max_message_bytes",
            "max_sessions_per_connection",
            "max_inflight_per_connection",
            "max_prompt_tokens",
            "max_tokens_per_connection",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if not (is_int(self.tcp_rto_max_ms) and self.tcp_rto_max_ms >= 0):
            raise ValueError(
                f"tcp_rto_max_ms must be a whole number >= 0 (0: the kernel's), got {self.tcp_rto_max_ms!r}"
            )
        if not (
            isinstance(self.idle_timeout_s, (int, float))
            and math.isfinite(self.idle_timeout_s)
            and self.idle_timeout_s > 0
        ):
            raise ValueError(f"idle_timeout_s must be a finite number > 0, got {self.idle_timeout_s!r}")


def _require(ok: bool, field_name: str, message: str, limit: str | None = None) -> None:
    if not ok:
        raise wire.WireError(wire.OUT_OF_RANGE, f"{field_name} {message}", field_name, limit=limit)


def _limit(ok: bool, field_name: str, limit: str, value: int, what: str) -> None:
    if not ok:
        raise wire.WireError(wire.LIMIT, f"{limit} {value}: {what}", field_name, limit=limit)


def _check_tokens(field_name: str, tokens: list[int], vocab: int) -> None:
    for i, token in enumerate(tokens):
        if not 0 <= token < vocab:
            raise wire.WireError(
                wire.OUT_OF_RANGE, f"{field_name}[{i}] = {token} is outside the vocabulary [0, {vocab})", field_name
            )


def _draft_probs(m: wire.Verify, vocab: int) -> torch.Tensor:
    """The draft's distributions q [gamma, vocab] from a Verify, checked. It runs between a
    block's arrival and its pass, where every torch call costs tens of microseconds after a model
    pass: the dense form is checked in two passes over q, the sparse one on the entries it set."""
    gamma = len(m.draft_tokens)
    if m.probs_dense is not None:
        _require(
            len(m.probs_dense) == gamma * vocab * 4,
            "probs_dense",
            f"must hold gamma*vocab float32 values ({gamma * vocab * 4} bytes), got {len(m.probs_dense)} bytes",
        )
        q = torch.frombuffer(bytearray(m.probs_dense), dtype=torch.float32).reshape(gamma, vocab)
        low, high = torch.aminmax(q)  # a NaN makes both NaN
        _require(bool(low >= 0) and bool(torch.isfinite(high)), "probs", "must be finite and non-negative")
        _require(bool((q.sum(dim=-1) > 0).all()), "probs", "every row must have a positive sum")
        drafted = q[torch.arange(gamma), torch.tensor(m.draft_tokens, dtype=torch.long)]  # [gamma]
        _require(bool((drafted > 0).all()), "probs", "a draft token must have q > 0: it was drawn from q")
        return q
    if m.probs_ids is None or m.probs_values is None:
        raise wire.WireError(
            wire.BAD_FIELD,
            "sampling needs the draft's probabilities: probs_dense, or probs_ids with probs_values",
            "probs_dense",
        )
    return _sparse_draft_probs(m.probs_ids, m.probs_values, m.draft_tokens, vocab)


def _sparse_draft_probs(
    probs_ids: list[list[int]], probs_values: list[list[float]], draft_tokens: list[int], vocab: int
) -> torch.Tensor:
    """q [gamma, vocab] from per-row ids and values, written in one indexed store and checked,
    in Python, on what it holds where it was written (float32; a repeated id: what the store
    left there); everywhere else it is zero: finite, non-negative, and a row's sum is positive
    exactly when one of its entries is."""
    gamma = len(draft_tokens)
    _require(
        len(probs_ids) == gamma and len(probs_values) == gamma,
        "probs_ids",
        f"must hold one row per draft token ({gamma})",
    )
    flat_index: list[int] = []  # row * vocab + id
    flat_values: list[float] = []
    for row, (ids, values) in enumerate(zip(probs_ids, probs_values)):
        _require(len(ids) == len(values), "probs_values", f"row {row}: as many values as ids")
        _check_tokens("probs_ids", ids, vocab)
        base = row * vocab
        flat_index += [base + token for token in ids]
        flat_values += values
    q = torch.zeros(gamma * vocab)  # [gamma * vocab]
    index = torch.tensor(flat_index, dtype=torch.long)  # [kept]
    q[index] = torch.tensor(flat_values, dtype=torch.float32)
    held = q[index].tolist()
    _require(all(0.0 <= value < math.inf for value in held), "probs", "must be finite and non-negative")
    positive = {at for at, value in zip(flat_index, held) if value > 0}
    _require(len({at // vocab for at in positive}) == gamma, "probs", "every row must have a positive sum")
    _require(
        all(row * vocab + token in positive for row, token in enumerate(draft_tokens)),
        "probs",
        "a draft token must have q > 0: it was drawn from q",
    )
    return q.view(gamma, vocab)
