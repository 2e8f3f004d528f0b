"""The transport floor under a round: two processes that only echo, paced like a DSD round.

    python benchmarks/echo_floor.py [--messages 300] [--draft-ms 8] [--verify-ms 10]

A client and an echo server in two processes over loopback. Paced like a sync DSD round: the
client computes ``draft_ms`` (a busy loop, as drafting keeps the edge's CPU busy), sends a small
message and waits for the answer; the server, on receipt, computes ``verify_ms`` (as the verify
pass does), and answers with the time it computed. The figure per message is the round trip less
that compute: what the transport, both processes' receive paths and their wake-ups cost, and
nothing of ours. Back to back (no compute on either side) it is the same path with both processes
awake; the difference is what waking an idle process costs on this host (on a VM, an idle vCPU
halts and is woken through the hypervisor), plus the cold caches after a pass.

Transports: ``ws`` is an aiohttp WebSocket between two asyncio event loops (what the services
use: binary frames, one reader task each side); ``tcp`` a raw blocking socket (the kernel's part
alone). Receives block in epoll / recv by default; ``spin`` receives poll without blocking for up
to the expected wait plus a millisecond before they block (bounded: a busy loop at most that
long per message), which takes the wake-up out where the CPU is free.

Measurements: docs/results/overhead.md.

``benchmarks/hf_overhead.py`` measures ``paced_echo_ms(EchoCadence("ws", draft, verify))`` in
its own run, at the cadence its rounds had: the floor under ``hf_overhead_server_p50_ms``.
Progress goes to stderr; the last stdout line is key=value pairs (p50 ms per case).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import selectors
import socket
import statistics
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.launch import free_port  # noqa: E402

TRANSPORTS = ("ws", "tcp")
_REPLY = struct.Struct("<d")  # the server's compute time, seconds
MESSAGE_BYTES = 124  # a greedy gamma-4 Verify frame's size


@dataclass(frozen=True)
class EchoCadence:
    transport: str = "ws"
    draft_s: float = 0.0  # the client computes this long before each message
    verify_s: float = 0.0  # the server computes this long before each answer
    spin: bool = False  # receives poll (bounded: the expected wait + 1 ms) before blocking

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        for name in ("draft_s", "verify_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1):
                raise ValueError(f"{name} must be a number of seconds in [0, 1], got {value!r}")
        if not isinstance(self.spin, bool):
            raise ValueError(f"spin must be true or false, got {self.spin!r}")

    @property
    def client_spin_s(self) -> float:
        return self.verify_s + 0.001 if self.spin else 0.0

    @property
    def server_spin_s(self) -> float:
        return self.draft_s + 0.001 if self.spin else 0.0


def compute(seconds: float) -> None:
    """Keep the CPU busy for this long (a stand-in for a model pass)."""
    end_s = time.perf_counter() + seconds
    while time.perf_counter() < end_s:
        pass


class _SpinSelector(selectors.EpollSelector):
    """An epoll selector that polls without blocking for up to ``spin_s`` before it blocks."""

    def __init__(self, spin_s: float) -> None:
        super().__init__()
        self.spin_s = spin_s

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0:
            return super().select(0)
        end_s = time.perf_counter() + (self.spin_s if timeout is None else min(self.spin_s, timeout))
        while True:
            ready = super().select(0)
            if ready or time.perf_counter() >= end_s:
                break
        if ready:
            return ready
        return super().select(None if timeout is None else max(0.0, timeout - self.spin_s))


def _loop(spin_s: float) -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(_SpinSelector(spin_s)) if spin_s > 0 else asyncio.SelectorEventLoop()


def _recv_exactly(conn: socket.socket, n: int, spin_s: float) -> bytes:
    """n bytes; polls without blocking for up to spin_s first."""
    data = b""
    end_s = time.perf_counter() + spin_s
    if spin_s > 0:
        conn.setblocking(False)
        while len(data) < n and time.perf_counter() < end_s:
            try:
                chunk = conn.recv(n - len(data))
            except BlockingIOError:
                continue
            if not chunk:
                return data
            data += chunk
        conn.setblocking(True)
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _serve(cadence: EchoCadence, port: int, ready) -> None:
    if cadence.transport == "tcp":
        listener = socket.create_server(("127.0.0.1", port))
        ready.set()
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while len(_recv_exactly(conn, MESSAGE_BYTES, cadence.server_spin_s)) == MESSAGE_BYTES:
            started_s = time.perf_counter()
            compute(cadence.verify_s)
            conn.sendall(_REPLY.pack(time.perf_counter() - started_s))
        return

    from aiohttp import web

    async def echo(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _message in ws:
            started_s = time.perf_counter()
            compute(cadence.verify_s)
            await ws.send_bytes(_REPLY.pack(time.perf_counter() - started_s))
        return ws

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/ws", echo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.sleep(900)  # bounded: the parent terminates it long before

    _loop(cadence.server_spin_s).run_until_complete(serve())


def _client(cadence: EchoCadence, port: int, n_messages: int) -> list[float]:
    payload = b"x" * MESSAGE_BYTES
    if cadence.transport == "tcp":
        out = []
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(n_messages):
                compute(cadence.draft_s)
                started_s = time.perf_counter()
                conn.sendall(payload)
                (compute_s,) = _REPLY.unpack(_recv_exactly(conn, _REPLY.size, cadence.client_spin_s))
                out.append(time.perf_counter() - started_s - compute_s)
        return out

    import aiohttp

    async def client() -> list[float]:
        out = []
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
                for _ in range(n_messages):
                    compute(cadence.draft_s)
                    started_s = time.perf_counter()
                    await ws.send_bytes(payload)
                    message = await ws.receive()
                    (compute_s,) = _REPLY.unpack(message.data)
                    out.append(time.perf_counter() - started_s - compute_s)
        return out

    loop = _loop(cadence.client_spin_s)
    try:
        return loop.run_until_complete(client())
    finally:
        loop.close()


def paced_echo_ms(cadence: EchoCadence, n_messages: int, warmup: int = 5) -> list[float]:
    """Per message, the round trip less the server's compute (ms), the first ``warmup`` left out."""
    if not (isinstance(n_messages, int) and n_messages >= 1):
        raise ValueError(f"n_messages must be a whole number >= 1, got {n_messages!r}")
    port = free_port()
    ready = multiprocessing.get_context("spawn").Event()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(cadence, port, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the echo server did not start within 60 s")
        return [1e3 * s for s in _client(cadence, port, n_messages + warmup)[warmup:]]
    finally:
        server.terminate()
        server.join(5)


CASES = {  # name: (transport, paced, spin)
    "tcp_b2b": ("tcp", False, False),
    "tcp_paced": ("tcp", True, False),
    "tcp_paced_spin": ("tcp", True, True),
    "ws_b2b": ("ws", False, False),
    "ws_paced": ("ws", True, False),
    "ws_paced_spin": ("ws", True, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--draft-ms", type=float, default=8.0)
    parser.add_argument("--verify-ms", type=float, default=10.0)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    results: dict[str, float | int] = {}
    for name in args.cases:
        transport, paced, spin = CASES[name]
        cadence = EchoCadence(
            transport, args.draft_ms / 1e3 if paced else 0.0, args.verify_ms / 1e3 if paced else 0.0, spin
        )
        values = sorted(paced_echo_ms(cadence, args.messages))
        results[f"{name}_p50_ms"] = statistics.median(values)
        print(
            f"{name:16s} p50 {statistics.median(values):.3f} ms  p90 {values[int(0.9 * (len(values) - 1))]:.3f} ms",
            file=sys.stderr,
        )
    results["load_avg_1m"], results["cpus"] = os.getloadavg()[0], os.cpu_count()
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
