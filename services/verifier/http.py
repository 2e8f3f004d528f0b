"""The verifier's HTTP side: /health, /metrics, the WebSocket and the frame transport, and a
connection's life (part of ``Verifier``, services/verifier/server.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict

from aiohttp import WSMsgType, web

from dsd.modes import server_modes
from services import access, frames, spinwait, wire
import services.verifier.frame_stamps as frame_stamps
from services.verifier.connection import Connection
from services.verifier.messages import VerifierMessages


log = logging.getLogger("services.verifier")
_TEXT = object()  # a WebSocket text frame (the messages are binary)


class VerifierHttp(VerifierMessages):
    """Serving connections: HTTP endpoints, WebSockets and frames."""

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
        return web.json_response(
            {"status": "ok", "role": "verifier", "target": self.target.name, "draft": self.draft.name}
        )

    def _refusal(self, request: web.Request) -> web.Response | None:
        """401 with a structured body unless the request carries the token (or none is set)."""
        refused = access.refusal(request, self.token, log)
        if refused is not None:
            self.errors[wire.UNAUTHORIZED] += 1
        return refused

    async def metrics(self, request: web.Request) -> web.Response:
        if (refusal := self._refusal(request)) is not None:
            return refusal
        return web.json_response(
            {
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
            }
        )

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        if (refusal := self._refusal(request)) is not None:
            return refusal  # before the upgrade: no connection, no state
        # aiohttp drops a connection whose frame exceeds its own limit; ours answers with an Error,
        # so aiohttp's is only the backstop against a frame far too large to read at all.
        ws = web.WebSocketResponse(max_msg_size=4 * self.limits.max_message_bytes)
        await ws.prepare(request)

        async def receive():
            msg = await ws.receive(timeout=self.limits.idle_timeout_s)
            if msg.type == WSMsgType.BINARY:
                return msg.data
            return _TEXT if msg.type == WSMsgType.TEXT else None  # None: close, error (beyond aiohttp's limit)

        try:
            await self._serve_connection(
                Connection(next(self._numbers), ws, "ws"),
                receive,
                request.transport.get_extra_info("socket") if request.transport else None,
            )
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
                if channel.timer is not None:
                    channel.timer.cancel()
                conn = self._accept_frames(channel, data)
                return
            conn.last_message_s = loop.time()
            runner.submit(lambda: self._on_item(conn, data))

        def on_lost(_reason: str) -> None:
            if channel.timer is not None:
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
            log.warning(
                "refused a frame connection from %s: %s", channel.made_transport().get_extra_info("peername"), reason
            )
            channel.write(
                wire.encode(
                    wire.Error(
                        None,
                        None,
                        wire.UNAUTHORIZED,
                        "token",
                        f"{reason}: this verifier requires its token as the first frame",
                    )
                )
            )
            # Half-close and read no more: closing with the client's next frames unread would send
            # a reset, which can destroy the Error before the client reads it.
            channel.closed, channel.close_reason = True, reason
            channel.made_transport().write_eof()
            asyncio.get_running_loop().call_later(5.0, channel.made_transport().abort)
            return None
        conn = Connection(next(self._numbers), channel, "tcp")
        self._open_connection(conn, channel.made_transport().get_extra_info("socket"))
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
        conn.watched = frame_stamps.watch(sock)
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
                    await self._reply_error(
                        conn, wire.WireError(wire.IDLE_TIMEOUT, f"no message for {self.limits.idle_timeout_s} s")
                    )
                    break
                if data is None:
                    break
                if data is _TEXT:
                    await self._reply_error(
                        conn, wire.WireError(wire.MALFORMED, "text frame: messages are binary msgpack")
                    )
                else:
                    await self._on_frame(conn, data, *conn.stamp())
        finally:
            self._close_connection(conn)


VERIFIER_KEY = web.AppKey("verifier", VerifierHttp)
