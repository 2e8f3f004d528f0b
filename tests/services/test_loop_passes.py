"""Passes on the event loop's own thread (the lean real-model path): they give the same tokens,
they run only when nothing else can need the loop, and what comes in during one is stamped with
when it arrived (services.verifier.frame_stamps), so queue waits and probed round trips stay what they were."""

import asyncio
import json
import socket
import time

import pytest

from dsd.backends.factory import DEFAULT_PAIR
from dsd.backends.torch_lm import TorchLM, TorchLMConfig
from dsd.drive.generation import generate_ar
from dsd.pair_manifest import MANIFEST_FORMAT, write_manifest
from dsd.sequence import TokenSequence
from dsd.speculation.stopping import StopRule
from services import wire
import services.verifier.frame_stamps as frame_stamps
from dsd.costs.profiles import get_profile
from services.compute import EmulatedDevice, PreciseTimer, ThreadDevice
from dsd.drive.batching import BatchingConfig
from services.verifier.scheduler import Scheduler
from tests.services.harness import RawClient, post_runs, read_csv, wait_for_runs
from tests.torch_pairs import tiny_pair
from tests.checks import every


def socket_pair() -> tuple[socket.socket, socket.socket]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    return client, server


def test_pending_since_is_when_the_waiting_bytes_arrived_and_none_when_nothing_waits():
    client, server = socket_pair()
    watched = frame_stamps.watch(server)
    try:
        floor_s = time.perf_counter() - 1.0
        assert frame_stamps.pending_since_s(watched, floor_s) is None
        # The kernel turns receive stamps on in the background when a first socket asks for
        # them; until then a segment has none (pending_since_s then falls back to the floor).
        client.send(b"w")
        time.sleep(0.05)
        assert server.recv(1) == b"w"
        before_s = time.perf_counter()
        client.send(b"frame")
        after_s = time.perf_counter()
        time.sleep(0.03)  # the loop "busy": the bytes wait unread
        since_s = frame_stamps.pending_since_s(watched, floor_s)
        assert before_s - 0.002 <= since_s <= after_s + 0.002  # the kernel's stamp, not now
        assert frame_stamps.pending_since_s(watched, after_s + 0.01) == pytest.approx(after_s + 0.01)  # floored
        assert server.recv(16) == b"frame"  # peeking consumed nothing
        assert frame_stamps.pending_since_s(watched, floor_s) is None
    finally:
        watched.close()
        client.close()
        server.close()
    assert frame_stamps.watch(None) is None and frame_stamps.pending_since_s(None, 0.0) is None


def test_a_loop_pass_is_marked_reports_its_start_and_arrived_s_counts_the_wait_before_it():
    async def main():
        device = ThreadDevice()
        starts = []
        scheduler = Scheduler(BatchingConfig(max_batch=1), device, None, after_loop_pass=starts.append)
        scheduler.start()
        try:
            _, on_loop = await scheduler.submit("verify", 4, lambda: time.sleep(0.005), "c", on_loop=True)
            arrived_s = time.perf_counter() - 0.05
            _, held = await scheduler.submit("verify", 4, lambda: None, "c", arrived_s=arrived_s)
            return on_loop, held, starts, scheduler.loop_passes
        finally:
            await scheduler.stop()
            device.executor.shutdown()

    on_loop, held, starts, loop_passes = asyncio.run(main())
    assert on_loop.on_loop and not held.on_loop and loop_passes == 1
    assert starts == [pytest.approx(on_loop.end_s - on_loop.compute_s)] and on_loop.compute_s >= 0.005
    assert held.queue_s >= 0.05  # the wait before its (late) read counts as queue


# ---- the services on real models -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(spawn, tmp_path_factory):
    """A tiny real pair, strictly serial (max-batch 1: the scheduler's on-loop path)."""
    folder = tmp_path_factory.mktemp("tiny-pair-serial")
    draft, target = tiny_pair(seed=4, noise=0.05)
    target.model.save_pretrained(folder / "target")
    draft.model.save_pretrained(folder / "draft")
    write_manifest(folder, {"format": MANIFEST_FORMAT})
    backend = ["--backend-json", json.dumps({"kind": "hf", "pair_path": str(folder)})]
    verifier, edge = spawn(
        ("services.verifier", backend + ["--max-tokens-per-session", "200"]),
        ("services.edge", backend + ["--out-dir", str(tmp_path_factory.mktemp("edge-serial"))]),
    )
    return verifier, edge, TorchLM.load(TorchLMConfig(str(folder / "target")))


PROMPTS = [[5, 17, 42, 8], [60, 3, 9], [1, 2, 3, 4, 5, 6, 7]]


@pytest.mark.parametrize("mode", ["sync", "pipelined", "colocated", "ar"])
def test_one_client_on_loop_passes_emit_the_target_greedy_tokens(tiny, mode):
    verifier, edge, target = tiny
    before = verifier.get_json("/metrics")["passes_on_loop"]
    run = {
        "run_id": f"loop-{mode}",
        "client_id": "c",
        "mode": mode,
        "gamma": 3,
        "prompts": PROMPTS,
        "max_new_tokens": 24,
        "stop_at_eos": False,
        "verifier_url": verifier.url,
        "probe_count": 1,
        "probe_interval_ms": 5,
    }
    summaries = wait_for_runs(edge, post_runs(edge, [run]))
    assert summaries[run["run_id"]]["status"] == "done", summaries
    stop = StopRule(24, None)
    for row in read_csv(edge, run["run_id"], "requests.csv"):
        expected = generate_ar(target, PROMPTS[int(row["request_index"])], stop, seq_id="ref").tokens
        assert [int(t) for t in row["token_ids"].split()] == expected
    rounds = read_csv(edge, run["run_id"], "rounds.csv")
    assert every(float(r["server_queue_s"]) >= 0 and float(r["rtt_probe_ms"]) >= 0 for r in rounds)
    if mode != "pipelined":  # one session, nothing sent during a pass: the loop's own thread
        assert verifier.get_json("/metrics")["passes_on_loop"] > before


def test_a_lone_sessions_verify_is_served_by_the_reader_with_the_same_replies(tiny):
    """The reader serves a lone idle session's Verify itself (no hand-over to the session's task):
    verdicts, stale answers, errors and the Close that follows are what the task would send."""
    verifier, _edge, target = tiny
    prompt = [5, 17, 42, 8]
    expected = generate_ar(target, prompt, StopRule(8, None), seq_id="ref-inline").tokens

    async def main():
        async with RawClient(verifier.url) as client:
            await open_session(client, 1, prompt)
            before = verifier.get_json("/metrics")
            await client.send(verify(client, 1, prompt, [], expected[:3]))
            verdict = await client.receive()
            await client.send(verify(client, 1, prompt, [], expected[:3]))  # sent again: stale now
            stale = await client.receive()
            bad = verify(client, 1, prompt, [], [target.vocab_size])  # out of the vocabulary
            await client.send(bad)
            error = await client.receive()
            await client.send(wire.Close(client.next_seq(), 1))
            closed = await client.receive()
            return before, verdict, stale, error, closed, verifier.get_json("/metrics")

    before, verdict, stale, error, closed, after = asyncio.run(main())
    assert (verdict.accepted, verdict.next_token, verdict.stale) == (3, expected[3], False)
    assert stale.stale and stale.batch_size == 0
    assert isinstance(error, wire.Error) and error.code == wire.OUT_OF_RANGE and error.field == "draft_tokens"
    assert isinstance(closed, wire.Closed) and closed.generated == 4
    assert after["verifies_inline"] - before["verifies_inline"] == 2  # the verdict and the stale one
    assert after["passes_on_loop"] - before["passes_on_loop"] == 1
    assert after["sessions_open"] == 0


def test_runs_on_loop_only_for_a_free_strictly_serial_real_device():
    async def main():
        real = Scheduler(BatchingConfig(max_batch=1), ThreadDevice(), None)
        batching = Scheduler(BatchingConfig(max_batch=2), ThreadDevice(), None)
        emulated = Scheduler(BatchingConfig(max_batch=1), EmulatedDevice(PreciseTimer()), get_profile("toy-edge-cloud"))
        seen = []
        await real.submit("verify", 4, lambda: seen.append(real.runs_on_loop), "c", on_loop=True)
        return real.runs_on_loop, batching.runs_on_loop, emulated.runs_on_loop, seen

    assert asyncio.run(main()) == (True, False, False, [False])  # not while its own pass runs


# ---- what comes in during a loop pass (the default pair: a pass long enough to send into) -----


@pytest.fixture(scope="module")
def default_verifier(spawn):
    (verifier,) = spawn(
        ("services.verifier", ["--backend-json", json.dumps({"kind": "hf", "pair_path": str(DEFAULT_PAIR)})])
    )
    return verifier


async def open_session(client: RawClient, session: int, prompt: list[int]) -> None:
    await client.send(wire.Open(client.next_seq(), session, prompt, 64, 0.0, None, 0, False))
    assert isinstance(await client.receive(), wire.Opened)


async def greedy_tokens(client: RawClient, prompt: list[int], n: int) -> list[int]:
    """The target's greedy continuation, from a cloud-AR session of the verifier itself."""
    await open_session(client, 99, prompt)
    await client.send(wire.Generate(client.next_seq(), 99, "ar", 0))
    tokens = []
    while len(tokens) < n:
        tokens += (await client.receive()).tokens
    await client.send(wire.Close(client.next_seq(), 99))
    while not isinstance(await client.receive(), wire.Closed):
        pass
    return tokens


def verify(client: RawClient, session: int, prompt: list[int], done: list[int], block: list[int]) -> wire.Verify:
    committed = TokenSequence(prompt + done)
    return wire.Verify(client.next_seq(), session, len(committed), committed.digest_at(len(committed)), block)


BLOCK = 8  # tokens a block: the default pair's pass is a few ms on a fast CPU


async def pipelined_block_and_ping(verifier) -> tuple:
    """A sync block (alone on the verifier: a loop pass), then, while it is verified, a ping and
    the next block on the guess that all is accepted (a pipelined edge). Returns both verdicts,
    the pong, the ping's round trip as measured here, how many loop passes the blocks took, and
    how long after the first block the ping was sent (a third of a calibration block's pass)."""
    prompt = [11, 23, 5, 42, 7, 19]
    async with RawClient(verifier.url) as client:
        tokens = await greedy_tokens(client, prompt, 3 * BLOCK + 2)
        await open_session(client, 1, prompt)
        await client.send(verify(client, 1, prompt, [], tokens[:BLOCK]))
        wait_s = (await client.receive()).compute_s / 3
        done = tokens[: BLOCK + 1]
        before = verifier.get_json("/metrics")["passes_on_loop"]
        await client.send(verify(client, 1, prompt, done, tokens[len(done) : len(done) + BLOCK]))
        await asyncio.sleep(wait_s)  # the pass has begun: what follows waits unread
        t_ping_s = time.perf_counter()  # the ping and the block in one segment: a pass ends before or after both
        done_next = tokens[: len(done) + BLOCK + 1]
        await client.send_together(
            wire.Ping(client.next_seq(), t_ping_s),
            verify(client, 1, prompt, done_next, tokens[len(done_next) : len(done_next) + BLOCK]),
        )
        replies = {}
        while len(replies) < 3:
            reply = await client.receive()
            replies[type(reply).__name__ + str(getattr(reply, "start_pos", ""))] = (reply, time.perf_counter())
        loop_passes = verifier.get_json("/metrics")["passes_on_loop"] - before
    first, second = (replies[f"Verified{len(prompt) + len(d)}"][0] for d in (done, done_next))
    pong, t_pong_s = replies["Pong"]
    return first, second, pong, t_pong_s - t_ping_s, loop_passes, wait_s


@pytest.mark.model
def test_what_comes_in_during_a_loop_pass_counts_its_wait_as_queue_and_held(default_verifier):
    for _ in range(3):  # a loaded host may wake the client after the pass, or read the pong
        # milliseconds late (the clean-clone CI once: 4 ms of a 6 ms round trip): try again
        first, second, pong, rtt_s, loop_passes, wait_s = asyncio.run(pipelined_block_and_ping(default_verifier))
        assert (first.accepted, second.accepted, second.stale) == (BLOCK, BLOCK, False)
        assert pong.held_s <= rtt_s
        if pong.held_s > 0 and rtt_s - pong.held_s < 0.5 * rtt_s:
            break
    assert pong.held_s > 0, f"in 3 tries no ping came in during a pass of {first.compute_s:.4f} s"
    # The first block ran on the loop's thread; the second, read after it, on the device thread
    # (its connection pipelines now), and its queue wait counts from its arrival, during the first.
    assert loop_passes == 1, (first, second, pong)
    assert second.queue_s >= 0.5 * (first.compute_s - wait_s), (first, second)
    # The ping waited unread behind the first pass: its answer says so, and what is left of its
    # round trip is the link and the Python around it.
    assert rtt_s - pong.held_s < 0.5 * rtt_s, (rtt_s, pong)


@pytest.mark.model
def test_a_second_open_session_keeps_every_pass_on_the_device_thread(default_verifier):
    async def main():
        prompt = [3, 1, 4, 1, 5, 9]
        async with RawClient(default_verifier.url) as client:
            tokens = await greedy_tokens(client, prompt, 4)
            await open_session(client, 1, prompt)
            await open_session(client, 2, prompt)  # open and idle: its messages may come any time
            before = default_verifier.get_json("/metrics")["passes_on_loop"]
            await client.send(verify(client, 1, prompt, [], tokens[:4]))
            verdict = await client.receive()
            return verdict, before, default_verifier.get_json("/metrics")["passes_on_loop"]

    verdict, before, after = asyncio.run(main())
    assert isinstance(verdict, wire.Verified) and verdict.accepted == 4
    assert after == before


def test_the_edge_drafts_on_the_loop_thread_only_when_nothing_can_arrive_meanwhile():
    import threading

    from dsd.backends.protocol import SamplingParams
    from services.compute import PreciseTimer
    from services.edge import DraftDevice, SessionTransport, VerifierChannel

    async def main():
        device = ThreadDevice()
        channel = VerifierChannel("ws://127.0.0.1:9/ws", 0.0, PreciseTimer())
        transport = SessionTransport(channel, 1, asyncio.Queue(), None, SamplingParams())
        drafter = DraftDevice(device, 0.0, transport)
        where = []

        async def draft():
            idents = []
            then, start_s = await drafter.draft(lambda: idents.append(threading.get_ident()), 4, lambda: "then")
            assert then == "then" and start_s <= time.perf_counter()
            where.append(idents == [threading.get_ident()])

        device.runs = 1
        await draft()  # its Opened may come any moment
        transport.arrival(time.perf_counter(), wire.Opened(1, 1, 3, 0.0, 0.0))
        await draft()  # quiet: the loop's own thread
        channel._waiting[7] = asyncio.get_running_loop().create_future()
        await draft()  # a ping waits for its Pong
        channel._waiting.clear()
        device.runs = 2
        await draft()  # another run shares the process
        device.executor.shutdown()
        return where

    assert asyncio.run(main()) == [False, True, False, False]
