"""The edge service (the device): the draft, an HTTP API for the orchestrator, and the client of
every mode, so that all four are measured from the same place over the same link.

    python -m services.edge --host 127.0.0.1 --port 8701 --backend-json '{"kind": "synthetic"}' --profile-json '{...}'

    POST /runs                 start a run (JSON, RunConfig's fields); 201, or 400 naming the field
    GET  /runs/{id}            status ("running", "done", "failed"), progress, error
    GET  /runs/{id}/rounds.csv, /runs/{id}/requests.csv    the traces so far (services.traces)
    GET  /health

A run is one client: one WebSocket to the verifier and its prompts one after another. In sync and
pipelined DSD this process drafts (``dsd.edge.EdgeDecoder`` on a real clock: one draft step at a
time, handling verdicts between steps and abandoning a draft whose epoch has passed; an emulated
block with no block in flight, which no verdict can cut short, is charged in one wait); for cloud
AR and co-located SD it asks the verifier to generate and records the streamed rounds. Each run
drafts on its own emulated device (every client is its own device); with real models the runs of
one process share one worker thread (NOTE: so concurrent real-model clients in one edge process
slow each other's drafting; start one edge process per client to avoid it).

The link is measured with application-level pings on the same WebSocket, before and during a
run; ``app_delay_ms`` delays every message in each direction (for hosts whose link cannot be
shaped), in order, and is recorded in every row.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import re
import sys
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import aiohttp
import torch
import yarl
from aiohttp import web

from dsd.backends.factory import SyntheticBackendConfig, load_pair
from dsd.backends.protocol import LanguageModel, SamplingParams, Verdict
from dsd.control import CONTROLLERS, ControllerConfig, RequestObservation, check_decision, make_controller, shadow_matches
from dsd.driver import Arrival, DsdDriver, Round, ServerRound
from dsd.modes import SYNC, edge_modes, get_mode
from dsd.stopping import StopRule
from services import access, frames, spinwait, wire
from services.link import LinkControl
from services.compute import (EmulatedDevice, PreciseTimer, ThreadDevice, add_backend_args, backend_from_args,
                              freeze_startup_heap)
from services.traces import EdgeClock, RequestRow, RoundRow, TraceWriter, steady_per_token_s

log = logging.getLogger("services.edge")
MAX_RECEIVE_BYTES = 64 << 20       # the largest message this client takes from the verifier
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class RunConfig:
    run_id: str
    client_id: str
    mode: str
    gamma: int
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int
    verifier_url: str
    max_in_flight: int = 1
    seed: int = 0
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    app_delay_ms: float = 0.0
    stop_at_eos: bool = True
    probe_count: int = 5              # RTT probes before the run
    probe_interval_ms: float = 500.0  # and one every so often during it
    request_timeout_s: float = 600.0  # a request not done by then fails the run (a hung service)
    # 0 = none; else a request not done this long after its start is given up as a real client
    # would: its row says why (gave_up), its session is closed, and the run goes on with the next
    request_deadline_s: float = 0.0
    # cap TCP's retransmission backoff on the link (frames.cap_retransmission_backoff): after an
    # outage the request resumes within this of the link's return; 0 = the kernel's backoff
    tcp_rto_max_ms: int = 0
    controller: str = "static"        # dsd.control: who picks each round's gamma and mode
    gamma_max: int = 16               # the largest gamma a controller may pick
    # what an adaptive controller may pick per request (ar/colocated: the request runs on the
    # server) and per round (sync/pipelined)
    controller_modes: tuple[str, ...] = edge_modes()
    # how the per-round messages travel (services/frames.py): "ws", the verifier's /ws WebSocket,
    # or "tcp", length-prefixed frames on a plain TCP connection to the same port
    transport: str = frames.DEFAULT_TRANSPORT

    def __post_init__(self) -> None:
        if not (isinstance(self.run_id, str) and _RUN_ID.fullmatch(self.run_id)):
            raise ValueError(f"run_id must be 1-128 of [A-Za-z0-9._-] (it names a folder), got {self.run_id!r}")
        if not isinstance(self.client_id, str) or not self.client_id:
            raise ValueError(f"client_id must be a non-empty string, got {self.client_id!r}")
        get_mode(self.mode)                 # dsd/modes.py: a ValueError naming the known modes
        for name, low in (("gamma", 1), ("max_new_tokens", 1), ("max_in_flight", 1), ("seed", 0),
                          ("probe_count", 0), ("tcp_rto_max_ms", 0)):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise ValueError(f"top_k must be a whole number >= 1 or null, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        object.__setattr__(self, "top_p", float(self.top_p))
        for name, low in (("temperature", 0.0), ("app_delay_ms", 0.0), ("probe_interval_ms", 1.0),
                          ("request_timeout_s", 0.001), ("request_deadline_s", 0.0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value) and value >= low):
                raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
            object.__setattr__(self, name, float(value))      # JSON may say 15 for 15.0
        if not isinstance(self.stop_at_eos, bool):
            raise ValueError(f"stop_at_eos must be true or false, got {self.stop_at_eos!r}")
        if not self.prompts or not all(
                isinstance(p, tuple) and p and all(isinstance(t, int) and t >= 0 for t in p) for p in self.prompts):
            raise ValueError("prompts must be a non-empty list of non-empty lists of token ids >= 0")
        if not re.match(r"(ws|wss|http|https)://", str(self.verifier_url)):
            raise ValueError(f"verifier_url must be a ws:// or http:// URL, got {self.verifier_url!r}")
        frames.check_transport(self.transport)
        if self.controller not in CONTROLLERS:
            raise ValueError(f"controller must be one of {CONTROLLERS}, got {self.controller!r}")
        if self.controller != "static" and self.mode not in edge_modes():
            raise ValueError(f"controller {self.controller!r} needs mode sync or pipelined (the edge drafts), "
                             f"got {self.mode!r}")
        if isinstance(self.controller_modes, list):
            object.__setattr__(self, "controller_modes", tuple(self.controller_modes))
        self.controller_config()            # gamma_max, controller_modes: checked there

    def controller_config(self) -> ControllerConfig:
        return ControllerConfig(self.controller, self.gamma, self.mode if self.mode in edge_modes()
                                else SYNC, self.gamma_max, self.controller_modes)

    @classmethod
    def from_json(cls, body) -> "RunConfig":
        if not isinstance(body, dict):
            raise ValueError(f"a run is a JSON object, got {type(body).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - names)
        if unknown:
            raise ValueError(f"unknown fields {unknown}; known: {sorted(names)}")
        missing = [f.name for f in fields(cls) if f.name not in body and f.default is MISSING]
        if missing:
            raise ValueError(f"missing fields {missing}")
        values = dict(body)
        if isinstance(values.get("prompts"), list):
            values["prompts"] = tuple(tuple(p) if isinstance(p, list) else p for p in values["prompts"])
        return cls(**values)

    @property
    def ws_url(self) -> str:
        return ws_url(self.verifier_url)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.seed, self.top_p)


class RunError(RuntimeError):
    pass


def ws_url(verifier_url: str) -> str:
    """The verifier's WebSocket URL from http://host:port or ws://host:port[/ws]."""
    url = re.sub(r"^http", "ws", verifier_url)
    return url if url.rstrip("/").endswith("/ws") else url.rstrip("/") + "/ws"


# ---- the link to the verifier ----------------------------------------------------------------

def probe_for_request_s(probe_ms: float | None, probe_sent_s: float | None,
                        previous_end_s: float | None) -> float | None:
    """The RTT (s) a request is decided on: the last periodic probe, if it was sent after the
    previous request's last arrival; else None (the controller's running estimate, whose latest
    samples are that request's own round trips, which a probe sent before them cannot be newer
    than: a probe sent while a fallen link's old packets drained read 106 ms on a 10 ms link and
    sent the next request to cloud AR)."""
    if probe_ms is None:
        return None
    if previous_end_s is not None and (probe_sent_s is None or probe_sent_s < previous_end_s):
        return None
    return probe_ms / 1e3


class VerifierLink:
    """One connection to the verifier (its WebSocket, or a frame connection: ``transport``):
    replies routed to their session (or to the request that waits for them), each direction
    delayed by ``delay_s`` in order, RTT probes."""

    def __init__(self, url: str, delay_s: float, timer: PreciseTimer, token: str | None = None,
                 transport: str = "ws") -> None:
        self.url = url
        self.transport = frames.check_transport(transport)
        self._frames: frames.FrameProtocol | None = None
        self.token = token
        self.delay_s = delay_s
        self.timer = timer
        self.rtt_probe_ms: float | None = None
        self.rtt_probe_sent_s: float | None = None     # perf_counter when that probe was sent
        self.welcome: wire.Welcome | None = None
        self._seqs = itertools.count(1)
        self._session_ids = itertools.count(1)
        self._inboxes: dict[int, asyncio.Queue] = {}
        self._abandoned: set[int] = set()     # sessions given up: what still comes for them is dropped
        self._waiting: dict[int, asyncio.Future] = {}
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._incoming: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._http: aiohttp.ClientSession | None = None
        self._ws = None
        self.closed_reason: str | None = None
        self.rto_max_ms = 0                    # RunConfig.tcp_rto_max_ms
        # services.spinwait: how long a block's verdict took lately, and whether this link's run
        # is the only one of the process (only then may the loop poll for the verdict)
        self.verdict_gaps = spinwait.Gaps()
        self.alone = lambda: False
        # and whether the verifier served another client lately: a verdict that waited in its
        # queue or shared its pass (then its timing is not ours to predict, and polling would
        # take CPU from the other clients on a small host: -15% token rate at 2 clients here)
        self.verdicts_shared: list[bool] = []

    def shared_lately(self) -> bool:
        return any(self.verdicts_shared)

    def note_verdict(self, queue_s: float, batch_size: int) -> None:
        self.verdicts_shared = (self.verdicts_shared + [queue_s > 1e-4 or batch_size > 1])[-self.verdict_gaps.keep:]

    async def connect(self, client_id: str, timeout_s: float = 30.0) -> wire.Welcome:
        if self.transport == "tcp":
            url = yarl.URL(self.url)
            try:
                self._frames = await asyncio.wait_for(frames.open_connection(
                    url.host, url.port, self.token, MAX_RECEIVE_BYTES, self._on_frame, self._fail), timeout_s)
            except OSError as exc:
                raise RunError(f"cannot connect to the verifier's data port {url.host}:{url.port}: {exc}") from None
        else:
            self._http = aiohttp.ClientSession()
            try:
                self._ws = await asyncio.wait_for(self._http.ws_connect(
                    self.url, max_msg_size=MAX_RECEIVE_BYTES, headers=access.bearer_header(self.token)), timeout_s)
            except aiohttp.WSServerHandshakeError as exc:
                raise RunError(f"verifier refused the connection: HTTP {exc.status} {exc.message}"
                               f"{' (token sent)' if self.token else ' (no token)'}") from None
            self._tasks = [asyncio.create_task(self._read())]
        frames.cap_retransmission_backoff(
            self._ws.get_extra_info("socket") if self._ws is not None else self._frames.transport.get_extra_info("socket"),
            self.rto_max_ms)
        if self.delay_s > 0:
            self._tasks += [asyncio.create_task(self._release_outgoing()),
                            asyncio.create_task(self._release_incoming())]
        token_note = (" (token sent)" if self.token else " (no token)") if self._frames else ""
        try:
            _, welcome = await asyncio.wait_for(self.request(wire.Hello(self.next_seq(), client_id)), timeout_s)
        except RunError:      # a frame connection's refusal may close the link before the Hello goes out
            raise RunError(f"verifier refused the connection: {self.closed_reason}{token_note}") from None
        if isinstance(welcome, wire.Error):
            raise RunError(f"verifier refused the connection: {welcome.code}: {welcome.message}{token_note}")
        self.welcome = welcome
        return welcome

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ws is not None:
            await self._ws.close()
        if self._frames is not None:
            self._frames.close()
        if self._http is not None:
            await self._http.close()

    def next_seq(self) -> int:
        return next(self._seqs)

    def open_inbox(self) -> tuple[int, asyncio.Queue]:
        session = next(self._session_ids)
        self._inboxes[session] = asyncio.Queue()
        return session, self._inboxes[session]

    def close_inbox(self, session: int) -> None:
        self._inboxes.pop(session, None)

    async def abandon(self, session: int) -> None:
        """Give a session up: drop its inbox and what still comes for it, and ask the verifier to
        close it without waiting for the answer (the link may be down: then the verifier frees it
        when the connection ends)."""
        self.close_inbox(session)
        self._abandoned.add(session)
        if not self.closed_reason:
            await self.send(wire.Close(self.next_seq(), session))

    @property
    def awaiting_reply(self) -> bool:
        """A request (a ping) waits for its reply, which may come at any moment."""
        return bool(self._waiting)

    async def send(self, message) -> float:
        """Send (after the app delay); returns when the application handed it over."""
        return await self.send_encoded(wire.encode(message))

    async def send_encoded(self, data: bytes) -> float:
        if self.closed_reason:
            # the code a waiting session is handed too (_fail): either may see the drop first
            raise RunError(f"verifier error {wire.LINK_DOWN} (link to the verifier is down): {self.closed_reason}")
        t_send_s = time.perf_counter()
        if self.delay_s > 0:
            self._outgoing.put_nowait((t_send_s + self.delay_s, data))
        elif self._frames is not None:
            await self._frames.send(data)
        else:
            await self._ws.send_bytes(data)
        return t_send_s

    async def request(self, message) -> tuple[float, object]:
        """Send a message whose reply carries its seq and no session; returns (t_receive, reply)."""
        future = asyncio.get_running_loop().create_future()
        self._waiting[message.seq] = future
        try:
            await self.send(message)
            return await future
        finally:
            self._waiting.pop(message.seq, None)

    async def probe_ms(self) -> float:
        t_receive_s, pong = await self.request(wire.Ping(self.next_seq(), time.perf_counter()))
        self.rtt_probe_ms = (t_receive_s - pong.t_send_s - pong.held_s) * 1000
        self.rtt_probe_sent_s = pong.t_send_s
        return self.rtt_probe_ms

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                t_receive_s = time.perf_counter()
                if self.delay_s > 0:
                    self._incoming.put_nowait((t_receive_s + self.delay_s, msg.data))
                else:
                    self._deliver(t_receive_s, msg.data)
            self._fail(f"connection closed (code {self._ws.close_code})")
        except Exception as exc:        # anything that ends the reader ends the link
            self._fail(f"{type(exc).__name__}: {exc}")

    def _on_frame(self, t_receive_s: float, data) -> None:
        """A frame as the frame connection reads it (no reader task: straight from the socket)."""
        try:
            if isinstance(data, frames.Oversize):
                raise RunError(f"a message of {data.n_bytes} bytes from the verifier exceeds this client's "
                               f"limit of {MAX_RECEIVE_BYTES} bytes")
            if self.delay_s > 0:
                self._incoming.put_nowait((t_receive_s + self.delay_s, data))
            else:
                self._deliver(t_receive_s, data)
        except Exception as exc:        # as in _read: anything that ends the reader ends the link
            self._fail(f"{type(exc).__name__}: {exc}")
            self._frames.abort(self.closed_reason)

    def _deliver(self, t_receive_s: float, data: bytes) -> None:
        message = wire.decode(data)
        session = getattr(message, "session", None)
        if session is not None and session in self._inboxes:
            self._inboxes[session].put_nowait((t_receive_s, message))
        elif session is not None and session in self._abandoned:
            pass
        elif message.seq in self._waiting:
            if not self._waiting[message.seq].done():      # its waiter may have been cancelled
                self._waiting[message.seq].set_result((t_receive_s, message))
        elif isinstance(message, wire.Error) and message.seq is None and message.session is None:
            self._fail(f"verifier: {message.code}: {message.message}")     # about the connection
        else:
            log.warning("dropped a reply nobody waits for: %s", message)

    def _fail(self, reason: str) -> None:
        self.closed_reason = self.closed_reason or reason
        error = wire.Error(None, None, wire.LINK_DOWN, None, self.closed_reason)
        for inbox in self._inboxes.values():
            inbox.put_nowait((time.perf_counter(), error))
        for future in self._waiting.values():
            if not future.done():
                future.set_result((time.perf_counter(), error))

    async def _release_outgoing(self) -> None:
        while True:
            due_s, data = await self._outgoing.get()
            await self.timer.sleep_until(due_s)
            try:
                await (self._frames.send(data) if self._frames is not None else self._ws.send_bytes(data))
            except Exception as exc:
                self._fail(f"send failed: {type(exc).__name__}: {exc}")

    async def _release_incoming(self) -> None:
        while True:
            due_s, data = await self._incoming.get()
            await self.timer.sleep_until(due_s)
            self._deliver(due_s, data)


# ---- one request in each mode ----------------------------------------------------------------

@dataclass
class Request:
    """What a request needs and what it measured (times on perf_counter)."""
    index: int
    prompt: list[int]
    config: RunConfig
    stop: StopRule
    t_start_s: float = 0.0
    t_first_s: float | None = None
    first_emitted: int = 0
    t_last_s: float | None = None
    tokens: list[int] | None = None
    rounds: int = 0
    stale_rounds: int = 0
    session: int | None = None         # its session on the link, once opened
    n_emitted: int = 0                 # tokens received so far (what a request given up got)
    gave_up: str = ""                  # why the client gave it up (its deadline), else empty

    def emitted(self, t_receive_s: float, n_tokens: int) -> None:
        self.n_emitted += n_tokens
        if n_tokens:
            if self.t_first_s is None:
                self.t_first_s, self.first_emitted = t_receive_s, n_tokens
            self.t_last_s = t_receive_s


class Client:
    """A run's requests, one after another, over one link."""

    def __init__(self, config: RunConfig, link: VerifierLink, draft: LanguageModel, device,
                 t_draft_s: float, writer: TraceWriter, clock: EdgeClock) -> None:
        self.config, self.link, self.draft, self.device = config, link, draft, device
        self.t_draft_s = t_draft_s
        self.writer, self.clock = writer, clock
        # One controller per run: what it learnt in one request carries over to the next.
        self.controller = make_controller(config.controller_config())
        self.last_request_end_s: float | None = None    # the previous request's last arrival

    def open_message(self, request: Request, session: int) -> wire.Open:
        c = self.config
        return wire.Open(self.link.next_seq(), session, request.prompt, c.max_new_tokens, c.temperature,
                         c.top_k, c.seed + request.index, c.stop_at_eos, c.top_p)

    async def next_message(self, inbox: asyncio.Queue, request: Request):
        """The session's next message (the request's deadline is set once, around it all: a
        timeout per wait cost ~30 us between sending a block and falling idle, every round)."""
        t_receive_s, message = await inbox.get()
        if isinstance(message, wire.Error):
            raise RunError(f"request {request.index}: verifier error {message.code} "
                           f"(field {message.field}): {message.message}")
        return t_receive_s, message

    def round_row(self, request: Request, round_index: int, proposed: int, accepted: int, emitted: int,
                  stale: bool, t_draft_start_s, t_draft_end_s, t_send_s, t_receive_s, m,
                  plan: tuple[int, str] | None = None) -> None:
        e, c, rtt_probe_ms = self.clock.epoch_s, self.config, self.link.rtt_probe_ms
        round_gamma, round_mode = plan or (None, "")
        self.writer.round(lambda: RoundRow(       # built when written: after the next block is out
            run_id=c.run_id, client_id=c.client_id, mode=c.mode, gamma=c.gamma, request_index=request.index,
            round_index=round_index, proposed=proposed, accepted=accepted, emitted=emitted, stale=stale,
            t_draft_start_s=e(t_draft_start_s), t_draft_end_s=e(t_draft_end_s), t_send_s=e(t_send_s),
            t_receive_s=e(t_receive_s), server_queue_s=m.queue_s, server_compute_s=m.compute_s,
            server_batch_size=m.batch_size, rtt_probe_ms=rtt_probe_ms, app_delay_ms=c.app_delay_ms,
            round_gamma=round_gamma, round_mode=round_mode))

    async def close_session(self, session: int, inbox: asyncio.Queue, request: Request, on_message) -> None:
        await self.link.send(wire.Close(self.link.next_seq(), session))
        while True:
            t_receive_s, message = await self.next_message(inbox, request)
            if isinstance(message, wire.Closed):
                break
            await on_message(t_receive_s, message)
        self.link.close_inbox(session)

    async def on_server(self, request: Request, plan: tuple[int, str] | None = None) -> None:
        """Cloud AR and co-located SD: the verifier generates; every streamed round is a row.
        ``plan`` (gamma, mode): a controller's choice for this request (default: the run's)."""
        session, inbox = self.link.open_inbox()
        request.session = session
        gamma, mode = plan or (self.config.gamma, self.config.mode)
        await self.link.send(self.open_message(request, session))
        t_send_s = await self.link.send(wire.Generate(self.link.next_seq(), session, mode,
                                                      gamma if get_mode(mode).speculative else 0))
        tokens: list[int] = []
        while True:
            t_receive_s, m = await self.next_message(inbox, request)
            if isinstance(m, wire.Tokens):
                tokens += m.tokens
                request.emitted(t_receive_s, len(m.tokens))
                if m.tokens or not m.done:
                    self.round_row(request, m.round_index, m.proposed, m.accepted, len(m.tokens), False,
                                   None, None, t_send_s, t_receive_s, m, plan)
                    request.rounds += 1
                if m.done:
                    break
        request.tokens = tokens

        async def unexpected(_t, message):
            raise RunError(f"unexpected {type(message).__name__} after the stream ended")

        await self.close_session(session, inbox, request, unexpected)

    async def dsd(self, request: Request) -> None:
        """Sync and pipelined DSD: the edge drafts (dsd.driver, on this process's clock and device),
        the verifier verifies."""
        c = self.config
        session, inbox = self.link.open_inbox()
        request.session = session
        sampling = SamplingParams(c.temperature, c.top_k, c.seed + request.index, c.top_p)
        transport = SessionTransport(self.link, session, inbox, request, sampling)
        device = DraftDevice(self.device, self.t_draft_s, transport)

        def on_round(r: Round) -> None:
            m = r.arrival.message                       # Verified, or Tokens of a hand-over
            stale = isinstance(m, wire.Verified) and m.stale
            request.emitted(r.arrival.t_receive_s, len(r.emitted))
            self.round_row(request, r.index, m.proposed, m.accepted, len(r.emitted), stale, r.t_draft_start_s,
                           r.t_draft_end_s, r.t_send_s, r.arrival.t_receive_s, m, (r.gamma, r.mode))
            request.rounds += 1
            request.stale_rounds += stale

        driver = DsdDriver(self.draft, f"{c.run_id}/{request.index}", request.prompt, c.gamma, request.stop,
                           sampling, device, transport, time.perf_counter, on_round, c.mode,
                           max_in_flight=c.max_in_flight, controller=self.controller,
                           gamma_max=max(c.gamma_max, c.gamma))
        await self.link.send(self.open_message(request, session))
        try:
            request.tokens = await driver.run()
        except RuntimeError as exc:
            if isinstance(exc, RunError):
                raise
            raise RunError(f"request {request.index}: {exc}") from None

        async def drain(t_receive_s, m) -> None:       # stale answers to blocks sent before the end
            arrival = transport.arrival(t_receive_s, m)
            if arrival is not None:
                await driver.handle(arrival)

        await self.close_session(session, inbox, request, drain)


class SessionTransport:
    """A DSD session on the verifier link, as dsd.driver's transport: blocks go out as Verify
    frames, Verified replies come back as arrivals; a hand-over goes out as a Generate with
    max_tokens on the open session, its Tokens come back as server rounds. The draft device may
    start a pass once the last message it depends on had arrived (``ready_s``)."""

    hands_over = True
    withdraws = True

    def __init__(self, link: VerifierLink, session: int, inbox: asyncio.Queue, request: Request,
                 sampling: SamplingParams) -> None:
        self.link, self.session, self.inbox, self.request, self.sampling = link, session, inbox, request, sampling
        self.ready_s = time.perf_counter()
        self.opened = False        # the verifier's Opened is in
        self.in_flight = 0         # blocks sent and not yet answered
        # services.spinwait (None: the loop never polls, and nothing below is tracked)
        self._selector = spinwait.selector_of()
        self._sent_s: list[float] = []     # when each block in flight went out, oldest first
        self._segments_sent_s: dict[int, float] = {}    # a hand-over Generate's seq -> its send, until Queued
        self._segments: list[int] = []                  # the seqs of the segments asked, oldest first
        self._withdrawing = False                       # a Withdraw waits for its Withdrawn

    @property
    def quiet(self) -> bool:
        """Nothing can arrive for this session or its link until it sends again: its Opened and
        every verdict and segment acknowledgement are in, and no ping waits for its answer."""
        return (self.opened and self.in_flight == 0 and not self._segments_sent_s and not self._withdrawing
                and not self.link.awaiting_reply)

    def prepare(self, proposals) -> list[bytes]:
        return [wire.encode(_verify_message(self.link.next_seq(), self.session, p, self.sampling))
                for p in proposals]

    async def send(self, frames: list[bytes], after=None) -> list[float]:
        self.in_flight += len(frames)
        sent = [await self.link.send_encoded(data) for data in frames]
        if self._selector is not None:
            self._sent_s += sent
            expected_s = self.link.verdict_gaps.expected_s()
            if expected_s is not None and self.in_flight == 1 and self.link.alone() and not self.link.shared_lately():
                self._selector.expect(sent[-1] + expected_s)      # a sync block: poll for its verdict when due
        return sent

    async def generate(self, mode: str, gamma: int, max_tokens: int, after=None) -> float:
        seq = self.link.next_seq()
        t_send_s = await self.link.send(wire.Generate(seq, self.session, mode,
                                                      gamma if get_mode(mode).speculative else 0, max_tokens))
        self._segments_sent_s[seq] = t_send_s
        self._segments.append(seq)
        return t_send_s

    async def withdraw(self, drop: int, after=None) -> float:
        """Ask the verifier to drop the last ``drop`` segments asked, those of them not yet
        started (answered by a Withdrawn)."""
        self._withdrawing = True
        keep_through = self._segments[-drop - 1] if len(self._segments) > drop else -1
        return await self.link.send(wire.Withdraw(self.link.next_seq(), self.session, keep_through))

    async def poll(self) -> list[Arrival]:
        arrivals = []
        while not self.inbox.empty():
            arrival = self.arrival(*self.inbox.get_nowait())
            if arrival is not None:
                arrivals.append(arrival)
        return arrivals

    async def wait(self) -> Arrival:
        while True:
            arrival = self.arrival(*await self.inbox.get())
            if arrival is not None:
                return arrival

    def arrival(self, t_receive_s: float, m) -> Arrival | None:
        """The verdict a message carries (None for the session's Opened); a verifier error ends
        the request."""
        if isinstance(m, wire.Queued):          # a segment's acknowledgement: the link's round trip
            t_send_s = self._segments_sent_s.pop(m.seq, None)     # (no draft pass waits for it)
            if t_send_s is None:
                raise RunError(f"request {self.request.index}: Queued for seq {m.seq}, no segment sent as it")
            return Arrival(None, t_receive_s, message=m, link_rtt_s=max(t_receive_s - t_send_s - m.held_s, 0.0))
        if isinstance(m, wire.Withdrawn):       # the last segments asked, dropped before they started
            if not self._withdrawing or m.segments != self._segments[len(self._segments) - len(m.segments):]:
                raise RunError(f"request {self.request.index}: Withdrawn {m.segments} is not the tail of the "
                               f"segments asked ({self._segments})")
            self._withdrawing = False
            del self._segments[len(self._segments) - len(m.segments):]
            return Arrival(None, t_receive_s, message=m, withdrawn=len(m.segments))
        self.ready_s = max(self.ready_s, t_receive_s)
        if isinstance(m, wire.Error):
            raise RunError(f"request {self.request.index}: verifier error {m.code} (field {m.field}): {m.message}")
        if isinstance(m, wire.Opened):
            self.opened = True
            return None
        if isinstance(m, wire.Tokens):
            return Arrival(None, t_receive_s, m.queue_s, m.compute_s, m,
                           served=ServerRound(m.proposed, m.accepted, tuple(m.tokens), m.done))
        if not isinstance(m, wire.Verified):
            raise RunError(f"unexpected {type(m).__name__} in a DSD session")
        self.in_flight -= 1
        if self._selector is not None:
            if self._sent_s:
                self.link.verdict_gaps.add(t_receive_s - self._sent_s.pop(0))
            if not m.stale:
                self.link.note_verdict(m.queue_s, m.batch_size)
            self._selector.cancel()
        return Arrival(Verdict(m.start_pos, m.proposed, m.accepted, m.next_token, m.stale), t_receive_s,
                       m.queue_s, m.compute_s, m)


class DraftDevice:
    """The edge's device as dsd.driver's device: emulated (charged t_draft_s a step, starting when
    its input was ready) or real (the device thread). A block is one pass: one wait instead of a
    wake-up per step, and its frames are built while that time runs.

    A real pass runs on the event loop's own thread when nothing can arrive meanwhile (the only
    run on the device, and its transport quiet: a sync edge's block after its verdict), which
    saves the two thread wake-ups of the hand-off (more than the Python work around the pass)."""

    def __init__(self, device, t_draft_s: float, transport: SessionTransport) -> None:
        self.device, self.t_draft_s, self.transport = device, t_draft_s, transport

    async def draft(self, work, n_steps: int, then):
        if isinstance(self.device, ThreadDevice) and self.device.runs == 1 and self.transport.quiet:
            result, start_s, _ = self.device.run_here(work, lambda *_: then())
            return result, start_s
        result, start_s, _ = await self.device.run(work, n_steps * self.t_draft_s, self.transport.ready_s,
                                                   lambda *_: then())
        return result, start_s


def _verify_message(seq: int, session: int, proposal, sampling: SamplingParams) -> wire.Verify:
    dense = ids = values = None
    if proposal.draft_probs is not None:
        q = proposal.draft_probs.float()                                # [gamma, vocab]
        if wire.probs_encoding(sampling.temperature, sampling.top_k, sampling.top_p) == "sparse":
            ids = [row.nonzero().flatten().tolist() for row in q]
            values = [q[i, row].tolist() for i, row in enumerate(ids)]
        else:
            dense = q.contiguous().numpy().astype("<f4").tobytes()
    return wire.Verify(seq, session, proposal.start_pos, proposal.base_digest, list(proposal.draft_tokens),
                       dense, ids, values)


# ---- a run -----------------------------------------------------------------------------------

class Run:
    def __init__(self, config: RunConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.status = "running"
        self.error: str | None = None
        self.requests_done = 0
        self.tokens = 0
        self.rtt_before_ms: list[float] = []
        self.task: asyncio.Task | None = None

    def summary(self) -> dict:
        return {"run_id": self.config.run_id, "client_id": self.config.client_id, "mode": self.config.mode,
                "status": self.status, "error": self.error, "requests_done": self.requests_done,
                "requests_total": len(self.config.prompts), "tokens": self.tokens,
                "rtt_before_ms": self.rtt_before_ms, "folder": str(self.folder)}


class Edge:
    def __init__(self, draft: LanguageModel, emulated: bool, t_draft_s: float, out_dir: Path,
                 backend_info: dict, token: str | None = None, shape_link: bool = False,
                 spin: spinwait.SpinConfig = spinwait.SpinConfig()) -> None:
        self.draft = draft
        self.spin = spin            # services.spinwait: the loop polls for a lone run's verdicts
        self.link = LinkControl(shape_link, self.probe_rtts)   # GET/PUT/DELETE /link, POST /link/probe
        self.token = token          # sent to the verifier, and required on /runs
        self.t_draft_s = t_draft_s
        self.out_dir = out_dir
        self.backend_info = backend_info
        self.runs: dict[str, Run] = {}
        self._thread_device = None if emulated else ThreadDevice()
        self._timer = PreciseTimer()          # every run's emulated device waits on it

    def app(self) -> web.Application:
        @web.middleware
        async def require_token(request: web.Request, handler):
            """A run names the verifier this edge connects to: only a holder of the token may post
            or read one. /health stays open for readiness polls."""
            if request.path != "/health" and (refused := access.refusal(request, self.token, log)) is not None:
                return refused
            return await handler(request)

        app = web.Application(middlewares=[require_token])
        app.router.add_get("/health", self.health)
        app.router.add_post("/runs", self.post_run)
        app.router.add_get("/runs/{run_id}", self.get_run)
        app.router.add_get("/runs/{run_id}/{name:(rounds|requests)\\.csv}", self.get_csv)
        self.link.add_routes(app)

        async def stop(_app):
            tasks = [r.task for r in self.runs.values() if r.task and not r.task.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        app.on_cleanup.append(stop)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        statuses = [r.status for r in self.runs.values()]
        return web.json_response({"status": "ok", "role": "edge", "draft": self.draft.name,
                                  "runs": {s: statuses.count(s) for s in set(statuses)}})

    async def probe_rtts(self, verifier_url: str, count: int, interval_s: float, app_delay_ms: float) -> list[float]:
        """RTTs (ms) of `count` Ping/Pong probes on a WebSocket of their own, as a run measures."""
        link = VerifierLink(ws_url(verifier_url), app_delay_ms / 1000, self._timer, self.token,
                            frames.DEFAULT_TRANSPORT)
        try:
            await link.connect("link-probe")
            rtts_ms = []
            for i in range(count):
                if i:
                    await asyncio.sleep(interval_s)
                rtts_ms.append(await link.probe_ms())
            return rtts_ms
        finally:
            await link.close()

    async def post_run(self, request: web.Request) -> web.Response:
        try:
            config = RunConfig.from_json(await request.json())
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        folder = self.out_dir / config.run_id
        if config.run_id in self.runs or folder.exists():
            return web.json_response({"error": f"run_id {config.run_id!r} exists"}, status=409)
        run = Run(config, folder)
        self.runs[config.run_id] = run
        run.task = asyncio.create_task(self._run(run), name=f"run-{config.run_id}")
        return web.json_response(run.summary(), status=201)

    async def get_run(self, request: web.Request) -> web.Response:
        run = self.runs.get(request.match_info["run_id"])
        if run is None:
            return web.json_response({"error": "no such run"}, status=404)
        selector = spinwait.selector_of()      # what the loop's polling did so far (the process's)
        return web.json_response({**run.summary(), "spin": selector.stats() if selector else asdict(self.spin)})

    async def get_csv(self, request: web.Request) -> web.StreamResponse:
        run = self.runs.get(request.match_info["run_id"])
        path = run.folder / request.match_info["name"] if run else None
        if path is None or not path.is_file():
            return web.json_response({"error": "no such run"}, status=404)
        return web.Response(body=path.read_bytes(), content_type="text/csv")

    async def _run(self, run: Run) -> None:
        config = run.config
        clock = EdgeClock()
        writer = TraceWriter(run.folder, {"run": asdict(config), "backend": self.backend_info,
                                          "t_draft_edge_s": self.t_draft_s, "spin": asdict(self.spin)})
        link = VerifierLink(config.ws_url, config.app_delay_ms / 1000, self._timer, self.token, config.transport)
        link.rto_max_ms = config.tcp_rto_max_ms
        link.alone = lambda: sum(r.status == "running" for r in self.runs.values()) == 1
        device = self._thread_device or EmulatedDevice(self._timer)
        request = None
        probing = None
        device.runs += 1
        try:
            welcome = await link.connect(config.client_id)
            if welcome.vocab_size != self.draft.vocab_size:
                raise RunError(f"draft vocabulary {self.draft.vocab_size} != target vocabulary {welcome.vocab_size}")
            for _ in range(config.probe_count):
                run.rtt_before_ms.append(await link.probe_ms())
            probing = asyncio.create_task(self._probe(link, config.probe_interval_ms / 1000))
            client = Client(config, link, self.draft, device, self.t_draft_s, writer, clock)
            stop = StopRule(config.max_new_tokens, welcome.eos_token_id if config.stop_at_eos else None)
            for index, prompt in enumerate(config.prompts):
                request = Request(index, list(prompt), config, stop, t_start_s=time.perf_counter())
                deadline = asyncio.timeout(config.request_deadline_s or config.request_timeout_s)
                try:
                    async with deadline:
                        await self._dispatch(client, link, request)
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    if not config.request_deadline_s:
                        raise RunError(f"request {index}: not done within request_timeout_s "
                                       f"{config.request_timeout_s}") from None
                    if request.tokens is None:      # else only the session's Close was still on its way
                        request.gave_up = (f"deadline: not done within request_deadline_s "
                                           f"{config.request_deadline_s:g} ({request.n_emitted} tokens received, "
                                           f"link {link.closed_reason or 'up'})")
                    if request.session is not None:
                        await link.abandon(request.session)
                self._request_row(writer, clock, link, request)
                run.requests_done += 1
                run.tokens += request.n_emitted if request.gave_up else len(request.tokens)
                request = None
            run.status = "done"
        except Exception as exc:          # any failure ends the run and is recorded as rows
            log.exception("run %s failed", config.run_id)
            run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
            self._error_rows(writer, link, run, request)
        finally:
            if probing is not None:
                probing.cancel()
                await asyncio.gather(probing, return_exceptions=True)
            device.runs -= 1
            await link.close()
            writer.close()

    @staticmethod
    async def _dispatch(client: Client, link: VerifierLink, request: Request) -> None:
        """One request in the run's mode; with an adaptive controller, in the mode it picks for
        this request at the link's last probed RTT (it then sees how the request went)."""
        config = request.config
        if config.controller == "static":
            await (client.dsd(request) if config.mode in edge_modes() else client.on_server(request))
            return
        rtt_s = probe_for_request_s(link.rtt_probe_ms, link.rtt_probe_sent_s, client.last_request_end_s)
        choice = check_decision(client.controller.decide_request(rtt_s), max(config.gamma_max, config.gamma),
                                config.controller_modes)
        if choice.mode in edge_modes():
            await client.dsd(request)
        else:
            await client.on_server(request, (choice.gamma, choice.mode))
        wall_s = None if request.t_last_s is None else request.t_last_s - request.t_start_s
        client.last_request_end_s = request.t_last_s or client.last_request_end_s
        if wall_s is not None:
            ttft_s = None if request.t_first_s is None else request.t_first_s - request.t_start_s
            shadow = (0, 0)
            if choice.mode not in edge_modes() and config.temperature == 0:
                shadow = shadow_matches(client.draft, f"{config.run_id}/{request.index}/shadow", request.prompt,
                                        request.tokens)
            client.controller.observe_request(RequestObservation(
                choice.mode, choice.gamma, len(request.tokens), wall_s, ttft_s, rtt_s, *shadow))

    @staticmethod
    async def _probe(link: VerifierLink, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await link.probe_ms()

    def _request_row(self, writer: TraceWriter, clock: EdgeClock, link: VerifierLink, r: Request) -> None:
        c = r.config
        n_tokens = r.n_emitted if r.gave_up else len(r.tokens)
        writer.request(RequestRow(
            run_id=c.run_id, client_id=c.client_id, mode=c.mode, gamma=c.gamma, request_index=r.index,
            prompt_tokens=len(r.prompt), tokens=n_tokens, rounds=r.rounds, stale_rounds=r.stale_rounds,
            wall_s=None if r.t_last_s is None else r.t_last_s - r.t_start_s,
            ttft_s=None if r.t_first_s is None else r.t_first_s - r.t_start_s,
            steady_per_token_s=steady_per_token_s(r.t_first_s, r.t_last_s, n_tokens - r.first_emitted),
            t_start_s=clock.epoch_s(r.t_start_s), t_end_s=clock.epoch_s(r.t_last_s),
            rtt_probe_ms=link.rtt_probe_ms, app_delay_ms=c.app_delay_ms,
            token_ids=" ".join(map(str, r.tokens or [])), gave_up=r.gave_up))

    @staticmethod
    def _error_rows(writer: TraceWriter, link: VerifierLink, run: Run, request: Request | None) -> None:
        c = run.config
        keys = {"run_id": c.run_id, "client_id": c.client_id, "mode": c.mode, "gamma": c.gamma,
                "request_index": request.index if request else run.requests_done,
                "rtt_probe_ms": link.rtt_probe_ms, "app_delay_ms": c.app_delay_ms, "error": run.error}
        rounds = request.rounds if request else 0
        writer.round(RoundRow(**keys, round_index=rounds, proposed=0, accepted=0, emitted=0, stale=False))
        writer.request(RequestRow(**keys, prompt_tokens=len(request.prompt) if request else 0, tokens=0,
                                  rounds=rounds, stale_rounds=0))


def main(argv: list[str] | None = None) -> None:
    app, args = build(argv)
    freeze_startup_heap()
    # A Unix socket as well, for an orchestrator outside this process's network namespace.
    web.run_app(app, host=args.host, port=args.port, path=args.unix_socket or None,
                print=None, access_log=None, loop=spinwait.new_event_loop(args.spin))


def build(argv: list[str] | None = None) -> tuple[web.Application, argparse.Namespace]:
    """The command line -> the edge's app, its draft loaded (what main serves)."""
    parser = argparse.ArgumentParser(prog="python -m services.edge", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix-socket", default="", help="also serve HTTP on this Unix socket path")
    parser.add_argument("--out-dir", default="", help="where run folders go (default: a new dsd-edge-* temp folder)")
    parser.add_argument("--shape-link", action="store_true",
                        help="let the control API shape this edge's link from inside its network namespace "
                             "(PUT /link; needs CAP_NET_ADMIN and CAP_NET_RAW here)")
    add_backend_args(parser)
    access.add_access_args(parser)
    spinwait.add_spin_args(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    try:
        backend, profile = backend_from_args(args)
        token = access.load_token(args.token_file, log=log)
        args.spin = spinwait.spin_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    access.check_host(args.host, args.allow_any_host, log)
    draft, _target = load_pair(backend)
    del _target      # the edge hosts the draft only
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="dsd-edge-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    t_draft_s = profile.t_draft_edge_s if profile and backend.emulated else 0.0
    trace = backend.trace() if isinstance(backend, SyntheticBackendConfig) else None
    edge = Edge(draft, backend.emulated, t_draft_s, out_dir,
                {"kind": backend.kind, "draft": draft.name, "profile": asdict(profile) if profile else None,
                 "acceptance_trace": trace.summary() if trace else None}, token, shape_link=args.shape_link,
                spin=args.spin)
    log.info("edge on %s:%s backend=%s out_dir=%s spin=%s", args.host, args.port, backend.kind, out_dir,
             json.dumps(asdict(args.spin)))
    return edge.app(), args


if __name__ == "__main__":
    main()
