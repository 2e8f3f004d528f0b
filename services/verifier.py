"""The verifier service (the cloud): the target, and the draft for co-located SD, behind /ws.

    python -m services.verifier --host 127.0.0.1 --port 8700 --backend-json '{"kind": "synthetic", "alpha": 0.8}' \\
        --profile-json '{"t_draft_edge_s": 0.004, ...}' [--max-batch 1 --batch-window-ms 0]

GET /health, GET /metrics (JSON), GET /ws (one WebSocket per edge client; services.wire messages;
services/README.md describes the interface). The same TCP port also takes the frame transport
(services/frames.py): the same messages as length-prefixed frames on a plain TCP connection.

A connection holds sessions, one per request. The messages of one session are served in order by
that session's own task; sessions run concurrently and meet in the scheduler, which owns the one
device. A malformed or out-of-range message is answered with an Error naming the field and
touches nothing else; a connection that closes (or idles out) frees its sessions.

A client is one connection (a shared token, services/access.py, admits members of the testbed
but does not tell them apart). Each connection has its own limits beside the global ones: open
sessions, requests in flight (queued or being served; one more is answered ``busy`` at once,
so the server keeps reading the socket and never buffers a backlog), prompt tokens, and the
tokens its open sessions may hold (prompt + max_new_tokens summed, a proxy for KV-cache bytes);
and the scheduler lets connections take turns, so one flooding client cannot starve another.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
from aiohttp import WSMsgType, web

from dsd.backends.factory import load_pair
from dsd.backends.protocol import LanguageModel, Proposal, SamplingParams
from dsd.drafting import DraftJob, begin_request
from dsd.modes import AR, NOWHERE, SERVER, get_mode, server_modes
from dsd.stopping import StopRule
from dsd.verifier_session import VerifierSession
from services import access, arrival, frames, spinwait, wire
from services.compute import add_backend_args, backend_from_args, freeze_startup_heap, make_device
from services.scheduler import PassTiming, Scheduler, SchedulerConfig

log = logging.getLogger("services.verifier")
INT63_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class VerifierLimits:
    max_sessions: int = 256               # open sessions, all connections together
    max_gamma: int = 32
    max_tokens_per_session: int = 4096    # prompt + max_new_tokens
    max_message_bytes: int = 1 << 20
    idle_timeout_s: float = 300.0         # a connection with nothing to do and no message
    # per connection (one client)
    max_sessions_per_connection: int = 64
    max_inflight_per_connection: int = 32     # Open, Verify, Generate queued or being served
    max_prompt_tokens: int = 2048
    max_tokens_per_connection: int = 65536    # prompt + max_new_tokens over its open sessions
    tcp_rto_max_ms: int = 0                   # frames.cap_retransmission_backoff on every connection

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_gamma", "max_tokens_per_session", "max_message_bytes",
                     "max_sessions_per_connection", "max_inflight_per_connection", "max_prompt_tokens",
                     "max_tokens_per_connection"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if not (isinstance(self.tcp_rto_max_ms, int) and not isinstance(self.tcp_rto_max_ms, bool)
                and self.tcp_rto_max_ms >= 0):
            raise ValueError(f"tcp_rto_max_ms must be a whole number >= 0 (0: the kernel's), got {self.tcp_rto_max_ms!r}")
        if not (isinstance(self.idle_timeout_s, (int, float)) and math.isfinite(self.idle_timeout_s)
                and self.idle_timeout_s > 0):
            raise ValueError(f"idle_timeout_s must be a finite number > 0, got {self.idle_timeout_s!r}")


@dataclass
class Served:
    """One session: the target's side of one request, and the queue of its messages."""
    number: int                     # unique in this process: the models' sequence id
    conn: "Connection"
    session: int                    # the client's id for it
    state: VerifierSession
    draft_generator: torch.Generator
    tokens: int                     # prompt + max_new_tokens: what it counts against its connection
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)    # (t_arrival_s, message or None)
    task: asyncio.Task | None = None      # kept here: the event loop holds tasks only weakly
    busy: bool = False
    closed: bool = False
    handover_generator: torch.Generator | None = None     # co-located hand-overs' draft (see _generate)

    @property
    def seq_id(self) -> str:
        return f"v{self.number}"


class Connection:
    def __init__(self, number: int, channel, transport: str = "ws") -> None:
        self.number = number
        # the WebSocket (aiohttp's) or a frames.FrameProtocol: both have .closed and send_bytes()
        self.channel = channel
        self.transport = transport
        self.sessions: dict[int, Served] = {}    # open, by the client's id
        self.sessions_live = 0                   # not yet freed (closing ones too)
        self.tokens_live = 0                     # their Served.tokens
        self.inflight = 0                        # INFLIGHT requests queued or being served
        self.watched = None                      # services.arrival's handle on its socket
        self.held_since_s: float | None = None   # bytes came in during a pass on the loop's thread
        self._unhold_due = False
        self.held: dict[int, float] = {}         # seq -> arrival of a request read late that way
        # A request came in during a pass on the loop's thread (a pipelined edge's next block):
        # its passes go to the device thread from then on, so that it is read when it arrives.
        self.overlapped = False
        # services.spinwait: when its last verdict went out, and the gaps to the next block
        self.replied_s: float | None = None
        self.block_gaps = spinwait.Gaps()
        self.last_message_s = 0.0                # loop.time() of its last frame (the frame transport's idle check)
        self.sending: set[asyncio.Task] = set()     # sends started by send_now that wait for the kernel

    @property
    def busy(self) -> bool:
        return any(s.busy or not s.inbox.empty() for s in self.sessions.values())

    def stamp(self) -> tuple[float, float]:
        """(t_arrival_s, held_s) of a frame just read. After a pass on the loop's thread, every
        frame read before the loop turns (one read from the socket: what came in during the pass)
        arrived when the first waiting byte did, and was held unread for held_s."""
        t_read_s = time.perf_counter()
        if self.held_since_s is None:
            return t_read_s, 0.0
        if not self._unhold_due:
            self._unhold_due = True
            asyncio.get_running_loop().call_soon(self._unhold)
        return self.held_since_s, t_read_s - self.held_since_s

    def _unhold(self) -> None:
        self.held_since_s, self._unhold_due = None, False

    async def send(self, message) -> None:
        await self.send_encoded(wire.encode(message))

    async def send_encoded(self, data: bytes) -> None:
        if self.channel.closed:
            return
        try:
            await self.channel.send_bytes(data)
        except (ConnectionError, RuntimeError):
            pass    # the client went away; its sessions are being dropped

    def send_now(self, data: bytes) -> None:
        """send_encoded from synchronous code (a reply written from inside its pass on the loop's
        thread): the bytes are written before this returns; a send that then waits for room in
        the kernel's buffer finishes in a task (held here: the loop holds tasks only weakly)."""
        task = frames.start_now(self.send_encoded(data))
        if task is not None:
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    def send_if_on_loop(self, data: bytes, on_loop: bool) -> bytes | None:
        """A pass's encoded reply (its prepare): after a pass on the loop's own thread sent at once,
        before the scheduler's bookkeeping (None: nothing left for the caller to send); else
        returned for the caller to send."""
        if not on_loop:
            return data
        self.send_now(data)
        return None


INFLIGHT = (wire.Open, wire.Verify, wire.Generate)     # what max_inflight_per_connection counts
_TEXT = object()        # a WebSocket text frame (the messages are binary)
VERIFIER_KEY = web.AppKey("verifier", object)


class Verifier:
    def __init__(self, draft: LanguageModel, target: LanguageModel, device, scheduler: Scheduler,
                 limits: VerifierLimits, backend_info: dict, token: str | None = None,
                 spin: spinwait.SpinConfig = spinwait.SpinConfig()) -> None:
        self.draft, self.target, self.device = draft, target, device
        self.spin = spin        # services.spinwait: the loop polls for a lone session's next block
        self.selector: spinwait.SpinSelector | None = None     # the serving loop's, if it polls
        self.scheduler = scheduler
        scheduler.after_loop_pass = self.after_loop_pass
        self.limits = limits
        self.token = token          # None: no authentication
        self.backend_info = backend_info
        self.started_s = time.perf_counter()
        self.sessions_open = 0
        self.counts: Counter[str] = Counter()     # connections, sessions, rounds by kind
        self.errors: Counter[str] = Counter()
        self._numbers = itertools.count(1)
        self._connections: dict[int, Connection] = {}

    # ---- HTTP ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/ws", self.websocket)
        app[VERIFIER_KEY] = self

        async def start(_app):
            self.selector = spinwait.selector_of()
            self.scheduler.start()

        async def stop(_app):
            await self.scheduler.stop()

        app.on_startup.append(start)
        app.on_cleanup.append(stop)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "role": "verifier", "target": self.target.name,
                                  "draft": self.draft.name})

    def _refusal(self, request: web.Request) -> web.Response | None:
        """401 with a structured body unless the request carries the token (or none is set)."""
        refused = access.refusal(request, self.token, log)
        if refused is not None:
            self.errors[wire.UNAUTHORIZED] += 1
        return refused

    async def metrics(self, request: web.Request) -> web.Response:
        if (refusal := self._refusal(request)) is not None:
            return refusal
        return web.json_response({
            "uptime_s": time.perf_counter() - self.started_s,
            "connections_open": len(self._connections),
            "connections_total": self.counts["connections"],
            "connections_by_transport": {t: self.counts[f"connections_{t}"] for t in frames.TRANSPORTS},
            "sessions_open": self.sessions_open,
            "sessions_total": self.counts["sessions"],
            "rounds": {k: self.counts[k] for k in ("verify", "stale", *server_modes())},
            "passes": dict(self.scheduler.passes),
            "passes_on_loop": self.scheduler.loop_passes,
            "verifies_inline": self.counts["inline"],
            "spin": self.selector.stats() if self.selector else asdict(self.spin),
            "batch_sizes": {str(b): n for b, n in sorted(self.scheduler.batch_sizes.items())},
            "busy_s": self.device.busy_s,
            "queued": self.scheduler.queued,
            "errors": dict(self.errors),
            "limits": asdict(self.limits),
            "token_required": self.token is not None,
            "scheduler": asdict(self.scheduler.config),
            "backend": self.backend_info,
        })

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        if (refusal := self._refusal(request)) is not None:
            return refusal        # before the upgrade: no connection, no state
        # aiohttp drops a connection whose frame exceeds its own limit; ours answers with an Error,
        # so aiohttp's is only the backstop against a frame far too large to read at all.
        ws = web.WebSocketResponse(max_msg_size=4 * self.limits.max_message_bytes)
        await ws.prepare(request)

        async def receive():
            msg = await ws.receive(timeout=self.limits.idle_timeout_s)
            if msg.type == WSMsgType.BINARY:
                return msg.data
            return _TEXT if msg.type == WSMsgType.TEXT else None    # None: close, error (beyond aiohttp's limit)

        try:
            await self._serve_connection(Connection(next(self._numbers), ws, "ws"), receive,
                                         request.transport.get_extra_info("socket") if request.transport else None)
        finally:
            await ws.close()
        return ws

    def frame_protocol(self) -> frames.FrameProtocol:
        """A connection to the TCP port that opened with frames.MAGIC (services/frames.py). Its
        first frame is the token, checked as the WebSocket upgrade's header is (refused before
        anything is allocated); then the same messages as on /ws, each handled from the moment
        it is read (frames.InlineRunner: in order, without a hop to a reader task)."""
        limit = self.limits.max_message_bytes
        conn: Connection | None = None
        loop = asyncio.get_running_loop()

        def on_error(exc: BaseException) -> None:
            log.error("frame connection failed", exc_info=exc)
            channel.abort(f"{type(exc).__name__}: {exc}")

        runner = frames.InlineRunner(on_error)

        def on_made(_channel) -> None:
            channel.timer = loop.call_later(self.limits.idle_timeout_s, channel.abort, "no token frame")

        def on_frame(_t_read_s: float, data) -> None:
            nonlocal conn
            if conn is None:
                channel.timer.cancel()
                conn = self._accept_frames(channel, data)
                return
            conn.last_message_s = loop.time()
            runner.submit(lambda: self._on_item(conn, data))

        def on_lost(_reason: str) -> None:
            channel.timer.cancel()
            runner.cancel()
            if conn is not None:
                self._close_connection(conn)

        channel = frames.FrameProtocol(limit, 4 * limit, on_frame, on_lost, on_made)
        return channel

    def _accept_frames(self, channel: frames.FrameProtocol, token) -> Connection | None:
        if isinstance(token, frames.Oversize) or not frames.token_matches(token, self.token):
            reason = "no token" if token == b"" else "wrong token"
            self.errors[wire.UNAUTHORIZED] += 1
            log.warning("refused a frame connection from %s: %s", channel.transport.get_extra_info("peername"),
                        reason)
            channel.write(wire.encode(wire.Error(None, None, wire.UNAUTHORIZED, "token",
                                                 f"{reason}: this verifier requires its token as the first frame")))
            # Half-close and read no more: closing with the client's next frames unread would send
            # a reset, which can destroy the Error before the client reads it.
            channel.closed, channel.close_reason = True, reason
            channel.transport.write_eof()
            asyncio.get_running_loop().call_later(5.0, channel.transport.abort)
            return None
        conn = Connection(next(self._numbers), channel, "tcp")
        self._open_connection(conn, channel.transport.get_extra_info("socket"))
        conn.last_message_s = asyncio.get_running_loop().time()
        self._watch_idle(conn, channel)
        return conn

    def _watch_idle(self, conn: Connection, channel: frames.FrameProtocol, due: float | None = None) -> None:
        """The frame connection's idle timeout, as the WebSocket's: a connection with no message
        for idle_timeout_s is told and closed, unless it has something to do (then it is looked
        at again idle_timeout_s later)."""
        loop = asyncio.get_running_loop()
        idle_s = self.limits.idle_timeout_s

        async def expire() -> None:
            await self._reply_error(conn, wire.WireError(wire.IDLE_TIMEOUT, f"no message for {idle_s} s"))
            channel.close("idle")

        def check() -> None:
            if channel.closed:
                return
            if loop.time() < conn.last_message_s + idle_s:
                self._watch_idle(conn, channel)
            elif conn.busy:
                self._watch_idle(conn, channel, loop.time() + idle_s)
            else:
                channel.task = loop.create_task(expire())

        channel.timer = loop.call_at(conn.last_message_s + idle_s if due is None else due, check)

    async def _on_item(self, conn: Connection, data) -> None:
        if isinstance(data, frames.Oversize):
            await self._reply_error(conn, self._too_large(data.n_bytes))
        else:
            await self._on_frame(conn, data, *conn.stamp())

    def _open_connection(self, conn: Connection, sock) -> None:
        frames.cap_retransmission_backoff(sock, self.limits.tcp_rto_max_ms)
        conn.watched = arrival.watch(sock)
        self._connections[conn.number] = conn
        self.counts["connections"] += 1
        self.counts[f"connections_{conn.transport}"] += 1

    def _close_connection(self, conn: Connection) -> None:
        self._drop(conn)
        if conn.watched is not None:
            conn.watched.close()
            conn.watched = None

    async def _serve_connection(self, conn: Connection, receive, sock) -> None:
        """One WebSocket connection: ``receive()`` gives the next frame's bytes (or _TEXT), None
        once it is closed, TimeoutError when idle."""
        self._open_connection(conn, sock)
        try:
            while True:
                try:
                    data = await receive()
                except TimeoutError:
                    if conn.busy:
                        continue
                    await self._reply_error(conn, wire.WireError(
                        wire.IDLE_TIMEOUT, f"no message for {self.limits.idle_timeout_s} s"))
                    break
                if data is None:
                    break
                if data is _TEXT:
                    await self._reply_error(conn, wire.WireError(
                        wire.MALFORMED, "text frame: messages are binary msgpack"))
                else:
                    await self._on_frame(conn, data, *conn.stamp())
        finally:
            self._close_connection(conn)

    # ---- messages --------------------------------------------------------------------------

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
        return wire.WireError(wire.LIMIT, f"message of {n_bytes} bytes exceeds max_message_bytes "
                              f"{self.limits.max_message_bytes}", limit="max_message_bytes")

    async def _dispatch(self, conn: Connection, message, t_arrival_s: float, held_s: float = 0.0) -> None:
        if isinstance(message, wire.Ping):      # held_s: the prober subtracts it from the round trip
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
                raise wire.WireError(wire.UNKNOWN_SESSION, f"no open session {message.session} "
                                     "on this connection", "session")
            if isinstance(message, wire.Withdraw):
                await conn.send(wire.Withdrawn(message.seq, message.session,
                                               _withdraw(served, message.keep_through), held_s))
                return
            self._check(served, message)
            if isinstance(message, wire.Close):
                del conn.sessions[message.session]   # the id is free again at once
            else:
                self._admit(conn)
            if isinstance(message, wire.Generate) and message.max_tokens is not None:
                # a hand-over's segment: acknowledged on arrival, off the queue (the edge's early RTT)
                await conn.send(wire.Queued(message.seq, message.session, held_s))
            if isinstance(message, wire.Verify) and conn.replied_s is not None:     # set only if polling
                conn.block_gaps.add(t_arrival_s - conn.replied_s)      # the edge's drafting, and the way
                conn.replied_s = None
                self.selector.cancel()
            if (isinstance(message, wire.Verify) and not served.busy and served.inbox.empty() and not served.closed
                    and self._alone(served) and self.scheduler.runs_on_loop):
                await self._serve_inline(served, message, t_arrival_s)
                return
            served.inbox.put_nowait((t_arrival_s, message))
        else:
            raise wire.WireError(wire.UNKNOWN_TYPE, f"{type(message).__name__} is a reply, "
                                 "not a request", "type")

    def _welcome(self, seq: int) -> wire.Welcome:
        return wire.Welcome(seq, wire.VERSION, self.target.name, self.draft.name, self.target.vocab_size,
                            self.target.eos_token_id, self.limits.max_gamma,
                            self.limits.max_tokens_per_session, self.limits.max_message_bytes)

    def _admit(self, conn: Connection) -> None:
        """Count one more request in flight on this connection, or refuse it as busy."""
        if conn.inflight >= self.limits.max_inflight_per_connection:
            raise wire.WireError(wire.BUSY, f"max_inflight_per_connection {self.limits.max_inflight_per_connection} "
                                 "requests are in flight on this connection; send it again after a reply",
                                 limit="max_inflight_per_connection")
        conn.inflight += 1

    def _open(self, conn: Connection, m: wire.Open, t_arrival_s: float) -> None:
        limits, vocab = self.limits, self.target.vocab_size
        _require(0 <= m.session <= INT63_MAX, "session", f"must be in [0, 2^63), got {m.session}")
        if m.session in conn.sessions:
            raise wire.WireError(wire.DUPLICATE_SESSION, f"session {m.session} is already open", "session")
        _limit(self.sessions_open < limits.max_sessions, "session", "max_sessions", limits.max_sessions,
               "sessions are open")
        _limit(conn.sessions_live < limits.max_sessions_per_connection, "session", "max_sessions_per_connection",
               limits.max_sessions_per_connection, "sessions are open on this connection")
        _require(len(m.prompt) >= 1, "prompt", "must hold at least one token")
        _limit(len(m.prompt) <= limits.max_prompt_tokens, "prompt", "max_prompt_tokens", limits.max_prompt_tokens,
               f"the prompt holds {len(m.prompt)} tokens")
        _require(m.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {m.max_new_tokens}")
        total = len(m.prompt) + m.max_new_tokens
        _require(total <= limits.max_tokens_per_session, "max_new_tokens",
                 f"prompt ({len(m.prompt)}) + max_new_tokens ({m.max_new_tokens}) exceeds "
                 f"max_tokens_per_session {limits.max_tokens_per_session}", limit="max_tokens_per_session")
        _limit(conn.tokens_live + total <= limits.max_tokens_per_connection, "max_new_tokens",
               "max_tokens_per_connection", limits.max_tokens_per_connection,
               f"tokens (prompt + max_new_tokens) for this connection's open sessions; they hold "
               f"{conn.tokens_live} and this one asks for {total}")
        _check_tokens("prompt", m.prompt, vocab)
        _require(math.isfinite(m.temperature) and m.temperature >= 0, "temperature",
                 f"must be a finite number >= 0, got {m.temperature}")
        _require(m.top_k is None or 1 <= m.top_k <= vocab, "top_k", f"must be in [1, {vocab}], got {m.top_k}")
        _require(0 <= m.seed <= INT63_MAX, "seed", f"must be in [0, 2^63), got {m.seed}")
        _require(math.isfinite(m.top_p) and 0 < m.top_p <= 1, "top_p", f"must be in (0, 1], got {m.top_p}")
        sampling = SamplingParams(m.temperature, m.top_k, m.seed, m.top_p)
        stop = StopRule(m.max_new_tokens, self.target.eos_token_id if m.stop_at_eos else None)
        number = next(self._numbers)
        state = VerifierSession(self.target, f"v{number}", m.prompt, sampling, stop)
        self._admit(conn)
        served = Served(number, conn, m.session, state, torch.Generator().manual_seed(m.seed + 1), total)
        conn.sessions[m.session] = served
        conn.sessions_live += 1
        conn.tokens_live += total
        self.sessions_open += 1
        self.counts["sessions"] += 1
        served.inbox.put_nowait((t_arrival_s, m))
        served.task = asyncio.create_task(self._serve(served), name=f"session-{number}")

    def _check(self, served: Served, m) -> None:
        """Field checks that need the session; order-dependent ones happen when it is served."""
        limits, vocab = self.limits, self.target.vocab_size
        if isinstance(m, wire.Verify):
            gamma = len(m.draft_tokens)       # every round: the messages are built only to fail
            if not 1 <= gamma <= limits.max_gamma:
                _require(False, "draft_tokens", f"gamma must be in [1, {limits.max_gamma}], got {gamma}")
            _check_tokens("draft_tokens", m.draft_tokens, vocab)
            if not 0 <= m.start_pos <= limits.max_tokens_per_session:
                _require(False, "start_pos", f"must be in [0, {limits.max_tokens_per_session}], got {m.start_pos}")
            if not 0 <= m.base_digest <= wire.UINT64_MAX:
                _require(False, "base_digest", f"must be an unsigned 64-bit number, got {m.base_digest}")
            if not served.state.sampling.greedy:
                _draft_probs(m, gamma, vocab)
        elif isinstance(m, wire.Generate):
            _require(m.mode in server_modes(), "mode", f"must be one of {server_modes()}, got {m.mode!r}")
            low = 1 if get_mode(m.mode).speculative else 0
            _require(low <= m.gamma <= limits.max_gamma, "gamma",
                     f"must be in [{low}, {limits.max_gamma}] for {m.mode}, got {m.gamma}")
            _require(m.max_tokens is None or 1 <= m.max_tokens <= limits.max_tokens_per_session, "max_tokens",
                     f"must be in [1, {limits.max_tokens_per_session}] or absent, got {m.max_tokens}")

    async def _reply_error(self, conn: Connection, error: wire.WireError) -> None:
        self.errors[error.code] += 1
        await conn.send(error.reply())

    # ---- one session -----------------------------------------------------------------------

    async def _serve(self, served: Served) -> None:
        try:
            while True:
                t_arrival_s, m = await served.inbox.get()
                if m is None or served.closed:
                    _settle(served.conn, m)
                    break
                if not await self._serve_one(served, m, t_arrival_s):
                    break
        finally:
            served.closed = True
            while not served.inbox.empty():       # requests it will never serve leave the count
                _settle(served.conn, served.inbox.get_nowait()[1])
            if served.conn.sessions.get(served.session) is served:
                del served.conn.sessions[served.session]
            self.target.release(served.seq_id)
            self.draft.release(served.seq_id)
            self.sessions_open -= 1
            served.conn.sessions_live -= 1
            served.conn.tokens_live -= served.tokens

    async def _serve_one(self, served: Served, m, t_arrival_s: float) -> bool:
        """One request of the session; False if the session ends with it (a Close, or a failure)."""
        served.busy = True
        try:
            if isinstance(m, wire.Open):
                await self._prefill(served, m, t_arrival_s)
            elif isinstance(m, wire.Verify):
                await self._verify(served, m, t_arrival_s)
            elif isinstance(m, wire.Generate):
                await self._generate(served, m, t_arrival_s)
            else:
                await served.conn.send(wire.Closed(m.seq, m.session, len(served.state.generated)))
                return False
        except wire.WireError as error:
            error.seq, error.session = m.seq, served.session
            await self._reply_error(served.conn, error)
        except Exception as exc:         # a bug or a model failure: end this session only
            log.exception("session %s failed", served.seq_id)
            await self._reply_error(served.conn, wire.WireError(
                wire.INTERNAL, f"{type(exc).__name__}: {exc}; session closed", None, m.seq, served.session))
            return False
        finally:
            served.busy = False
            _settle(served.conn, m)
        return True

    async def _serve_inline(self, served: Served, m: wire.Verify, t_arrival_s: float) -> None:
        """A Verify served by the connection's reader itself, not handed to the session's task:
        the hand-over is a queue put and a loop turn before the pass (0.03-0.1 ms a round here,
        all of it between the block's arrival and its verdict). Only for a session that is idle
        and alone (``_alone``): its task waits on an empty inbox, and the reader would read
        nothing during the pass anyway (it runs on the loop's thread). Same replies and errors as
        the task; a failure that ends the session hands the ending to its task."""
        self.counts["inline"] += 1
        if not await self._serve_one(served, m, t_arrival_s):
            served.closed = True
            served.inbox.put_nowait((time.perf_counter(), None))     # the task frees the session
            return
        if self.selector is not None:
            conn = served.conn
            conn.replied_s = time.perf_counter()
            expected_s = conn.block_gaps.expected_s()
            if expected_s is not None:
                self.selector.expect(conn.replied_s + expected_s)     # poll for the next block when it is due

    async def _prefill(self, served: Served, m: wire.Open, t_arrival_s: float) -> None:
        positions, timing = await self.scheduler.submit("prefill", len(m.prompt) - 1, served.state.prefill,
                                                     served.conn.number, t_arrival_s,
                                                     arrived_s=served.conn.held.get(m.seq))
        await served.conn.send(wire.Opened(m.seq, m.session, positions, timing.queue_s, timing.compute_s))

    async def _verify(self, served: Served, m: wire.Verify, t_arrival_s: float) -> None:
        state = served.state
        q = None if state.sampling.greedy else _draft_probs(m, len(m.draft_tokens), self.target.vocab_size)
        proposal = Proposal(m.start_pos, m.base_digest, tuple(m.draft_tokens), q)
        live = (not state.finished and m.start_pos == len(state.committed)
                and state.committed.matches(m.start_pos, m.base_digest))

        def reply(verdict, timing: PassTiming) -> bytes | None:
            """The verdict, encoded while the pass's modelled time runs; after a pass on the loop's
            own thread, sent at once (None), before the scheduler's bookkeeping."""
            data = wire.encode(wire.Verified(m.seq, m.session, verdict.start_pos, verdict.proposed,
                                             verdict.accepted, verdict.next_token, verdict.stale,
                                             timing.queue_s, timing.compute_s, timing.batch_size))
            return served.conn.send_if_on_loop(data, timing.on_loop)

        if live:
            data, _ = await self.scheduler.submit("verify", proposal.gamma, state.verify_job(proposal),
                                                  served.conn.number, t_arrival_s, reply, self._alone(served),
                                                  served.conn.held.get(m.seq))
        else:
            data = reply(state.verify(proposal), PassTiming(0.0, 0.0, 0))      # stale: no compute
        self.counts["verify" if live else "stale"] += 1
        if data is not None:
            await served.conn.send_encoded(data)

    async def _generate(self, served: Served, m: wire.Generate, t_arrival_s: float) -> None:
        """Passes back to back: each is ready when the one before it ended (the first, when the
        request arrived), so sending a round's tokens overlaps the next pass, as on a real server."""
        state = served.state
        round_index = 0
        ready_s, arrived_s = t_arrival_s, served.conn.held.get(m.seq)
        drafts = get_mode(m.mode).drafts
        generator = served.draft_generator
        if m.max_tokens is not None:
            # a hand-over: the edge drafted this request with seed + 1; the same stream here would
            # correlate these drafts with its earlier ones, and sampling would not be exact
            if served.handover_generator is None:
                served.handover_generator = torch.Generator().manual_seed(state.sampling.seed + 2)
            generator = served.handover_generator
        if drafts == SERVER:
            begin_request(self.draft, served.seq_id, state.committed.tokens, m.gamma)
        end = math.inf if m.max_tokens is None else len(state.committed) + m.max_tokens     # a hand-over's segment
        while not state.finished and not served.closed and len(state.committed) < end:
            reply = self._round_reply(served, m, round_index)
            if drafts == NOWHERE:
                data, timing = await self.scheduler.submit(AR, 1, state.ar_job(), served.conn.number, ready_s,
                                                           reply(None), self._alone(served), arrived_s)
            else:
                (drafted, q), drafting = await self.scheduler.submit("draft", m.gamma, DraftJob(
                    self.draft, served.seq_id, state.committed.tokens, m.gamma, state.sampling,
                    generator), served.conn.number, ready_s, on_loop=self._alone(served),
                    arrived_s=arrived_s)
                data, timing = await self.scheduler.submit(
                    "verify", m.gamma, state.verify_job(state.proposal_for(drafted, q)), served.conn.number,
                    drafting.end_s, reply(drafting), self._alone(served))
            ready_s, arrived_s = timing.end_s, None
            self.counts[m.mode] += 1
            if data is not None:
                await served.conn.send_encoded(data)
            if timing.on_loop:
                await asyncio.sleep(0)      # a loop turn: read what came in during the passes (a ping, a Close)
            round_index += 1
        if round_index == 0:      # nothing left to generate: still end the stream
            await served.conn.send(wire.Tokens(m.seq, m.session, 0, 0, 0, [], True, 0.0, 0.0, 0))

    @staticmethod
    def _round_reply(served: Served, m: wire.Generate, round_index: int):
        """For a Generate's round: ``reply(drafting)`` is the prepare of the round's last pass (its
        draft pass's timing, None for AR), which encodes the round's Tokens (the pass's times plus
        the draft's) and, after a pass on the loop's own thread, sends them at once (None)."""
        state, before = served.state, len(served.state.committed)

        def reply(drafting: PassTiming | None):
            def prepare(result, timing: PassTiming) -> bytes | None:
                queue_s, compute_s, proposed, accepted = timing.queue_s, timing.compute_s, 0, 0
                if drafting is not None:
                    queue_s, compute_s = queue_s + drafting.queue_s, compute_s + drafting.compute_s
                    proposed, accepted = m.gamma, result.accepted
                data = wire.encode(wire.Tokens(m.seq, m.session, round_index, proposed, accepted,
                                               state.committed.tokens[before:], state.finished,
                                               queue_s, compute_s, timing.batch_size))
                return served.conn.send_if_on_loop(data, timing.on_loop)
            return prepare

        return reply

    def _alone(self, served: Served) -> bool:
        """Whether this session's next pass may run on the loop's own thread (Scheduler.submit's
        on_loop; the scheduler also wants the device free and nothing queued), checked before
        every pass: no other session is open, and its connection has not sent a Verify during
        such a pass (a pipelined edge's next block; it would be read only after the pass).
        A Generate stream's client sends nothing while it runs but a Close or a ping, and a sync
        edge nothing while its block is verified. What does come in during the pass is stamped
        with when it arrived (after_loop_pass), and a ping's answer says how long it was held."""
        return self.sessions_open == 1 and not served.conn.overlapped

    def after_loop_pass(self, start_s: float) -> None:
        """Right after a pass on the loop's thread: note when what came in meanwhile arrived."""
        for conn in self._connections.values():
            if conn.held_since_s is None:
                conn.held_since_s = arrival.pending_since_s(conn.watched, start_s)

    def _drop(self, conn: Connection) -> None:
        """The client is gone: every session ends after its current pass and frees its caches."""
        self._connections.pop(conn.number, None)
        for served in conn.sessions.values():
            served.closed = True
            served.inbox.put_nowait((time.perf_counter(), None))
        conn.sessions.clear()


def _withdraw(served: Served, keep_through: int) -> list[int]:
    """Drop the session's queued hand-over segments (Generates with max_tokens; the one being
    served is not queued) asked after seq ``keep_through`` and return their seqs; everything else
    stays queued, in order."""
    kept, dropped = [], []
    while not served.inbox.empty():
        item = served.inbox.get_nowait()
        m = item[1]
        if isinstance(m, wire.Generate) and m.max_tokens is not None and m.seq > keep_through:
            dropped.append(m.seq)
            _settle(served.conn, m)
        else:
            kept.append(item)
    for item in kept:
        served.inbox.put_nowait(item)
    return dropped


def _settle(conn: Connection, m) -> None:
    """A request counted by _admit is done (answered, or never to be served)."""
    if isinstance(m, INFLIGHT):
        conn.inflight -= 1
        conn.held.pop(m.seq, None)


def _require(ok: bool, field_name: str, message: str, limit: str | None = None) -> None:
    if not ok:
        raise wire.WireError(wire.OUT_OF_RANGE, f"{field_name} {message}", field_name, limit=limit)


def _limit(ok: bool, field_name: str, limit: str, value: int, what: str) -> None:
    if not ok:
        raise wire.WireError(wire.LIMIT, f"{limit} {value}: {what}", field_name, limit=limit)


def _check_tokens(field_name: str, tokens: list[int], vocab: int) -> None:
    for i, token in enumerate(tokens):
        if not 0 <= token < vocab:
            raise wire.WireError(wire.OUT_OF_RANGE, f"{field_name}[{i}] = {token} is outside the "
                                 f"vocabulary [0, {vocab})", field_name)


def _draft_probs(m: wire.Verify, gamma: int, vocab: int) -> torch.Tensor:
    """The draft's distributions q [gamma, vocab] from a Verify, checked."""
    if m.probs_dense is not None:
        _require(len(m.probs_dense) == gamma * vocab * 4, "probs_dense",
                 f"must hold gamma*vocab float32 values ({gamma * vocab * 4} bytes), got {len(m.probs_dense)} bytes")
        q = torch.frombuffer(bytearray(m.probs_dense), dtype=torch.float32).reshape(gamma, vocab)
    elif m.probs_ids is not None and m.probs_values is not None:
        _require(len(m.probs_ids) == gamma and len(m.probs_values) == gamma, "probs_ids",
                 f"must hold one row per draft token ({gamma})")
        q = torch.zeros(gamma, vocab)                                 # [gamma, vocab]
        for row, (ids, values) in enumerate(zip(m.probs_ids, m.probs_values)):
            _require(len(ids) == len(values), "probs_values", f"row {row}: as many values as ids")
            _check_tokens("probs_ids", ids, vocab)
            q[row, torch.tensor(ids, dtype=torch.long)] = torch.tensor(values, dtype=torch.float32)
    else:
        raise wire.WireError(wire.BAD_FIELD, "sampling needs the draft's probabilities: probs_dense, "
                             "or probs_ids with probs_values", "probs_dense")
    _require(bool(torch.isfinite(q).all()) and bool((q >= 0).all()), "probs",
             "must be finite and non-negative")
    _require(bool((q.sum(dim=-1) > 0).all()), "probs", "every row must have a positive sum")
    drafted = q[torch.arange(gamma), torch.tensor(m.draft_tokens, dtype=torch.long)]   # [gamma]
    _require(bool((drafted > 0).all()), "probs", "a draft token must have q > 0: it was drawn from q")
    return q


def main(argv: list[str] | None = None) -> None:
    app, args = build(argv)
    freeze_startup_heap()
    # A Unix socket as well, for an orchestrator outside this process's network namespace.
    # The TCP port serves HTTP (/ws among it) and the frame transport (services/frames.py).
    frames.run_app(app, args.host, args.port, args.unix_socket or None, app[VERIFIER_KEY].frame_protocol,
                   spinwait.new_event_loop(args.spin))


def build(argv: list[str] | None = None) -> tuple[web.Application, argparse.Namespace]:
    """The command line -> the verifier's app, its backend loaded (what main serves)."""
    parser = argparse.ArgumentParser(prog="python -m services.verifier", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1",
                        help="listen address: 127.0.0.1 or the testbed address (see --allow-any-host)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix-socket", default="", help="also serve HTTP on this Unix socket path")
    add_backend_args(parser)
    access.add_access_args(parser)
    spinwait.add_spin_args(parser)
    limits_defaults = VerifierLimits()
    parser.add_argument("--max-batch", type=int, default=1)
    parser.add_argument("--batch-window-ms", type=float, default=0.0)
    parser.add_argument("--max-sessions", type=int, default=limits_defaults.max_sessions)
    parser.add_argument("--max-gamma", type=int, default=limits_defaults.max_gamma)
    parser.add_argument("--max-tokens-per-session", type=int, default=limits_defaults.max_tokens_per_session)
    parser.add_argument("--max-message-bytes", type=int, default=limits_defaults.max_message_bytes)
    parser.add_argument("--idle-timeout-s", type=float, default=limits_defaults.idle_timeout_s)
    parser.add_argument("--tcp-rto-max-ms", type=int, default=limits_defaults.tcp_rto_max_ms,
                        help="cap TCP's retransmission backoff per connection (0: the kernel's; Linux >= 6.15)")
    for name in ("max_sessions_per_connection", "max_inflight_per_connection", "max_prompt_tokens",
                 "max_tokens_per_connection"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(limits_defaults, name))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    try:
        backend, profile = backend_from_args(args)
        limits = VerifierLimits(args.max_sessions, args.max_gamma, args.max_tokens_per_session,
                                args.max_message_bytes, args.idle_timeout_s, args.max_sessions_per_connection,
                                args.max_inflight_per_connection, args.max_prompt_tokens,
                                args.max_tokens_per_connection, tcp_rto_max_ms=args.tcp_rto_max_ms)
        scheduler_config = SchedulerConfig(args.max_batch, args.batch_window_ms)
        token = access.load_token(args.token_file, log=log)
        args.spin = spinwait.spin_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    access.check_host(args.host, args.allow_any_host, log)
    draft, target = load_pair(backend)
    device = make_device(backend)
    backend_info = {"kind": backend.kind, "target": target.name, "draft": draft.name,
                    "profile": asdict(profile) if profile else None}
    verifier = Verifier(draft, target, device, Scheduler(scheduler_config, device, profile), limits, backend_info,
                        token, args.spin)
    log.info("verifier on %s:%s backend=%s token=%s limits=%s scheduler=%s spin=%s", args.host, args.port,
             backend.kind, "required" if token else "none", json.dumps(asdict(limits)),
             json.dumps(asdict(scheduler_config)), json.dumps(asdict(args.spin)))
    return verifier.app(), args


if __name__ == "__main__":
    main()
