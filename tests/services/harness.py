"""Verifier and edge as real child processes on free loopback ports (services.launch: own
process group, readiness poll that notices a crash, timeout, the group killed by the fixture's
finalizer), and a bare client of the verifier (WebSocket or frames)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest
import yarl

from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from services import frames, wire
from services.access import bearer_header
from services.launch import Service, launch, post_runs, read_csv, wait_for_runs, wait_ready  # noqa: F401

# Small emulated compute times: every mode overlaps drafting, the round trip and verification,
# and a test request takes a fraction of a second.
TEST_PROFILE = {
    "name": "test",
    "t_draft_edge_s": 0.0005,
    "t_draft_server_s": 0.0003,
    "t_ar_s": 0.001,
    "t_verify_base_s": 0.0008,
    "t_verify_per_position_s": 0.0001,
    "t_prefill_per_token_s": 0.00001,
    "batch_slope": 0.1,
}


@pytest.fixture(scope="module")
def spawn(tmp_path_factory):
    """spawn((module, args), ...) starts services side by side and waits until all are ready;
    all are killed when the module's tests end."""
    services: list[Service] = []
    log_dir = tmp_path_factory.mktemp("service-logs")

    def _spawn(*specs: tuple[str, list[str]]) -> list[Service]:
        started = [launch(module, args, log_dir) for module, args in specs]
        services.extend(started)
        return [wait_ready(service) for service in started]

    yield _spawn
    for service in services:  # side by side: each takes a second to exit
        service.terminate()
    for service in services:
        service.wait_or_kill()


def synthetic_args(alpha: float = 0.7, seed: int = 3, profile: dict = TEST_PROFILE) -> list[str]:
    return [
        "--backend-json",
        json.dumps({"kind": "synthetic", "alpha": alpha, "seed": seed}),
        "--profile-json",
        json.dumps(profile),
    ]


class ConnectionEnd:
    """What RawClient.receive returns when the frame connection ended (like a WebSocket close,
    it has no seq)."""

    def __repr__(self) -> str:
        return "ConnectionEnd()"


class RawClient:
    """A bare client of the verifier, for tests that speak the wire protocol directly: over its
    WebSocket (``transport="ws"``) or the frame transport (``"tcp"``, services/frames.py)."""

    def __init__(self, url: str, token: str | None = None, transport: str = "ws") -> None:
        self.url = url.replace("http://", "ws://") + "/ws"
        self.headers = bearer_header(token)
        self.token = token
        self.transport = transport
        self.seq = 0

    async def __aenter__(self) -> RawClient:
        if self.transport == "tcp":
            address = yarl.URL(self.url)
            self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(address.host, address.port), 10)
            self.writer.write(frames.MAGIC + frames.frame((self.token or "").encode()))
            return self
        self.http = aiohttp.ClientSession()
        try:
            self.ws = await asyncio.wait_for(self.http.ws_connect(self.url, headers=self.headers), 10)
        except BaseException:
            await self.http.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        if self.transport == "tcp":
            self.writer.close()
            return
        await self.ws.close()
        await self.http.close()

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def send(self, message) -> None:
        data = message if isinstance(message, bytes) else wire.encode(message)
        if self.transport == "tcp":
            self.writer.write(frames.frame(data))
            await self.writer.drain()
        else:
            await self.ws.send_bytes(data)

    async def send_together(self, *messages) -> None:
        """Send the messages in one TCP segment (the socket corked around them), so the verifier
        reads all or none of them: none can arrive after a pass that the first arrived during."""
        sock = (self.writer if self.transport == "tcp" else self.ws).get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        try:
            for message in messages:
                await self.send(message)
        finally:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    async def receive(self, timeout_s: float = 10.0):
        if self.transport == "tcp":
            try:
                header = await asyncio.wait_for(self.reader.readexactly(4), timeout_s)
                data = await asyncio.wait_for(self.reader.readexactly(frames.HEADER.unpack(header)[0]), timeout_s)
            except (asyncio.IncompleteReadError, ConnectionError):
                return ConnectionEnd()
            return wire.decode(data)
        msg = await self.ws.receive(timeout=timeout_s)
        if msg.type != aiohttp.WSMsgType.BINARY:
            return msg
        return wire.decode(msg.data)

    async def until(self, predicate, timeout_s: float = 10.0) -> list:
        """Messages received up to and including the first one that satisfies predicate."""
        received = []
        deadline = time.monotonic() + timeout_s
        while True:
            message = await self.receive(max(deadline - time.monotonic(), 0.001))
            received.append(message)
            if predicate(message):
                return received
            if isinstance(message, ConnectionEnd) or time.monotonic() > deadline:
                raise TimeoutError(f"no message satisfied the predicate; received {received[-3:]}")

    async def ask(self, message, timeout_s: float = 10.0):
        """Send a request and return the first reply that carries its seq."""
        await self.send(message)
        replies = await self.until(lambda m: getattr(m, "seq", None) == message.seq, timeout_s)
        return replies[-1]


def run(coroutine, timeout_s: float = 90.0):
    """Run a test's client coroutine to its end, bounded in time."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout_s))


def open_message(
    seq: int, session: int, prompt=(1, 2, 3), max_new_tokens: int = 8, temperature: float = 0.0
) -> wire.Open:
    return wire.Open(seq, session, list(prompt), max_new_tokens, temperature, None, 0, True)


def sessions_open(verifier: Service, timeout_s: float = 10.0) -> int:
    """The verifier's open sessions once they reach 0 or ``timeout_s`` has passed (a client's
    disconnect frees its sessions a moment later)."""
    deadline = time.monotonic() + timeout_s
    while verifier.get_json("/metrics")["sessions_open"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return verifier.get_json("/metrics")["sessions_open"]


PROMPTS = [[(11 * i + 5 * j) % 500 + 1 for j in range(2 + i % 4)] for i in range(6)]


def run_body(verifier, run_id, mode, prompts, max_new_tokens, **extra):
    return {
        "run_id": run_id,
        "client_id": run_id,
        "mode": mode,
        "gamma": 3,
        "max_in_flight": 2,
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
        "verifier_url": verifier.url,
        "probe_count": 2,
        "probe_interval_ms": 50,
        **extra,
    }


def check_greedy(edge, run_ids, reference):
    summaries = wait_for_runs(edge, run_ids)
    for run_id in run_ids:
        assert summaries[run_id]["status"] == "done", summaries[run_id]
        rows = read_csv(edge, run_id, "requests.csv")
        assert len(rows) == summaries[run_id]["requests_total"] > 0
        for row in rows:
            got = [int(t) for t in row["token_ids"].split()]
            assert got == reference(int(row["request_index"])), f"{run_id} request {row['request_index']}"


def synthetic_reference(target, prompts, max_new_tokens):
    stop = StopRule(max_new_tokens, target.eos_token_id)
    return lambda i: generate_ar(target, prompts[i], stop, seq_id=f"ref-{i}").tokens
