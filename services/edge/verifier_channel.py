"""The edge's one channel to the verifier (``VerifierChannel``: its WebSocket, or a frame
connection): replies routed to their session, probes of the link's RTT, and ``app_delay_ms`` in
each direction."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import aiohttp
import yarl

from services import access, frames, spinwait, wire
from services.compute import PreciseTimer
from services.edge.config import RunError


log = logging.getLogger("services.edge")
MAX_RECEIVE_BYTES = 64 << 20  # the largest message this client takes from the verifier


def probe_for_request_s(
    probe_ms: float | None, probe_sent_s: float | None, previous_end_s: float | None
) -> float | None:
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


class VerifierChannel:
    """One connection to the verifier (its WebSocket, or a frame connection: ``transport``):
    replies routed to their session (or to the request that waits for them), each direction
    delayed by ``delay_s`` in order, RTT probes."""

    def __init__(
        self, url: str, delay_s: float, timer: PreciseTimer, token: str | None = None, transport: str = "ws"
    ) -> None:
        self.url = url
        self.transport = frames.check_transport(transport)
        self._frames: frames.FrameProtocol | None = None
        self.token = token
        self.delay_s = delay_s
        self.timer = timer
        self.rtt_probe_ms: float | None = None
        self.rtt_probe_sent_s: float | None = None  # perf_counter when that probe was sent
        self.welcome: wire.Welcome | None = None
        self._seqs = itertools.count(1)
        self._session_ids = itertools.count(1)
        self._inboxes: dict[int, asyncio.Queue] = {}
        self._abandoned: set[int] = set()  # sessions given up: what still comes for them is dropped
        self._waiting: dict[int, asyncio.Future] = {}
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._incoming: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self.closed_reason: str | None = None
        self.rto_max_ms = 0  # RunConfig.tcp_rto_max_ms
        # services.spinwait: how long a block's verdict took lately, and whether this channel's run
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
        self.verdicts_shared = (self.verdicts_shared + [queue_s > 1e-4 or batch_size > 1])[-self.verdict_gaps.keep :]

    async def connect(self, client_id: str, timeout_s: float = 30.0) -> wire.Welcome:
        if self.transport == "tcp":
            url = yarl.URL(self.url)
            if url.host is None or url.port is None:
                raise RunError(f"verifier URL {self.url!r}: no host and port to connect to")
            try:
                self._frames = await asyncio.wait_for(
                    frames.open_connection(
                        url.host, url.port, self.token, MAX_RECEIVE_BYTES, self._on_frame, self._fail
                    ),
                    timeout_s,
                )
            except OSError as exc:
                raise RunError(f"cannot connect to the verifier's data port {url.host}:{url.port}: {exc}") from None
        else:
            self._http = aiohttp.ClientSession()
            try:
                self._ws = await asyncio.wait_for(
                    self._http.ws_connect(
                        self.url, max_msg_size=MAX_RECEIVE_BYTES, headers=access.bearer_header(self.token)
                    ),
                    timeout_s,
                )
            except aiohttp.WSServerHandshakeError as exc:
                raise RunError(
                    f"verifier refused the connection: HTTP {exc.status} {exc.message}"
                    f"{' (token sent)' if self.token else ' (no token)'}"
                ) from None
            self._tasks = [asyncio.create_task(self._read())]
        if self._ws is not None:
            sock = self._ws.get_extra_info("socket")
        else:
            sock = self._frames.made_transport().get_extra_info("socket") if self._frames is not None else None
        frames.cap_retransmission_backoff(sock, self.rto_max_ms)
        if self.delay_s > 0:
            self._tasks += [
                asyncio.create_task(self._release_outgoing()),
                asyncio.create_task(self._release_incoming()),
            ]
        token_note = (" (token sent)" if self.token else " (no token)") if self._frames else ""
        try:
            _, welcome = await asyncio.wait_for(self.request(wire.Hello(self.next_seq(), client_id)), timeout_s)
        except RunError:  # a frame connection's refusal may close the channel before the Hello goes out
            raise RunError(f"verifier refused the connection: {self.closed_reason}{token_note}") from None
        if isinstance(welcome, wire.Error):
            raise RunError(f"verifier refused the connection: {welcome.code}: {welcome.message}{token_note}")
        self.welcome = welcome
        return welcome

    def welcomed(self) -> wire.Welcome:
        """The verifier's Welcome (after ``connect``)."""
        if self.welcome is None:
            raise RunError("the channel to the verifier is not connected")
        return self.welcome

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
        if not self.closed_reason:
            t_send_s = time.perf_counter()
            if self.delay_s > 0:
                self._outgoing.put_nowait((t_send_s + self.delay_s, data))
                return t_send_s
            try:
                await self._send_now(data)
                return t_send_s
            except (OSError, aiohttp.ClientError) as exc:  # the drop, seen by the writer before the reader
                self._fail(f"send failed, connection lost: {type(exc).__name__}: {exc}")
        # the code a waiting session is handed too (_fail): either may see the drop first
        raise RunError(f"verifier error {wire.LINK_DOWN} (link to the verifier is down): {self.closed_reason}")

    async def _send_now(self, data: bytes) -> None:
        if self._frames is not None:
            await self._frames.send(data)
        elif self._ws is not None:
            await self._ws.send_bytes(data)
        else:
            raise RuntimeError("the channel is not connected")

    async def request(self, message: Any) -> tuple[float, Any]:
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
        ws = self._ws
        try:
            if ws is None:
                raise RuntimeError("a WebSocket reader without a WebSocket")
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                t_receive_s = time.perf_counter()
                if self.delay_s > 0:
                    self._incoming.put_nowait((t_receive_s + self.delay_s, msg.data))
                else:
                    self._deliver(t_receive_s, msg.data)
            self._fail(f"connection closed (code {ws.close_code})")
        except Exception as exc:  # anything that ends the reader ends the channel
            self._fail(f"{type(exc).__name__}: {exc}")

    def _on_frame(self, t_receive_s: float, data) -> None:
        """A frame as the frame connection reads it (no reader task: straight from the socket)."""
        try:
            if isinstance(data, frames.Oversize):
                raise RunError(
                    f"a message of {data.n_bytes} bytes from the verifier exceeds this client's "
                    f"limit of {MAX_RECEIVE_BYTES} bytes"
                )
            if self.delay_s > 0:
                self._incoming.put_nowait((t_receive_s + self.delay_s, data))
            else:
                self._deliver(t_receive_s, data)
        except Exception as exc:  # as in _read: anything that ends the reader ends the channel
            reason = f"{type(exc).__name__}: {exc}"
            self._fail(reason)
            if self._frames is not None:
                self._frames.abort(self.closed_reason or reason)

    def _deliver(self, t_receive_s: float, data: bytes) -> None:
        message = wire.decode(data)
        session = getattr(message, "session", None)
        if session is not None and session in self._inboxes:
            self._inboxes[session].put_nowait((t_receive_s, message))
        elif session is not None and session in self._abandoned:
            pass
        elif message.seq in self._waiting:
            if not self._waiting[message.seq].done():  # its waiter may have been cancelled
                self._waiting[message.seq].set_result((t_receive_s, message))
        elif isinstance(message, wire.Error) and message.seq is None and message.session is None:
            self._fail(f"verifier: {message.code}: {message.message}")  # about the connection
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
                await self._send_now(data)
            except Exception as exc:
                self._fail(f"send failed: {type(exc).__name__}: {exc}")

    async def _release_incoming(self) -> None:
        while True:
            due_s, data = await self._incoming.get()
            await self.timer.sleep_until(due_s)
            self._deliver(due_s, data)
