"""The frame transport (services/frames.py): framing, in-order inline handling, and the services
over it -- the same tokens as over the WebSocket, the token checked on the first frame, the
message size limit named, a dropped connection surfacing as the same link_down error."""

import asyncio
import os
import random
import signal
import time

import aiohttp
import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from services import frames, wire
from services.edge import VerifierChannel
from services.edge.config import RunError
from tests.services.harness import (
    ConnectionEnd,
    RawClient,
    post_runs,
    read_csv,
    run,
    sessions_open,
    synthetic_args,
    wait_for_runs,
)
from tests.checks import every

ALPHA, SEED = 0.7, 3
TOKEN = "frames-test-token-" + "x" * 20
MAX_BYTES = 4096
MODES = ("ar", "colocated", "sync", "pipelined")


# ---- framing -------------------------------------------------------------------------------


def test_frames_split_anywhere_come_out_whole_and_in_order():
    messages = [bytes([i]) * n for i, n in enumerate((0, 1, 3, 200, 5000, 17))]
    stream = b"".join(frames.frame(m) for m in messages)
    rng = random.Random(5)
    for _ in range(50):
        deframer, out, i = frames.Deframer(10_000, 40_000), [], 0
        while i < len(stream):
            step = rng.randint(1, 300)
            out += deframer.feed(stream[i : i + step])
            i += step
        assert out == messages


def test_an_oversized_frame_is_skipped_and_named_and_the_next_one_is_intact():
    big, after = b"z" * 5000, b"after"
    stream = frames.frame(b"before") + frames.frame(big) + frames.frame(after)
    for step in (1, 7, 4096, len(stream)):
        deframer, out = frames.Deframer(4096, 4 * 4096), []
        for i in range(0, len(stream), step):
            out += deframer.feed(stream[i : i + step])
        assert out == [b"before", frames.Oversize(5000), after], step
        assert len(deframer._buffer) == 0  # the oversized body was never buffered


def test_a_frame_beyond_the_backstop_closes_the_connection_and_bad_limits_are_named():
    with pytest.raises(frames.FrameTooLarge, match="exceeds 400 bytes"):
        frames.Deframer(100, 400).feed(frames.HEADER.pack(401))
    with pytest.raises(ValueError, match="max_frame_bytes must be a whole number >= 1, got 0"):
        frames.Deframer(0, 10)
    with pytest.raises(ValueError, match=r"transport must be one of \('ws', 'tcp'\), got 'udp'"):
        frames.check_transport("udp")


def test_the_inline_runner_starts_at_once_and_keeps_order_across_a_suspension():
    async def main():
        done, errors = [], []
        runner = frames.InlineRunner(errors.append)
        gate = asyncio.get_running_loop().create_future()

        async def job(name, wait=None):
            if wait is not None:
                await wait
            done.append(name)

        runner.submit(lambda: job("a"))
        assert done == ["a"]  # ran before submit returned: no loop turn
        runner.submit(lambda: job("b", gate))  # suspends: the rest waits behind it
        runner.submit(lambda: job("c"))
        assert done == ["a"]

        async def boom():
            raise RuntimeError("bad frame")

        runner.submit(boom)
        runner.submit(lambda: job("d"))
        gate.set_result(None)
        await asyncio.sleep(0.01)
        assert done == ["a", "b", "c", "d"] and [str(e) for e in errors] == ["bad frame"]
        runner.submit(lambda: job("e"))
        assert done[-1] == "e" and runner.task is None

    run(main())


# ---- the services over frames ------------------------------------------------------------


@pytest.fixture(scope="module")
def services(spawn, tmp_path_factory, token_file):
    out = tmp_path_factory.mktemp("edges")
    return spawn(
        ("services.verifier", synthetic_args(ALPHA, SEED) + ["--max-batch", "4"]),
        ("services.edge", synthetic_args(ALPHA, SEED) + ["--out-dir", str(out / "open")]),
        (
            "services.verifier",
            synthetic_args(ALPHA, SEED) + ["--token-file", str(token_file), "--max-message-bytes", str(MAX_BYTES)],
        ),
        (
            "services.edge",
            synthetic_args(ALPHA, SEED) + ["--token-file", str(token_file), "--out-dir", str(out / "token")],
        ),
    )


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    return path


def run_body(verifier, run_id, mode, prompts, max_new_tokens, transport, **extra):
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
        "probe_interval_ms": 20,
        "transport": transport,
        **extra,
    }


def reference_tokens(prompt, max_new_tokens):
    target = SyntheticLM(SyntheticConfig(alpha=ALPHA, seed=SEED), "target")
    return generate_ar(target, prompt, StopRule(max_new_tokens, target.eos_token_id)).tokens


def test_every_mode_over_frames_emits_the_target_greedy_tokens_and_records_the_transport(services):
    verifier, edge = services[:2]
    before = verifier.get_json("/metrics")["connections_by_transport"]
    prompts = [[5, 6, 7], [9, 1], [3, 3, 3, 3]]
    runs = [
        run_body(verifier, f"frames-{mode}-{i}", mode, prompts, 40, "tcp", app_delay_ms=1.0 * i)
        for mode in MODES
        for i in range(2)
    ]
    summaries = wait_for_runs(edge, post_runs(edge, runs))
    for run_id, summary in summaries.items():
        assert summary["status"] == "done", summary
        rows = read_csv(edge, run_id, "requests.csv")
        assert len(rows) == len(prompts), run_id
        for row in rows:
            got = [int(t) for t in row["token_ids"].split()]
            assert got == reference_tokens(prompts[int(row["request_index"])], 40), run_id
        rounds = read_csv(edge, run_id, "rounds.csv")
        assert every(float(r["t_receive_s"]) > float(r["t_send_s"]) for r in rounds), run_id
    after = verifier.get_json("/metrics")["connections_by_transport"]
    assert after["tcp"] - before["tcp"] == len(runs) and after["ws"] == before["ws"]
    assert sessions_open(verifier) == 0


async def frame_handshake(url, token):
    """The reply to a Hello, and (after a refusal) what follows it."""
    async with RawClient(url, token, "tcp") as c:
        await c.send(wire.Hello(1, "probe"))
        reply = await c.receive(timeout_s=5)
        return reply, (await c.receive(timeout_s=5) if isinstance(reply, wire.Error) else None)


def test_the_frame_transport_requires_the_token_on_its_first_frame(services):
    verifier, _, guarded, edge = services
    guarded.token = TOKEN
    before = guarded.get_json("/metrics")
    for token in (None, "wrong-token-" + "y" * 20, TOKEN[:-1]):
        reply, after = run(frame_handshake(guarded.url, token))
        assert isinstance(reply, wire.Error) and reply.code == wire.UNAUTHORIZED and reply.field == "token", reply
        assert "requires its token" in reply.message
        assert isinstance(after, ConnectionEnd)  # and the connection is closed
    welcome, _ = run(frame_handshake(guarded.url, TOKEN))
    assert isinstance(welcome, wire.Welcome)
    metrics = guarded.get_json("/metrics")
    assert metrics["errors"]["unauthorized"] - before["errors"].get("unauthorized", 0) == 3
    # refused connections allocated nothing: only the accepted one was counted
    assert metrics["connections_by_transport"]["tcp"] - before["connections_by_transport"]["tcp"] == 1
    assert "refused a frame connection" in guarded.log() and "wrong token" in guarded.log()
    # an edge without the token is refused by name; one with it runs
    body = {
        "mode": "sync",
        "gamma": 3,
        "prompts": [[5, 6, 7]],
        "max_new_tokens": 16,
        "verifier_url": guarded.url,
        "probe_count": 1,
        "transport": "tcp",
    }
    refused = wait_for_runs(services[1], post_runs(services[1], [{**body, "run_id": "no-token", "client_id": "a"}]))
    assert refused["no-token"]["status"] == "failed", refused
    assert "verifier refused the connection" in refused["no-token"]["error"]
    assert "unauthorized" in refused["no-token"]["error"] and "(no token)" in refused["no-token"]["error"]
    edge.token = TOKEN
    good = wait_for_runs(edge, post_runs(edge, [{**body, "run_id": "with-token", "client_id": "b"}]))
    assert good["with-token"]["status"] == "done", good


async def oversized(url, n_bytes):
    async with RawClient(url, TOKEN, "tcp") as c:
        c.writer.write(frames.HEADER.pack(n_bytes) + b"\0" * n_bytes)
        error = await c.receive()
        return error, await c.ask(wire.Hello(7, "after"))


async def far_too_large(url):
    async with RawClient(url, TOKEN, "tcp") as c:
        assert isinstance(await c.ask(wire.Hello(1, "x")), wire.Welcome)
        c.writer.write(frames.HEADER.pack(4 * MAX_BYTES + 1))
        return await c.receive()


def test_an_oversized_frame_is_refused_naming_the_limit_and_the_connection_goes_on(services):
    guarded = services[2]
    error, welcome = run(oversized(guarded.url, MAX_BYTES + 1))
    assert isinstance(error, wire.Error) and error.code == wire.LIMIT and error.limit == "max_message_bytes"
    assert f"message of {MAX_BYTES + 1} bytes exceeds max_message_bytes {MAX_BYTES}" == error.message
    assert isinstance(welcome, wire.Welcome)
    # beyond 4x the limit (the WebSocket's backstop too) the connection is closed
    assert isinstance(run(far_too_large(guarded.url)), ConnectionEnd)


def test_a_verifier_that_dies_mid_run_fails_the_run_with_link_down_on_either_transport(spawn, tmp_path):
    slow = {
        "name": "slow",
        "t_draft_edge_s": 0.002,
        "t_draft_server_s": 0.002,
        "t_ar_s": 0.005,
        "t_verify_base_s": 0.005,
        "t_verify_per_position_s": 0.0,
        "t_prefill_per_token_s": 0.0001,
        "batch_slope": 0.1,
    }
    errors = {}
    for transport in ("ws", "tcp"):
        verifier, edge = spawn(
            ("services.verifier", synthetic_args(ALPHA, SEED, slow)),
            ("services.edge", synthetic_args(ALPHA, SEED, slow) + ["--out-dir", str(tmp_path / transport)]),
        )
        (run_id,) = post_runs(
            edge, [run_body(verifier, f"dies-{transport}", "sync", [[5, 6, 7]] * 20, 200, transport, probe_count=1)]
        )
        for _ in range(200):  # until rounds are flowing
            if edge.get_json(f"/runs/{run_id}")["requests_done"] >= 1:
                break
            time.sleep(0.05)
        os.killpg(verifier.process.pid, signal.SIGKILL)
        summary = wait_for_runs(edge, [run_id])[run_id]
        assert summary["status"] == "failed", summary
        errors[transport] = summary["error"]
        rows = read_csv(edge, run_id, "rounds.csv")
        assert rows[-1]["error"] == summary["error"]  # recorded as a row, as always
    for transport, error in errors.items():
        assert "verifier error link_down" in error and "connection" in error, (transport, error)


def test_a_send_that_meets_the_drop_before_the_reader_does_reads_link_down():
    """The writer may see the verifier's death first (aiohttp: "Cannot write to closing
    transport"): the run still fails with link_down, and a waiting session hears it too."""

    class ClosingSocket:
        async def send_bytes(self, data):
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    async def scenario():
        channel = VerifierChannel("ws://127.0.0.1:9/", 0.0, timer=None)
        channel._ws = ClosingSocket()
        inbox = channel._inboxes[7] = asyncio.Queue()
        with pytest.raises(RunError) as raised:
            await channel.send(wire.Ping(channel.next_seq(), 0.0))
        _, error = inbox.get_nowait()
        return str(raised.value), error

    message, error = asyncio.run(scenario())
    assert message.startswith(f"verifier error {wire.LINK_DOWN}") and "connection lost" in message, message
    assert error.code == wire.LINK_DOWN and "ClientConnectionResetError" in error.message


def test_a_dropped_link_reads_link_down_both_to_a_waiting_session_and_to_the_next_send():
    """Which one sees the drop first is a race (the test above got either); the error is one."""
    from services.compute import PreciseTimer
    from services.edge import RunError, VerifierChannel

    async def main():
        channel = VerifierChannel("ws://127.0.0.1:9/ws", 0.0, PreciseTimer())
        _, inbox = channel.open_inbox()
        channel._fail("connection closed (code 1006)")
        _, waiting = inbox.get_nowait()
        with pytest.raises(RunError) as sending:
            await channel.send(wire.Hello(1, "x"))
        return waiting, str(sending.value)

    waiting, sending = asyncio.run(main())
    assert waiting.code == "link_down" and waiting.message == "connection closed (code 1006)"
    assert "verifier error link_down" in sending and "connection closed (code 1006)" in sending
