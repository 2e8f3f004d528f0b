"""The wire messages round-trip and name what is wrong with a bad one; the scheduler batches
concurrent passes, charges the profile's time for the batch, and keeps one job's failure to itself."""

import asyncio
import contextlib
import gc
import pickle
import sys
import time

import msgpack
import pytest

from dsd.costs.profiles import HardwareProfile
from services import wire
from services.compute import EmulatedDevice, PreciseTimer, ThreadDevice, freeze_startup_heap, profile_from_json
from dsd.drive.batching import BatchingConfig
from services.verifier.scheduler import Scheduler, pass_cost_s
from tests.checks import every

EXAMPLES = [
    wire.Hello(1, "edge-7"),
    wire.Ping(2, 12.5),
    wire.Open(3, 1, [1, 2], 16, 0.7, 5, 9, False),
    wire.Verify(4, 1, 2, 2**64 - 1, [5, 6, 7], probs_dense=b"\x00\x01"),
    wire.Verify(5, 1, 2, 0, [5], probs_ids=[[1, 2]], probs_values=[[0.25, 0.75]]),
    wire.Generate(6, 1, "colocated", 4),
    wire.Generate(8, 1, "ar", 0, 4),
    wire.Withdraw(9, 1),
    wire.Close(7, 1),
    wire.Welcome(1, wire.VERSION, "t", "d", 512, None, 32, 4096, 1 << 20),
    wire.Pong(2, 12.5, 3.0),
    wire.Opened(3, 1, 1, 0.0, 0.001),
    wire.Verified(4, 1, 2, 3, 1, 42, False, 0.0, 0.002, 4),
    wire.Tokens(6, 1, 0, 4, 4, [1, 2, 3, 4, 5], True, 0.0, 0.01, 1),
    wire.Closed(7, 1, 5),
    wire.Queued(8, 1, 0.0004),
    wire.Withdrawn(9, 1, [10, 11]),
    wire.Withdrawn(9, 1, []),
    wire.Error(None, None, wire.MALFORMED, None, "bad"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_msgpack(message):
    assert wire.decode(wire.encode(message)) == message


def test_a_bad_message_is_an_error_that_names_the_field():
    good = msgpack.unpackb(wire.encode(wire.Verify(4, 1, 2, 7, [5, 6])))
    cases = [
        ({**good, "draft_tokens": [5, "x"]}, wire.BAD_FIELD, "draft_tokens"),
        ({**good, "start_pos": 2.0}, wire.BAD_FIELD, "start_pos"),
        ({k: v for k, v in good.items() if k != "seq"}, wire.BAD_FIELD, "seq"),
        ({**good, "v": 0}, wire.BAD_VERSION, "v"),
        ({**good, "type": "Pickle"}, wire.UNKNOWN_TYPE, "type"),
    ]
    for body, code, field in cases:
        with pytest.raises(wire.WireError) as caught:
            wire.decode(msgpack.packb(body))
        assert (caught.value.code, caught.value.field) == (code, field)
        assert caught.value.seq == body.get("seq")
    for data in (b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb(msgpack.ExtType(1, b"x"))):
        with pytest.raises(wire.WireError) as caught:
            wire.decode(data)
        assert caught.value.code == wire.MALFORMED


PROFILE = HardwareProfile(
    "unit",
    t_draft_edge_s=0.001,
    t_draft_server_s=0.001,
    t_ar_s=0.004,
    t_verify_base_s=0.004,
    t_verify_per_position_s=0.0,
    t_prefill_per_token_s=0.0,
    batch_slope=0.5,
)


@contextlib.asynccontextmanager
async def running_scheduler(config):
    scheduler = Scheduler(config, EmulatedDevice(PreciseTimer()), PROFILE)
    scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


async def submit_together(config, jobs):
    async with running_scheduler(config) as scheduler:
        return await asyncio.gather(
            *(scheduler.submit(kind, size, work) for kind, size, work in jobs), return_exceptions=True
        ), scheduler


def test_batch_one_is_strictly_serial():
    results, scheduler = asyncio.run(
        submit_together(BatchingConfig(max_batch=1), [("verify", 2, lambda i=i: i) for i in range(4)])
    )
    assert [value for value, _ in results] == [0, 1, 2, 3]
    assert [t.batch_size for _, t in results] == [1, 1, 1, 1]
    timings = [t for _, t in results]
    # Submitted together: within one loop turn, give or take the harness (CI once had 0.5 ms
    # between two submissions, so a fixed 3.5 ms step in queueing was not always there).
    submitted = [t.end_s - t.compute_s - t.queue_s for t in timings]
    spread_s = max(submitted) - min(submitted)
    assert spread_s < 0.002, submitted
    for earlier, later in zip(timings, timings[1:]):
        # Back to back on the device's timeline, however late the harness got to each job: all
        # were ready at once, so each starts when the pass before it ended. (A pass lasts its
        # modelled 4 ms, or longer if the host stalled the harness past its end: then the reply
        # could not have gone out sooner, and the pass is charged what it took.)
        assert later.end_s - later.compute_s == pytest.approx(earlier.end_s, abs=1e-6)
        assert later.compute_s >= 0.004
        assert later.queue_s > earlier.queue_s + 0.004 - spread_s - 1e-6  # it waited out the pass


def test_concurrent_verifications_share_one_batched_pass_at_the_batch_cost():
    jobs = [("verify", 3, lambda: "v")] * 5 + [("ar", 1, lambda: "a")]
    results, scheduler = asyncio.run(submit_together(BatchingConfig(max_batch=4), jobs))
    sizes = [t.batch_size for _, t in results]
    assert sizes == [4, 4, 4, 4, 1, 1]  # the fifth waits; kinds never mix
    assert results[0][1].compute_s == pytest.approx(pass_cost_s(PROFILE, "verify", [3] * 4))
    assert pass_cost_s(PROFILE, "verify", [3] * 4) == pytest.approx(0.004 * (1 + 0.5 * 3))
    assert dict(scheduler.batch_sizes) == {4: 1, 1: 2}


def test_a_wait_window_gathers_jobs_that_arrive_later():
    async def staggered():
        scheduler = Scheduler(BatchingConfig(max_batch=8, batch_window_ms=30), EmulatedDevice(PreciseTimer()), PROFILE)
        scheduler.start()
        first = asyncio.create_task(scheduler.submit("verify", 2, lambda: 1))
        await asyncio.sleep(0.01)
        second = await scheduler.submit("verify", 2, lambda: 2)
        await scheduler.stop()
        return await first, second

    (_, t1), (_, t2) = asyncio.run(staggered())
    assert t1.batch_size == t2.batch_size == 2
    assert t1.queue_s >= 0.029 and t2.queue_s < t1.queue_s


def test_one_failing_job_does_not_touch_the_rest_of_its_batch():
    def boom():
        raise ValueError("bad block")

    results, _ = asyncio.run(
        submit_together(
            BatchingConfig(max_batch=4), [("verify", 1, lambda: 1), ("verify", 1, boom), ("verify", 1, lambda: 3)]
        )
    )
    assert results[0][0] == 1 and results[2][0] == 3
    assert isinstance(results[1], ValueError)


def test_configs_name_the_bad_field():
    with pytest.raises(ValueError, match="max_batch"):
        BatchingConfig(max_batch=0)
    with pytest.raises(ValueError, match="batch_window_ms"):
        BatchingConfig(batch_window_ms=-1)
    with pytest.raises(ValueError, match="unknown keys"):
        profile_from_json('{"t_verify_s": 1}')


def test_emulated_device_charges_the_modelled_time():
    async def one():
        start = time.perf_counter()
        result, _, compute_s = await EmulatedDevice(PreciseTimer()).run(lambda: "x", 0.005)
        return result, compute_s, time.perf_counter() - start

    result, compute_s, elapsed_s = asyncio.run(one())
    assert result == "x" and compute_s == 0.005 and elapsed_s >= 0.005


def test_the_startup_heap_is_frozen_so_full_collections_skip_it():
    import torch  # noqa: F401  (what a service has loaded before it serves)

    try:
        freeze_startup_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 50_000  # torch alone is well over that
        gc.collect()
        assert gc.get_freeze_count() == frozen  # a full collection leaves them frozen
    finally:
        gc.unfreeze()


def test_a_pass_starts_when_its_input_was_ready_not_when_the_harness_got_to_it():
    async def passes():
        device = EmulatedDevice(PreciseTimer())
        ready_s = time.perf_counter() - 0.002  # the request arrived 2 ms ago
        first = await device.run(
            lambda: "a",
            0.05,
            ready_s,
            then=lambda result, start_s, compute_s: (result, time.perf_counter() < start_s + compute_s),
        )
        done_s = time.perf_counter()
        second = await device.run(lambda: "b", 0.05, ready_s)  # ready long ago, but the device was busy
        return ready_s, first, done_s, second

    ready_s, (value, start_s, compute_s), done_s, (_, second_start_s, _) = asyncio.run(passes())
    assert start_s == ready_s and compute_s == 0.05
    assert value == ("a", True)  # ``then`` ran before the modelled time was over
    assert done_s >= ready_s + 0.05  # the pass ended on the device's timeline, not later than asked
    assert second_start_s == ready_s + 0.05


def test_clients_take_turns_so_a_backlog_does_not_delay_another_client():
    order = []

    async def flood_then_one():
        async with running_scheduler(BatchingConfig(max_batch=1)) as scheduler:
            flood = [
                asyncio.create_task(
                    scheduler.submit("verify", 1, lambda i=i: order.append(("flood", i)), client="flood")
                )
                for i in range(12)
            ]
            await asyncio.sleep(0)  # the flood is queued first
            await scheduler.submit("verify", 1, lambda: order.append(("polite", 0)), client="polite")
            await asyncio.gather(*flood)

    asyncio.run(flood_then_one())
    assert order.index(("polite", 0)) <= 2  # after at most the pass in progress and one more
    assert [i for who, i in order if who == "flood"] == list(range(12))  # a client's own jobs in order


def test_a_batch_is_filled_with_clients_taking_turns():
    order = []

    async def two_clients():
        async with running_scheduler(BatchingConfig(max_batch=2)) as scheduler:
            jobs = [scheduler.submit("verify", 1, lambda i=i: order.append(("a", i)), client="a") for i in range(3)]
            jobs.append(scheduler.submit("verify", 1, lambda: order.append(("b", 0)), client="b"))
            return await asyncio.gather(*jobs)

    results = asyncio.run(two_clients())
    assert set(order[:2]) == {("a", 0), ("b", 0)}  # one FIFO would have run a0 and a1 first
    assert [t.batch_size for _, t in results] == [2, 2, 2, 2]  # a1 and a2 share the second


def test_extension_types_and_pickles_are_refused_by_the_decoder():
    with pytest.raises(wire.WireError, match="extension type 3") as caught:
        wire.decode(msgpack.packb({"v": 1, "type": "Hello", "seq": 1, "client_id": msgpack.ExtType(3, b"x")}))
    assert caught.value.code == wire.MALFORMED
    with pytest.raises(wire.WireError) as caught:
        wire.decode(msgpack.packb({"v": 1, "type": "Hello", "seq": 1, "client_id": msgpack.Timestamp(5, 0)}))
    assert (caught.value.code, caught.value.field) == (wire.BAD_FIELD, "client_id")
    with pytest.raises(wire.WireError) as caught:
        wire.decode(pickle.dumps(wire.Hello(1, "x")))
    assert caught.value.code == wire.MALFORMED


def test_an_error_names_the_limit_it_reports():
    limit = "max_inflight_per_connection"
    error = wire.WireError(wire.BUSY, f"{limit} 4: ...", None, 7, 2, limit=limit)
    assert wire.decode(wire.encode(error.reply())) == wire.Error(7, 2, wire.BUSY, None, error.message, limit)


def test_the_precise_timer_wakes_each_waiter_at_or_after_its_deadline_in_order():
    woke = []

    async def waiter(timer, name, deadline_s):
        await timer.sleep_until(deadline_s)
        woke.append((name, time.perf_counter(), deadline_s))

    async def interleaved():
        timer = PreciseTimer()
        now = time.perf_counter()
        late = asyncio.create_task(waiter(timer, "late", now + 1.0))
        await asyncio.sleep(0.002)  # the timer is armed for "late" when earlier ones come
        early = [asyncio.create_task(waiter(timer, f"early{i}", now + 0.006 + 0.003 * i)) for i in range(4)]
        await asyncio.gather(late, *early)
        return timer, now

    timer, now = asyncio.run(interleaved())
    assert [name for name, _, _ in woke] == ["early0", "early1", "early2", "early3", "late"]
    assert every(t >= deadline for _, t, deadline in woke)
    assert woke[3][1] < now + 1.0  # re-armed for the earlier deadlines, not held until "late"
    if sys.platform.startswith("linux"):
        assert timer._timerfd is not None  # the spinner is woken by a timerfd here


@pytest.mark.parametrize("mode", ["dsd", "colocated"])
def test_saturated_clients_fall_into_two_groups_whose_passes_alternate(mode):
    """The structure dsd.analytic.latency_model.batched_capacity rests on: the scheduler starts the next
    pass at once with every job of one kind waiting, and the clients a pass served are not among
    them (a DSD client drafts on its edge, shorter than a pass here; a co-located client submits
    its next job only after its answer), so clients that did not arrive all at once settle into
    two groups that alternate: each client round holds two verification passes, of a and N - a."""
    n_clients = 5
    # DSD: long against a wake-up's lateness on a busy host (0.1-1 ms; at 1 ms a loaded run split
    # the groups). Co-located stays at 1 ms: its drafts share the device, and at 4 ms the clients
    # settle into three verification groups (3, 1, 1) instead, a structure the capacity model lacks.
    unit_s = 0.004 if mode == "dsd" else 0.001
    # The first arrivals decide the grouping for the whole run: a host stall among them once set
    # co-located at 1 ms in (3, 1, 1) from the start (clean-clone CI of af5f261), so such a run
    # is tried again, up to three times
    for _ in range(3):
        steady = _steady_verify_batch_sizes(mode, n_clients, 24, unit_s)
        assert len(steady) >= 20
        # Mostly (a host stall can delay a drafting client past a pass start, splitting a group
        # for a while): two neighbouring passes hold every client once, and no pass holds them all.
        pairs = list(zip(steady, steady[1:]))
        if sum(a + b == n_clients for a, b in pairs) >= 0.8 * len(pairs):
            break
    assert sum(a + b == n_clients for a, b in pairs) >= 0.8 * len(pairs), steady
    assert sum(size == n_clients for size in steady) <= 0.2 * len(steady), steady


def _steady_verify_batch_sizes(mode: str, n_clients: int, rounds: int, unit_s: float) -> list[int]:
    """Saturated clients' verification passes on a real device, each pass's batch size, without
    the first and last four passes."""
    verify_sizes: list[int] = []

    async def client(scheduler, i):
        await asyncio.sleep(0.3 * unit_s * i)  # arrivals a little apart, as over a network
        for _ in range(rounds):
            if mode == "dsd":
                await asyncio.sleep(unit_s)  # the edge drafting: half a one-session pass
            else:
                await scheduler.submit("draft", 2, lambda: time.sleep(unit_s), i)
            _, timing = await scheduler.submit("verify", 2, lambda: time.sleep(2 * unit_s), i)
            verify_sizes.append(timing.batch_size)

    async def main():
        # A real device (a thread running the work), as for real models: its jobs' own time counts.
        device = ThreadDevice()
        scheduler = Scheduler(BatchingConfig(max_batch=64), device, None)
        scheduler.start()
        try:
            await asyncio.gather(*(client(scheduler, i) for i in range(n_clients)))
        finally:
            await scheduler.stop()
            device.executor.shutdown()

    asyncio.run(main())
    passes = []  # one entry per pass: its batch size
    for size in verify_sizes:
        if not passes or passes[-1][1] == passes[-1][0]:
            passes.append([size, 0])
        passes[-1][1] += 1
    return [size for size, _ in passes[4:-4]]


def test_on_loop_runs_a_free_serial_real_pass_on_the_loop_thread_and_nothing_else():
    import threading

    async def main(config, on_loop, busy_first=False):
        device = ThreadDevice()
        scheduler = Scheduler(config, device, None)
        scheduler.start()
        try:
            jobs = [scheduler.submit("ar", 1, threading.get_ident, "c", on_loop=on_loop)]
            if busy_first:  # the device busy with another client's pass: not free for this one
                jobs.insert(0, scheduler.submit("ar", 1, lambda: time.sleep(0.02) or threading.get_ident(), "d"))
            results = await asyncio.gather(*jobs)
            return [ident for ident, _ in results], results[0][1], device.busy_s
        finally:
            await scheduler.stop()
            device.executor.shutdown()

    loop_thread = threading.get_ident()
    idents, timing, busy_s = asyncio.run(main(BatchingConfig(max_batch=1), True))
    assert idents == [loop_thread] and timing.batch_size == 1 and busy_s == pytest.approx(timing.compute_s)
    assert asyncio.run(main(BatchingConfig(max_batch=1), False))[0] != [loop_thread]
    assert asyncio.run(main(BatchingConfig(max_batch=4), True))[0] != [loop_thread]  # batching: the worker's
    assert asyncio.run(main(BatchingConfig(max_batch=1), True, busy_first=True))[0][1] != loop_thread


def test_the_fast_decoder_keeps_the_exact_types_and_converts_ints_to_float_fields():
    import msgpack

    def packed(**body):
        return msgpack.packb({"v": wire.VERSION, **body}, use_bin_type=True)

    pong = wire.decode(packed(type="Pong", seq=1, t_send_s=3, t_server_s=2.5))  # held_s: its default
    assert pong == wire.Pong(1, 3.0, 2.5) and type(pong.t_send_s) is float
    with pytest.raises(wire.WireError, match=r"Verify.seq: expected int, got bool"):
        wire.decode(packed(type="Verify", seq=True, session=1, start_pos=0, base_digest=0, draft_tokens=[1]))
    with pytest.raises(wire.WireError, match=r"Verify.draft_tokens: expected list, got list \[1, 2.0\]"):
        wire.decode(packed(type="Verify", seq=1, session=1, start_pos=0, base_digest=0, draft_tokens=[1, 2.0]))
    with pytest.raises(wire.WireError, match=r"Verify.probs_ids: expected"):
        wire.decode(
            packed(type="Verify", seq=1, session=1, start_pos=0, base_digest=0, draft_tokens=[1], probs_ids=[[1, "x"]])
        )
    with pytest.raises(wire.WireError, match=r"Verify: missing field 'start_pos'"):
        wire.decode(packed(type="Verify", seq=1, session=1, base_digest=0, draft_tokens=[1]))
