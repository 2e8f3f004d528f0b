"""services.spinwait: the loop polls for an expected message only inside a bounded window, the
window is configured and checked like every config, and the services record that it is on."""

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsd.drive.generation import generate_ar
from dsd.pair_manifest import MANIFEST_FORMAT, write_manifest
from dsd.speculation.stopping import StopRule
from dsd.backends.torch_lm import TorchLM, TorchLMConfig
from services import spinwait
from tests.services.harness import post_runs, read_csv, wait_for_runs
from tests.torch_pairs import tiny_pair

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"spin_us": -1}, "spin_us"),
        ({"spin_us": 1.5}, "spin_us"),
        ({"spin_us": True}, "spin_us"),
        ({"spin_us": spinwait.MAX_SPIN_US + 1}, "spin_us"),
        ({"spin_us": 100, "lead_us": -5}, "lead_us"),
        ({"spin_us": 100, "lead_us": 200}, "lead_us"),
    ],
)
def test_spin_config_refuses_bad_values_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        spinwait.SpinConfig(**fields)


def test_off_by_default_a_plain_loop_that_never_polls():
    config = spinwait.SpinConfig()
    assert not config.on and spinwait.SpinConfig(0, 4000).lead_us == 4000  # off: any lead is moot
    loop = spinwait.new_event_loop(config)
    try:
        assert spinwait.selector_of(loop) is None
    finally:
        loop.close()
    selector = spinwait.SpinSelector(config)
    selector.expect(time.perf_counter())  # off: opens nothing
    assert selector.windows == 0
    selector.close()


def test_a_window_polls_at_most_spin_us_then_blocks():
    """Nothing comes: the wait polls for the window's length only (CPU time too), then blocks."""
    selector = spinwait.SpinSelector(spinwait.SpinConfig(spin_us=3000, lead_us=1000))
    a, b = socket.socketpair()
    try:
        selector.register(a, 1)  # EVENT_READ
        selector.expect(time.perf_counter() + 0.001)  # the window: now .. now + 3 ms
        cpu_before_s, started_s = time.thread_time(), time.perf_counter()
        assert selector.select(0.03) == []
        waited_s, cpu_s = time.perf_counter() - started_s, time.thread_time() - cpu_before_s
        assert waited_s >= 0.029  # it did block for the rest of the timeout
        assert selector.spun_s <= 0.0035 and cpu_s <= 0.0035 + 0.003, (selector.stats(), cpu_s)
        assert selector.caught == 0
        assert selector.select(0.005) == []  # the window is closed: no more polling
        assert selector.spun_s <= 0.0035
    finally:
        selector.close()
        a.close()
        b.close()


def _sender(sock: socket.socket, at_s: float) -> None:
    time.sleep(max(0.0, at_s - time.perf_counter()))
    sock.send(struct.pack("<d", time.perf_counter()))


def _one_expected_message(spin_us: int, lead_us: int) -> spinwait.SpinSelector:
    """A message sent by another process (no GIL between sender and poller) 50 ms from now, the
    loop told when it is due; returns the loop's selector after it was read."""
    a, b = socket.socketpair()
    loop = spinwait.new_event_loop(spinwait.SpinConfig(spin_us=spin_us, lead_us=lead_us))
    selector = spinwait.selector_of(loop)
    due_s = time.perf_counter() + 0.05
    pid = os.fork()
    if pid == 0:
        try:
            a.close()
            _sender(b, due_s)
        finally:
            os._exit(0)
    b.close()

    async def main() -> bytes:
        got = loop.create_future()
        loop.add_reader(a.fileno(), lambda: got.done() or got.set_result(a.recv(8)))
        selector.expect(due_s)
        return await asyncio.wait_for(got, 5)

    try:
        assert len(loop.run_until_complete(main())) == 8
    finally:
        loop.close()
        a.close()
        os.waitpid(pid, 0)
    return selector


ONE_WINDOW = """import json, sys
sys.path.insert(0, sys.argv[1])
from tests.services.test_spinwait import _one_expected_message
selector = _one_expected_message(spin_us=4000, lead_us=2000)
print(json.dumps({**selector.stats(), "spun_s": selector.spun_s}))
"""


def _one_window_in_a_fresh_interpreter() -> dict:
    """One expected message's window, polled in a new Python process: nothing an earlier test
    left in the pytest process (threads, timers, signal handlers; in the full suite the window
    caught nothing three times running while it caught alone every time) reaches the poller."""
    done = subprocess.run(
        [sys.executable, "-c", ONE_WINDOW, str(REPO)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_message_due_in_the_window_is_caught_while_polling():
    for _ in range(3):  # a loaded host may deliver it after the window: then it blocks as usual
        stats = _one_window_in_a_fresh_interpreter()
        assert stats["windows"] == 1 and stats["spun_s"] <= 0.0045, stats
        if stats["caught"]:
            break
    assert stats["caught"] == 1, stats


def test_cancel_closes_the_window_and_gaps_expect_their_median():
    selector = spinwait.SpinSelector(spinwait.SpinConfig(spin_us=2000, lead_us=500))
    try:
        selector.expect(time.perf_counter() + 0.0002)
        selector.cancel()
        started_s = time.perf_counter()
        assert selector.select(0.002) == [] and selector.spun_s == 0
        assert time.perf_counter() - started_s >= 0.0015
    finally:
        selector.close()
    gaps = spinwait.Gaps(keep=3)
    assert gaps.expected_s() is None
    for gap in (0.010, -1.0, 0.012, 0.020, 0.011):  # a negative gap is no measurement
        gaps.add(gap)
    assert gaps.expected_s() == 0.012  # the median of the last three
    with pytest.raises(ValueError, match="keep"):
        spinwait.Gaps(keep=0)


@pytest.mark.parametrize("module", ["verifier", "edge"])
def test_services_refuse_a_bad_spin_flag_naming_it(module, capsys):
    import importlib

    service = importlib.import_module(f"services.{module}")
    with pytest.raises(SystemExit):
        service.build(["--port", "1", "--profile", "toy-edge-cloud", "--spin-us", "100", "--spin-lead-us", "200"])
    assert "lead_us (200) must not exceed spin_us (100)" in capsys.readouterr().err


# ---- on real models: same tokens, and the polling is on the record ---------------------------


@pytest.fixture(scope="module")
def spinning(spawn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-pair-spin")
    draft, target = tiny_pair(seed=4, noise=0.05)
    target.model.save_pretrained(folder / "target")
    draft.model.save_pretrained(folder / "draft")
    write_manifest(folder, {"format": MANIFEST_FORMAT})
    backend = [
        "--backend-json",
        json.dumps({"kind": "hf", "pair_path": str(folder)}),
        "--spin-us",
        "1500",
        "--spin-lead-us",
        "500",
    ]
    verifier, edge = spawn(
        ("services.verifier", backend),
        ("services.edge", backend + ["--out-dir", str(tmp_path_factory.mktemp("edge-spin"))]),
    )
    return verifier, edge, TorchLM.load(TorchLMConfig(str(folder / "target")))


def test_a_polling_sync_run_emits_the_greedy_tokens_and_records_its_polling(spinning):
    verifier, edge, target = spinning
    prompts = [[5, 17, 42, 8], [60, 3, 9]]
    run = {
        "run_id": "spin-sync",
        "client_id": "c",
        "mode": "sync",
        "gamma": 3,
        "prompts": prompts,
        "max_new_tokens": 40,
        "stop_at_eos": False,
        "verifier_url": verifier.url,
        "probe_count": 1,
        "probe_interval_ms": 1000,
    }
    summaries = wait_for_runs(edge, post_runs(edge, [run]))
    summary = summaries[run["run_id"]]
    assert summary["status"] == "done", summary
    for row in read_csv(edge, run["run_id"], "requests.csv"):
        expected = generate_ar(target, prompts[int(row["request_index"])], StopRule(40, None), seq_id="ref").tokens
        assert [int(t) for t in row["token_ids"].split()] == expected
    # Recorded: the run's sidecar, its summary (the edge's loop) and the verifier's metrics.
    sidecar = json.loads((__import__("pathlib").Path(summary["folder"]) / "run.json").read_text())
    assert sidecar["spin"] == {"spin_us": 1500, "lead_us": 500}
    edge_spin = edge.get_json(f"/runs/{run['run_id']}")["spin"]
    metrics = verifier.get_json("/metrics")
    for stats in (edge_spin, metrics["spin"]):
        assert stats["spin_us"] == 1500 and stats["windows"] > 0  # it aimed windows at the messages
        assert stats["spun_ms"] <= 1.5 * stats["windows"] + 1e-6  # bounded: spin_us a window
    assert metrics["verifies_inline"] > 0


def test_the_edge_aims_only_while_its_run_is_alone_and_the_verifier_serves_nobody_else():
    from dsd.backends.protocol import SamplingParams
    from services import wire
    from services.compute import PreciseTimer
    from services.edge import SessionTransport, VerifierChannel

    loop = spinwait.new_event_loop(spinwait.SpinConfig(spin_us=2000, lead_us=1000))
    selector = spinwait.selector_of(loop)

    async def main() -> list[int]:
        # an app delay: frames wait in the channel's own queue (no socket needed to send them)
        channel = VerifierChannel("ws://127.0.0.1:9/ws", 0.001, PreciseTimer())
        channel.alone = lambda: True
        transport = SessionTransport(channel, 1, asyncio.Queue(), None, SamplingParams())
        transport.arrival(time.perf_counter(), wire.Opened(1, 1, 3, 0.0, 0.0))
        windows = []

        async def block(queue_s: float = 0.0, batch_size: int = 1) -> None:
            (sent_s,) = await transport.send([b"block"])
            windows.append(selector.windows)
            transport.arrival(sent_s + 0.01, wire.Verified(2, 1, 3, 4, 4, 7, False, queue_s, 0.009, batch_size))

        await block()  # no verdict timed yet: nothing to aim at
        await block()  # aimed at 10 ms after the send
        await block(queue_s=0.003)  # aimed; its verdict waited behind another client's pass
        await block()  # the verifier serves someone else lately: not aimed
        channel.verdicts_shared.clear()
        channel.alone = lambda: False
        await block()  # another run in this process: not aimed
        return windows

    try:
        assert loop.run_until_complete(main()) == [0, 1, 2, 2, 2]
    finally:
        loop.close()
