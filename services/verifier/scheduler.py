"""The verifier's one device, shared by every session: a queue of model passes, batched.

A job is one pass of one session: a prefill, an AR step, a co-located draft block or a
verification, submitted on behalf of a client (the verifier's connection). The worker picks the
first job of a pass from the client served least recently, and fills the batch the same way with
jobs of the same kind, up to ``max_batch``, waiting until the first has waited
``batch_window_ms`` if the batch is not full; then it runs them as one pass. ``max_batch = 1``
is strictly serial, like one busy accelerator.

Fairness: clients take turns, so a client that floods the queue delays another client's job by
at most one pass per other waiting client, instead of by its whole backlog as in one FIFO. A
client's own jobs run oldest first (of a kind). A client that had nothing queued goes first.

What a batched pass costs:
  emulated (synthetic backend): the profile's time for the batch: t_verify_s(max gamma, b),
      t_ar_batch_s(b), gamma * t_draft_server_s scaled like t_ar_batch_s; prefills never batch.
  real models: the measured time of the pass. Jobs that are ``ForwardJob``s on one model (the
      verifier's verifications and AR steps) run as one batched forward pass over every
      session's new positions, each session keeping its own KV cache (dsd.backends.torch_lm);
      ``DraftJob``s on one model (co-located draft blocks) run as one batched pass of the draft
      per draft step (dsd.speculation.drafting.run_draft_jobs); prefills run one after another.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from dsd.backends.protocol import ForwardJob, run_jobs
from dsd.speculation.drafting import DraftJob, run_draft_jobs
from dsd.modes import AR
from dsd.costs.profiles import HardwareProfile
from dsd.costs.compute_times import DRAFT, PREFILL, VERIFY, pass_cost_s
from dsd.drive.batching import BatchingConfig

KINDS = (PREFILL, AR, DRAFT, VERIFY)  # AR: one step of cloud AR (dsd.modes)


@dataclass(frozen=True)
class PassTiming:
    queue_s: float  # ready (submitted) until its pass started
    compute_s: float  # the pass (the whole batch's)
    batch_size: int
    end_s: float = 0.0  # when the pass ended on the device's timeline (perf_counter)
    on_loop: bool = False  # it ran on the event loop's own thread (Scheduler.submit's on_loop)


@dataclass
class _Job:
    kind: str
    size: int
    work: Callable[[], object]
    submitted_s: float
    future: asyncio.Future
    client: Hashable
    prepare: Callable[[object, PassTiming], object] | None = None


class Scheduler:
    def __init__(
        self,
        config: BatchingConfig,
        device,
        profile: HardwareProfile | None,
        after_loop_pass: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.profile = profile  # None: real models, the work's own time counts
        # Called with the pass's start right after a pass on the loop's thread, before the loop
        # reads anything: what arrived meanwhile was not read, and the service may stamp it.
        self.after_loop_pass = after_loop_pass
        self.batch_sizes: Counter[int] = Counter()
        self.passes: Counter[str] = Counter()
        self.loop_passes = 0  # of them, run on the loop's own thread (submit's on_loop)
        self._queues: dict[Hashable, deque[_Job]] = {}  # per client with queued jobs
        self._last_served: dict[Hashable, int] = {}  # per client with queued jobs: its last turn
        self._turns = 0
        self._busy = False  # a pass is being gathered or run (by the worker or inline)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._worker(), name="scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def submit(
        self,
        kind: str,
        size: int,
        work: Callable[[], object],
        client: Hashable = None,
        ready_s: float | None = None,
        prepare: Callable[[object, PassTiming], object] | None = None,
        on_loop: bool = False,
        arrived_s: float | None = None,
    ) -> tuple[Any, PassTiming]:
        """Run ``work`` in a pass of this kind for ``client``; returns (its result, the pass timing).

        ``ready_s``: when the job could first have run (its request's arrival, or the end of the
        pass it follows), on perf_counter's clock; default now. On an emulated device its pass may
        start there and its queue wait counts from there; on a real one (``starts_when_ready``
        false) the harness's own work before the submit stays out of the queue wait, as before.
        ``prepare(result, timing)``, if given, runs as soon as the result is known and its return
        is handed back instead, at the pass's end: a reply built while the modelled time runs.
        ``on_loop``: the caller vouches that nothing else needs this event loop during the pass
        (one session open, and it sends nothing while served); then a real device's pass that
        would run at once, strictly serial, runs on the loop's own thread, which saves the two
        thread wake-ups of the hand-off to the device thread and back (about 0.2-0.5 ms a pass on
        a busy 2-core host, more than all the Python work around it). It returns without a loop
        turn: the caller must yield to the loop before its next such pass (e.g. await its reply's
        send, then the next message), or nothing that came in would be read meanwhile. Such a
        pass's ``prepare`` sees ``timing.on_loop`` true and may send its reply from inside the
        pass (nothing else runs on the loop meanwhile; ``after_loop_pass`` has run before it).
        ``arrived_s``: when the job's message reached this process if the loop read it late
        (it came in during a pass on the loop's thread, services.verifier.frame_stamps); its queue wait counts
        from there on any device, as it would have had the loop been free to read it.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        submitted_s = time.perf_counter()
        if ready_s is not None and self.device.starts_when_ready:
            submitted_s = min(ready_s, submitted_s)
        if arrived_s is not None:
            submitted_s = min(arrived_s, submitted_s)
        if on_loop and self.runs_on_loop:
            return self._run_on_loop(kind, work, submitted_s, prepare)
        job = _Job(kind, size, work, submitted_s, asyncio.get_running_loop().create_future(), client, prepare)
        if self._runs_now:
            # The device is free, nobody waits and nothing could join a batch: run the pass
            # here, which saves the hand-off to the worker task and back (one loop turn each).
            # On the loop's thread the caller gets the result without a loop turn, so that it can
            # send its reply first; it then yields to the loop (what came in meanwhile is read).
            self._busy = True
            await self._pass([job])
            return job.future.result()
        if client not in self._queues:
            self._queues[client] = deque()
            self._last_served[client] = -1  # nothing was queued: it goes first
        self._queues[client].append(job)
        self._wake.set()
        return await job.future

    def _run_on_loop(
        self,
        kind: str,
        work: Callable[[], object],
        submitted_s: float,
        prepare: Callable[[object, PassTiming], object] | None,
    ) -> tuple[object, PassTiming]:
        """One job's pass on the loop's own thread (``runs_on_loop``), without a job, a future or a
        batch: the same result, timing, counters and failures as a pass through ``_pass``, in fewer
        steps. After a model pass the CPU's caches hold the model, not this code, and every step
        here costs tens of microseconds; a ``prepare`` that sends the reply (PassTiming.on_loop)
        sends it before the bookkeeping."""

        def timed(outcome: tuple[bool, object], start_s: float, compute_s: float):
            if self.after_loop_pass is not None:  # what came in during the pass, before the reply goes
                self.after_loop_pass(start_s)
            timing = PassTiming(start_s - submitted_s, compute_s, 1, start_s + compute_s, True)
            ok, value = outcome
            return (_capture(lambda: prepare(value, timing)) if ok and prepare else outcome), timing

        self._busy = True
        try:
            (outcome, timing), _, _ = self.device.run_here(lambda: _capture(work), timed)
        finally:
            self._busy = False
        self.loop_passes += 1
        self.batch_sizes[1] += 1
        self.passes[kind] += 1
        if self._queues:
            self._wake.set()
        ok, value = outcome
        if not ok:
            raise value
        return value, timing

    @property
    def _runs_now(self) -> bool:
        """A job submitted now would run at once, in the submitting task (strictly serial, the
        device free, nobody waiting)."""
        return self.config.max_batch == 1 and not self._busy and not self._queues

    @property
    def runs_on_loop(self) -> bool:
        """A job submitted now with ``on_loop`` would run on the loop's own thread (a real device)."""
        return self.profile is None and self._runs_now

    def _pop_fair(self) -> _Job:
        """The oldest job of the client served least recently (every queue in _queues holds one)."""
        client = min(self._queues, key=self._last_served.__getitem__)
        job = self._queues[client][0]
        self._take(client, job)
        return job

    def _take(self, client: Hashable, job: _Job) -> None:
        queue = self._queues[client]
        queue.remove(job)
        self._turns += 1
        self._last_served[client] = self._turns
        if not queue:
            del self._queues[client], self._last_served[client]

    async def _worker(self) -> None:
        while True:
            if not self._queues or self._busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            self._busy = True
            try:
                batch = await self._take_batch()
            except BaseException:
                self._busy = False
                raise
            await self._pass(batch)

    async def _pass(self, batch: list[_Job]) -> None:
        """Run one pass (self._busy set by the caller); then the worker may take the next."""
        try:
            await self._run(batch)
        except Exception as exc:  # the device itself failed: fail this batch, keep serving
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(exc)
        finally:
            self._busy = False
            if self._queues:
                self._wake.set()

    async def _take_batch(self) -> list[_Job]:
        first = self._pop_fair()
        batch = [first]
        limit = 1 if first.kind == "prefill" else self.config.max_batch
        deadline_s = first.submitted_s + self.config.batch_window_ms / 1000
        while len(batch) < limit:
            self._collect(batch, limit)
            remaining_s = deadline_s - time.perf_counter()
            if len(batch) >= limit or remaining_s <= 0:
                break
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), remaining_s)
            except TimeoutError:
                self._collect(batch, limit)
                break
        return batch

    def _collect(self, batch: list[_Job], limit: int) -> None:
        """Move queued jobs of the batch's kind into it, clients taking turns: one job each,
        least recently served first, then round again (one sort a round, not a scan a job)."""
        kind = batch[0].kind
        while len(batch) < limit:
            took = False
            for client in sorted(self._queues, key=self._last_served.__getitem__):
                job = next((j for j in self._queues[client] if j.kind == kind), None)
                if job is not None:
                    self._take(client, job)
                    batch.append(job)
                    took = True
                    if len(batch) >= limit:
                        return
            if not took:
                return

    async def _run(self, batch: list[_Job]) -> None:
        kind = batch[0].kind
        cost_s = pass_cost_s(self.profile, kind, [j.size for j in batch]) if self.profile else 0.0
        # The pass could start once its last job was there, or, for a batch that waited for more
        # jobs and did not fill, once the window had passed.
        ready_s = max(job.submitted_s for job in batch)
        if len(batch) < self.config.max_batch and batch[0].kind != "prefill":
            ready_s = max(ready_s, batch[0].submitted_s + self.config.batch_window_ms / 1000)

        def timed(outcomes: list, start_s: float, compute_s: float) -> tuple[list, list[PassTiming]]:
            """Each job's timing and its prepared result, as soon as the pass's times are known."""
            timings = [
                PassTiming(start_s - job.submitted_s, compute_s, len(batch), start_s + compute_s) for job in batch
            ]
            return [
                _capture(functools.partial(prepare, value, timing)) if ok and (prepare := job.prepare) else (ok, value)
                for job, (ok, value), timing in zip(batch, outcomes, timings)
            ], timings

        (outcomes, timings), _, _ = await self.device.run(lambda: _run_batch(batch), cost_s, ready_s, timed)
        self.batch_sizes[len(batch)] += 1
        self.passes[kind] += 1
        for job, (ok, value), timing in zip(batch, outcomes, timings):
            if job.future.done():
                continue
            if ok:
                job.future.set_result((value, timing))
            else:
                job.future.set_exception(value)


def _run_batch(batch: list[_Job]) -> list[tuple[bool, object]]:
    """Each job's (ok, result): model calls on one model in one batched pass, draft blocks on one
    model in one batched pass per step, the rest in turn."""
    works = [job.work for job in batch]
    forward = [w for w in works if isinstance(w, ForwardJob)]
    if len(works) > 1 and len(forward) == len(works) and all(w.model is forward[0].model for w in forward):
        return run_jobs(forward)
    drafts = [w for w in works if isinstance(w, DraftJob)]
    if len(works) > 1 and len(drafts) == len(works) and all(w.model is drafts[0].model for w in drafts):
        return run_draft_jobs(drafts)
    return [_capture(w) for w in works]


def _capture(work: Callable[[], object]) -> tuple[bool, object]:
    """One job's failure must not touch the other jobs of its batch."""
    try:
        return True, work()
    except Exception as exc:  # handed to that job's caller
        return False, exc
