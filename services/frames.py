"""The lean data path: services.wire messages as length-prefixed frames on a plain TCP connection.

The WebSocket (``/ws``, aiohttp) carries every per-round message through an HTTP upgrade, the
WebSocket framing (a client's frames are masked), aiohttp's reader queue and a reader task on
each side. The same messages can instead go over a raw asyncio TCP connection (TCP_NODELAY) to
the SAME port as the verifier's HTTP API: the listener looks at a connection's first bytes, and
one that opens with ``MAGIC`` (a NUL byte first: never an HTTP request) speaks frames, anything
else is handed to aiohttp unchanged. So the data path is reachable (and shaped) wherever the
WebSocket is: same address, same port, same link.

On the wire, after ``MAGIC``, every frame is a 4-byte big-endian length and that many bytes:

    client: MAGIC, frame(token)                  the token (UTF-8; empty without one): checked first
    then, both ways: frame(wire.encode(message)) ...  exactly the WebSocket's binary frames

A wrong or missing token is answered with one ``Error`` frame (code ``unauthorized``, field
``token``) and the connection is closed before anything is allocated. A frame longer than the
receiver's limit is skipped without being buffered and reported as ``Oversize`` (the verifier
answers it with an Error naming ``max_message_bytes``, as on the WebSocket); one beyond
``drop_beyond_bytes`` closes the connection (aiohttp's backstop does the same).

``FrameProtocol`` is one end of a connection (either side): frames arrive by a callback
(``on_frame``, called from the transport's data_received: no queue, no task hop); ``send()``
writes one frame (one write, so one segment for a small message with TCP_NODELAY) and waits
only if the kernel's buffer is full.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import socket
import struct
import time
import types
from dataclasses import dataclass
from collections.abc import Callable

from aiohttp import web

MAGIC = b"\x00DSD"
HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = (1 << 32) - 1
TRANSPORTS = ("ws", "tcp")
DEFAULT_TRANSPORT = "ws"


def check_transport(value) -> str:
    if value not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {value!r}")
    return value


def frame(data: bytes) -> bytes:
    if len(data) > MAX_FRAME_BYTES:
        raise ValueError(f"a frame holds at most {MAX_FRAME_BYTES} bytes, got {len(data)}")
    return HEADER.pack(len(data)) + data


@dataclass(frozen=True)
class Oversize:
    """A frame longer than the receiver's limit: skipped, its length kept for the error."""

    n_bytes: int


class FrameTooLarge(ValueError):
    pass


class Deframer:
    """Bytes as they come -> whole frames (bytes), or Oversize for one beyond ``max_frame_bytes``
    (its body skipped, never buffered). A length beyond ``drop_beyond_bytes`` raises
    FrameTooLarge: the connection is to be closed."""

    def __init__(self, max_frame_bytes: int, drop_beyond_bytes: int) -> None:
        for name, value in (("max_frame_bytes", max_frame_bytes), ("drop_beyond_bytes", drop_beyond_bytes)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        self.max_frame_bytes, self.drop_beyond_bytes = max_frame_bytes, drop_beyond_bytes
        self._buffer = bytearray()
        self._skip = 0  # bytes of an oversized frame still to discard

    def feed(self, data: bytes) -> list:
        out: list = []
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        if not self._buffer and len(data) >= 4:  # the usual case: whole frames in one read
            n = HEADER.unpack_from(data)[0]
            if len(data) == 4 + n and n <= self.max_frame_bytes:
                out.append(bytes(data[4:]))
                return out
        self._buffer += data
        while len(self._buffer) >= 4:
            n = HEADER.unpack_from(self._buffer)[0]
            if n > self.max_frame_bytes:
                if n > self.drop_beyond_bytes:
                    raise FrameTooLarge(
                        f"a frame of {n} bytes exceeds {self.drop_beyond_bytes} bytes: connection closed"
                    )
                out.append(Oversize(n))
                dropped = min(n, len(self._buffer) - 4)
                del self._buffer[: 4 + dropped]
                self._skip = n - dropped
                if self._skip:
                    break
                continue
            if len(self._buffer) < 4 + n:
                break
            out.append(bytes(self._buffer[4 : 4 + n]))
            del self._buffer[: 4 + n]
        return out


class FrameProtocol(asyncio.Protocol):
    """One end of a frame connection. ``on_frame(t_read_s, item)`` (item: bytes or Oversize) is
    called for every frame as it is read.
    ``on_lost(reason)`` is called once when the connection ends, ``on_made(self)`` when it starts."""

    def __init__(
        self,
        max_frame_bytes: int,
        drop_beyond_bytes: int,
        on_frame: Callable,
        on_lost: Callable[[str], None] | None = None,
        on_made: Callable[[FrameProtocol], None] | None = None,
    ) -> None:
        self.deframer = Deframer(max_frame_bytes, drop_beyond_bytes)
        self.on_frame, self.on_lost, self.on_made = on_frame, on_lost, on_made
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.close_reason: str | None = None
        self._writable: asyncio.Future | None = None  # set while the kernel's buffer is full
        self.task: asyncio.Task | None = None  # a server's task serving it (held here)
        self.timer: asyncio.TimerHandle | None = None  # a server's timeout on it

    # ---- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.on_made is not None:
            self.on_made(self)

    def data_received(self, data: bytes) -> None:
        t_read_s = time.perf_counter()
        try:
            items = self.deframer.feed(data)
        except FrameTooLarge as exc:
            self.abort(str(exc))
            return
        for item in items:
            if self.closed:
                break
            self.on_frame(t_read_s, item)

    def connection_lost(self, exc) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = self.close_reason or (
                "connection closed by the peer" if exc is None else f"connection lost: {type(exc).__name__}: {exc}"
            )
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.on_lost is not None:
            on_lost, self.on_lost = self.on_lost, None
            on_lost(self.close_reason or "connection lost")

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # ---- use -----------------------------------------------------------------------------

    def made_transport(self) -> asyncio.Transport:
        """The connection's transport (set when the connection is made)."""
        if self.transport is None:
            raise ConnectionError("frame connection not made yet")
        return self.transport

    def write(self, data: bytes) -> None:
        """One frame, written at once (one segment for a small message)."""
        if not self.closed:
            self.made_transport().write(frame(data))

    async def send(self, data: bytes) -> None:
        """One frame; waits while the kernel's send buffer is full (as a WebSocket send does)."""
        if self.closed:
            raise ConnectionResetError(f"frame connection closed: {self.close_reason}")
        self.made_transport().write(frame(data))
        if self._writable is not None and not self._writable.done():
            await self._writable

    send_bytes = send  # the name a WebSocket's send has: either can be a connection's channel

    def abort(self, reason: str) -> None:
        """Close now (what is buffered to send is dropped), with this reason."""
        self.close_reason = self.close_reason or reason
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self, reason: str = "closed") -> None:
        """Close once what is buffered is sent."""
        self.close_reason = self.close_reason or reason
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class InlineRunner:
    """Runs coroutines one after another in order, each started at once on the caller's stack
    (a frame's handling starts inside data_received: no hop to a reader task, one loop turn less
    per message). Python 3.11 has no eager tasks: what does not finish without suspending is
    handed to a Task at its first suspension (``_resume`` passes what it awaits up to the Task),
    and later submissions wait behind it. Code run this way must not need ``current_task()``
    before its first suspension (``asyncio.timeout`` does). ``on_error(exc)`` gets what a
    coroutine raised."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.on_error = on_error
        self._pending: collections.deque = collections.deque()  # zero-argument coroutine makers
        self.task: asyncio.Task | None = None  # the one that finishes a suspended coroutine

    def submit(self, make: Callable) -> None:
        if self.task is not None:
            self._pending.append(make)
            return
        coro = make()
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - handed to on_error, as a task's failure
            self.on_error(exc)
            return
        self.task = asyncio.get_running_loop().create_task(self._finish(coro, yielded))

    async def _finish(self, coro, yielded) -> None:
        try:
            await _resume(coro, yielded)
            while self._pending:
                await self._pending.popleft()()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            self.on_error(exc)
        finally:
            self.task = None
            while self._pending and self.task is None:  # after a failure: the rest, in order
                self.submit(self._pending.popleft())

    def cancel(self) -> None:
        self._pending.clear()
        if self.task is not None:
            self.task.cancel()


def start_now(coro) -> asyncio.Task | None:
    """Run a coroutine at once on the caller's stack up to its first suspension; None if it
    finished (what it raised is raised here), else the Task that finishes it. A WebSocket's or a
    frame connection's send writes its bytes before it can suspend (only to wait while the
    kernel's buffer is full), so a send started this way is on its way when this returns, in
    order with every later send."""
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None

    async def finish():
        return await _resume(coro, yielded)

    return asyncio.get_running_loop().create_task(finish())


@types.coroutine
def _resume(coro, yielded):
    """Go on with a started coroutine that yielded ``yielded``: what it yields goes up to the
    Task that awaits this, what the Task sends or throws goes down to it (``yield from`` for a
    coroutine that is already past its start)."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # noqa: BLE001 - thrown in by the Task: passed down
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def token_matches(given: bytes, token: str | None) -> bool:
    """The first frame's token against the expected one (constant time); True without a token."""
    return token is None or hmac.compare_digest(given, token.encode())


# ---- the client ----------------------------------------------------------------------------

# linux/tcp.h (Linux >= 6.15); the socket module has no name for it yet
TCP_RTO_MAX_MS = 44


def cap_retransmission_backoff(sock, rto_max_ms: int) -> None:
    """Cap TCP's retransmission timeout on a connection at rto_max_ms (0: the kernel's,
    net.ipv4.tcp_rto_max_ms, 120 s by default). The timeout doubles with every retransmission
    into a link that is down, so after an outage of S s the next one, the first the returned
    link carries, comes up to about S s late; capped, it comes within rto_max_ms. Raises OSError
    where the kernel has no such option."""
    if rto_max_ms and sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS, int(rto_max_ms))


async def open_connection(
    host: str, port: int, token: str | None, max_frame_bytes: int, on_frame: Callable, on_lost: Callable[[str], None]
) -> FrameProtocol:
    """A frame connection to a verifier at host:port, its token already sent."""
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(
        lambda: FrameProtocol(max_frame_bytes, 4 * max_frame_bytes, on_frame, on_lost), host, port
    )
    protocol.made_transport().write(MAGIC + frame((token or "").encode()))
    return protocol


# ---- the server: one port for HTTP and frames --------------------------------------------------


class _Sniffer(asyncio.Protocol):
    """A new connection's first bytes decide who serves it: ``MAGIC`` -> the frame protocol
    (``frames()`` makes it), anything else -> aiohttp's request handler."""

    def __init__(
        self, http_factory: Callable[[], asyncio.Protocol], frames_factory: Callable[[], asyncio.Protocol]
    ) -> None:
        self.http_factory, self.frames_factory = http_factory, frames_factory
        self.transport: asyncio.BaseTransport | None = None
        self.head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.head += data
        if len(self.head) < len(MAGIC) and MAGIC.startswith(self.head):
            return  # could still be either: wait for more
        if self.head.startswith(MAGIC):
            protocol, rest = self.frames_factory(), self.head[len(MAGIC) :]
        else:
            protocol, rest = self.http_factory(), self.head
        if self.transport is None:
            raise ConnectionError("data before the connection was made")
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if rest:
            protocol.data_received(rest)

    def connection_lost(self, exc) -> None:
        pass  # closed before it said what it is: nothing was made for it


class SniffingSite(web.TCPSite):
    """aiohttp's TCP site, whose connections that open with ``MAGIC`` speak frames instead."""

    __slots__ = ("_frames_factory",)

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, frames_factory: Callable[[], asyncio.Protocol]
    ) -> None:
        super().__init__(runner, host, port)
        self._frames_factory = frames_factory

    async def start(self) -> None:
        self._runner._reg_site(self)  # BaseSite.start (TCPSite.start would bind aiohttp's own)
        server = self._runner.server
        if server is None:
            raise RuntimeError("the runner is not set up: call its setup() before starting a site")
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Sniffer(server, self._frames_factory), self._host, self._port, backlog=self._backlog
        )


def run_app(
    app: web.Application,
    host: str,
    port: int,
    unix_socket: str | None,
    frames_factory: Callable[[], asyncio.Protocol],
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Serve ``app`` on host:port (HTTP and frames) and on a Unix socket (HTTP) until SIGINT or
    SIGTERM, as ``aiohttp.web.run_app`` does."""
    asyncio.set_event_loop(loop)

    async def serve() -> None:
        runner = web.AppRunner(app, handle_signals=True, access_log=None)
        await runner.setup()
        try:
            await SniffingSite(runner, host, port, frames_factory).start()
            if unix_socket:
                await web.UnixSite(runner, unix_socket).start()
            while True:
                await asyncio.sleep(3600)
        finally:
            await runner.cleanup()

    main_task = loop.create_task(serve())
    try:
        loop.run_until_complete(main_task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        if not main_task.done():
            main_task.cancel()
            try:
                loop.run_until_complete(main_task)
            except (asyncio.CancelledError, web.GracefulExit, KeyboardInterrupt):
                pass
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
