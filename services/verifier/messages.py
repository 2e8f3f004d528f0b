"""A connection's messages: decoded, checked against the limits, dispatched to their session
(part of ``Verifier``, services/verifier/server.py)."""

from __future__ import annotations

import asyncio
import math
import time

import torch

from dsd.backends.protocol import SamplingParams
from dsd.features import FEATURE_DTYPES, ProvidesFeatures
from dsd.modes import get_mode, server_modes
from dsd.speculation.stopping import StopRule
from dsd.drive.verifier_session import VerifierSession
from services import wire
from services.verifier.connection import Connection, Served, _withdraw
from services.verifier.serving import VerifierServing
from services.verifier.limits import INFLIGHT, INT63_MAX, _check_tokens, _draft_probs, _limit, _require


class VerifierMessages(VerifierServing):
    """Admitting and dispatching messages; opening sessions."""

    async def _on_frame(self, conn: Connection, data: bytes, t_arrival_s: float, held_s: float = 0.0) -> None:
        """One frame; ``t_arrival_s`` (perf_counter) is when it was read, or when it arrived if a
        pass on the loop's thread held it unread for ``held_s``: its passes are ready then."""
        try:
            if len(data) > self.limits.max_message_bytes:
                raise self._too_large(len(data))
            message = wire.decode(data)
        except wire.WireError as error:
            await self._reply_error(conn, error)
            return
        try:
            await self._dispatch(conn, message, t_arrival_s, held_s)
        except wire.WireError as error:
            error.seq, error.session = message.seq, getattr(message, "session", None)
            await self._reply_error(conn, error)

    def _too_large(self, n_bytes: int) -> wire.WireError:
        return wire.WireError(
            wire.LIMIT,
            f"message of {n_bytes} bytes exceeds max_message_bytes {self.limits.max_message_bytes}",
            limit="max_message_bytes",
        )

    async def _dispatch(self, conn: Connection, message, t_arrival_s: float, held_s: float = 0.0) -> None:
        if isinstance(message, wire.Ping):  # held_s: the prober subtracts it from the round trip
            await conn.send(wire.Pong(message.seq, message.t_send_s, time.perf_counter(), held_s))
            return
        if held_s > 0 and isinstance(message, INFLIGHT):
            conn.overlapped = conn.overlapped or isinstance(message, wire.Verify)
            conn.held[message.seq] = t_arrival_s
        if isinstance(message, wire.Hello):
            await conn.send(self._welcome(message.seq))
        elif isinstance(message, wire.Open):
            self._open(conn, message, t_arrival_s)
        elif isinstance(message, (wire.Verify, wire.Generate, wire.Withdraw, wire.Close)):
            served = conn.sessions.get(message.session)
            if served is None:
                raise wire.WireError(
                    wire.UNKNOWN_SESSION, f"no open session {message.session} on this connection", "session"
                )
            if isinstance(message, wire.Withdraw):
                await conn.send(
                    wire.Withdrawn(message.seq, message.session, _withdraw(served, message.keep_through), held_s)
                )
                return
            q = self._check(served, message)
            if isinstance(message, wire.Close):
                del conn.sessions[message.session]  # the id is free again at once
            else:
                self._admit(conn)
            if isinstance(message, wire.Generate) and message.max_tokens is not None:
                # a hand-over's segment: acknowledged on arrival, off the queue (the edge's early RTT)
                await conn.send(wire.Queued(message.seq, message.session, held_s))
            if isinstance(message, wire.Verify) and conn.replied_s is not None:  # set only if polling
                conn.block_gaps.add(t_arrival_s - conn.replied_s)  # the edge's drafting, and the way
                conn.replied_s = None
                if self.selector is not None:
                    self.selector.cancel()
            if q is not None:  # read and checked once, here; its pass takes it (serving._verify)
                served.draft_probs[id(message)] = q
            if (
                isinstance(message, wire.Verify)
                and not served.busy
                and served.inbox.empty()
                and not served.closed
                and self._alone(served)
                and self.scheduler.runs_on_loop
            ):
                await self._serve_inline(served, message, t_arrival_s)
                return
            served.inbox.put_nowait((t_arrival_s, message))
        else:
            raise wire.WireError(wire.UNKNOWN_TYPE, f"{type(message).__name__} is a reply, not a request", "type")

    def _welcome(self, seq: int) -> wire.Welcome:
        return wire.Welcome(
            seq,
            wire.VERSION,
            self.target.name,
            self.draft.name,
            self.target.vocab_size,
            self.target.eos_token_id,
            self.limits.max_gamma,
            self.session_tokens(),
            self.limits.max_message_bytes,
        )

    def session_tokens(self) -> int:
        """The most tokens (prompt + max_new_tokens) a session may hold: the limit, or fewer when the
        target reads fewer positions than that and a block of max_gamma drafts past the last one."""
        positions = getattr(self.target, "max_positions", None)  # optional: a backend may not say
        if positions is None:
            return self.limits.max_tokens_per_session
        return max(0, min(self.limits.max_tokens_per_session, positions - self.limits.max_gamma))

    def _admit(self, conn: Connection) -> None:
        """Count one more request in flight on this connection, or refuse it as busy."""
        if conn.inflight >= self.limits.max_inflight_per_connection:
            raise wire.WireError(
                wire.BUSY,
                f"max_inflight_per_connection {self.limits.max_inflight_per_connection} "
                "requests are in flight on this connection; send it again after a reply",
                limit="max_inflight_per_connection",
            )
        conn.inflight += 1

    def _open(self, conn: Connection, m: wire.Open, t_arrival_s: float) -> None:
        self._check_open_session(conn, m)
        total = self._check_open_tokens(conn, m)
        self._check_open_sampling(m)
        sampling = SamplingParams(m.temperature, m.top_k, m.seed, m.top_p)
        stop = StopRule(m.max_new_tokens, self.target.eos_token_id if m.stop_at_eos else None)
        number = next(self._numbers)
        state = VerifierSession(self.target, f"v{number}", m.prompt, sampling, stop)
        self._admit(conn)
        served = Served(number, conn, m.session, state, total, feature_dtype=m.feature_dtype)
        conn.sessions[m.session] = served
        conn.sessions_live += 1
        conn.tokens_live += total
        self.sessions_open += 1
        self.counts["sessions"] += 1
        served.inbox.put_nowait((t_arrival_s, m))
        served.task = asyncio.create_task(self._serve(served), name=f"session-{number}")

    def _check_open_session(self, conn: Connection, m: wire.Open) -> None:
        limits = self.limits
        _require(0 <= m.session <= INT63_MAX, "session", f"must be in [0, 2^63), got {m.session}")
        if m.session in conn.sessions:
            raise wire.WireError(wire.DUPLICATE_SESSION, f"session {m.session} is already open", "session")
        _limit(
            self.sessions_open < limits.max_sessions,
            "session",
            "max_sessions",
            limits.max_sessions,
            "sessions are open",
        )
        _limit(
            conn.sessions_live < limits.max_sessions_per_connection,
            "session",
            "max_sessions_per_connection",
            limits.max_sessions_per_connection,
            "sessions are open on this connection",
        )

    def _check_open_tokens(self, conn: Connection, m: wire.Open) -> int:
        """The tokens the session asks to hold (prompt + max_new_tokens), within every limit."""
        limits = self.limits
        _require(len(m.prompt) >= 1, "prompt", "must hold at least one token")
        _limit(
            len(m.prompt) <= limits.max_prompt_tokens,
            "prompt",
            "max_prompt_tokens",
            limits.max_prompt_tokens,
            f"the prompt holds {len(m.prompt)} tokens",
        )
        _require(m.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {m.max_new_tokens}")
        total = len(m.prompt) + m.max_new_tokens
        _require(
            total <= limits.max_tokens_per_session,
            "max_new_tokens",
            f"prompt ({len(m.prompt)}) + max_new_tokens ({m.max_new_tokens}) exceeds "
            f"max_tokens_per_session {limits.max_tokens_per_session}",
            limit="max_tokens_per_session",
        )
        room, positions = self.session_tokens(), getattr(self.target, "max_positions", None)
        _require(
            total <= room,
            "max_new_tokens",
            f"prompt ({len(m.prompt)}) + max_new_tokens ({m.max_new_tokens}) exceeds the {room} tokens a "
            f"session can hold: the target {self.target.name!r} reads {positions} positions "
            f"and a block of up to max_gamma {limits.max_gamma} drafts goes past a session's last token",
            limit="max_tokens_per_session",
        )
        _limit(
            conn.tokens_live + total <= limits.max_tokens_per_connection,
            "max_new_tokens",
            "max_tokens_per_connection",
            limits.max_tokens_per_connection,
            f"tokens (prompt + max_new_tokens) for this connection's open sessions; they hold "
            f"{conn.tokens_live} and this one asks for {total}",
        )
        _check_tokens("prompt", m.prompt, self.target.vocab_size)
        return total

    def _check_open_sampling(self, m: wire.Open) -> None:
        vocab = self.target.vocab_size
        _require(
            math.isfinite(m.temperature) and m.temperature >= 0,
            "temperature",
            f"must be a finite number >= 0, got {m.temperature}",
        )
        _require(m.top_k is None or 1 <= m.top_k <= vocab, "top_k", f"must be in [1, {vocab}], got {m.top_k}")
        _require(0 <= m.seed <= INT63_MAX, "seed", f"must be in [0, 2^63), got {m.seed}")
        _require(math.isfinite(m.top_p) and 0 < m.top_p <= 1, "top_p", f"must be in (0, 1], got {m.top_p}")
        _require(
            m.feature_dtype is None or m.feature_dtype in FEATURE_DTYPES,
            "feature_dtype",
            f"must be one of {FEATURE_DTYPES} or absent, got {m.feature_dtype!r}",
        )
        _require(
            m.feature_dtype is None or isinstance(self.target, ProvidesFeatures),
            "feature_dtype",
            f"this verifier's target ({self.target.name}) keeps no features for a feature draft",
        )

    def _check(self, served: Served, m) -> torch.Tensor | None:
        """Field checks that need the session; order-dependent ones happen when it is served.
        A sampled Verify's draft distributions q [gamma, vocab], read in the checking, are returned."""
        limits, vocab = self.limits, self.target.vocab_size
        if isinstance(m, wire.Verify):
            gamma = len(m.draft_tokens)  # every round: the messages are built only to fail
            if not 1 <= gamma <= limits.max_gamma:
                _require(False, "draft_tokens", f"gamma must be in [1, {limits.max_gamma}], got {gamma}")
            _check_tokens("draft_tokens", m.draft_tokens, vocab)
            if not 0 <= m.start_pos <= limits.max_tokens_per_session:
                _require(False, "start_pos", f"must be in [0, {limits.max_tokens_per_session}], got {m.start_pos}")
            if not 0 <= m.base_digest <= wire.UINT64_MAX:
                _require(False, "base_digest", f"must be an unsigned 64-bit number, got {m.base_digest}")
            if not served.state.sampling.greedy:
                return _draft_probs(m, vocab)
        elif isinstance(m, wire.Generate):
            _require(m.mode in server_modes(), "mode", f"must be one of {server_modes()}, got {m.mode!r}")
            low = 1 if get_mode(m.mode).speculative else 0
            _require(
                low <= m.gamma <= limits.max_gamma,
                "gamma",
                f"must be in [{low}, {limits.max_gamma}] for {m.mode}, got {m.gamma}",
            )
            _require(
                m.max_tokens is None or 1 <= m.max_tokens <= limits.max_tokens_per_session,
                "max_tokens",
                f"must be in [1, {limits.max_tokens_per_session}] or absent, got {m.max_tokens}",
            )
        return None

    async def _reply_error(self, conn: Connection, error: wire.WireError) -> None:
        self.errors[error.code] += 1
        await conn.send(error.reply())
