"""The verifier device that the simulated clients share (``dsd.simulation.many_clients``): a queue of
passes, each pass one job of a session or a batch of jobs of one kind, as
services/verifier/scheduler.py shares it, on the clients' virtual time."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dsd.costs.compute_times import PREFILL, STALE, ComputeTimes, pass_cost_s
from dsd.drive.batching import BatchingConfig
from dsd.simulation.virtual_time import VirtualLoop


@dataclass
class Job:
    arrive_s: float
    kind: str
    size: int
    session: object
    done: Callable[[float, float, int], None]  # (its pass's start, its pass's end, the pass's batch size)
    arrived: bool = False


class SharedVerifier:
    """The one device: passes one after another, each laid out when it starts. ``heads`` holds
    each session's next job once it arrived, by when it could start (its arrival, or its
    session's last pass's end) and then by the order sent."""

    def __init__(self, loop: VirtualLoop, times: ComputeTimes, config: BatchingConfig) -> None:
        self.loop, self.times, self.config = loop, times, config
        self.queues: dict[object, deque[Job]] = {}  # per session, in the order sent
        self.heads: list[tuple[float, int, Job]] = []
        self.last_end_s: dict[object, float] = {}  # per session: the end of its last pass
        self.busy = False
        self.free_at_s = 0.0
        self.order = itertools.count()
        self.deciding = False  # a decision is due at the loop's present time

    def submit(
        self, session: object, arrive_s: float, kind: str, size: int, done: Callable[[float, float, int], None]
    ) -> None:
        """A job that reaches the verifier at ``arrive_s``; ``done(start_s, end_s, batch_size)``
        when its pass starts."""
        job = Job(arrive_s, kind, size, session, done)
        self.queues.setdefault(session, deque()).append(job)
        if arrive_s > self.loop.now_s:
            self.loop.at(arrive_s, lambda: self._arrive(job))
        else:
            self._arrive(job)

    def _arrive(self, job: Job) -> None:
        job.arrived = True
        if self.queues[job.session][0] is job:
            ready_s = max(job.arrive_s, self.last_end_s.get(job.session, 0.0))
            heapq.heappush(self.heads, (ready_s, next(self.order), job))
        self.decide()

    def decide(self) -> None:
        """Start a pass once everything that arrives now is here."""
        if not self.deciding:
            self.deciding = True
            self.loop.at(self.loop.now_s, self.try_start, last=True)

    def try_start(self) -> None:
        self.deciding = False
        if self.busy or not self.heads:
            return
        first_ready_s, _, first = self.heads[0]
        limit = 1 if first.kind in (PREFILL, STALE) else self.config.max_batch
        # An idle device starts a job the moment it arrived, even if the loop learns of it later
        # (an edge sends what a verdict released at the verdict's arrival, inside a draft step).
        start_s = max(self.free_at_s, first_ready_s)
        if limit > 1 and self.config.batch_window_ms > 0:
            deadline_s = first_ready_s + self.config.batch_window_ms / 1e3
            here = sum(job.kind == first.kind for _, _, job in self.heads)
            if here < limit and deadline_s > self.loop.now_s:
                self.loop.at(deadline_s, self.try_start, last=True)
                return
            start_s = max(start_s, min(deadline_s, self.loop.now_s))  # the window passed, or it filled now
        batch = [heapq.heappop(self.heads)]
        others: list[tuple[float, int, Job]] = []
        while len(batch) < limit and self.heads and self.heads[0][0] <= start_s:
            entry = heapq.heappop(self.heads)
            (batch if entry[2].kind == first.kind else others).append(entry)
        for entry in others:
            heapq.heappush(self.heads, entry)
        end_s = start_s + pass_cost_s(self.times, first.kind, [job.size for _, _, job in batch])
        self.busy = True
        for _, _, job in batch:
            self.last_end_s[job.session] = end_s
            queue = self.queues[job.session]
            queue.popleft()
            if not queue:
                del self.queues[job.session]
            elif queue[0].arrived:  # the session's next job: it can start once this pass ends
                heapq.heappush(self.heads, (max(queue[0].arrive_s, end_s), next(self.order), queue[0]))
            job.done(start_s, end_s, len(batch))
        self.loop.at(end_s, lambda: self._end(end_s))

    def _end(self, end_s: float) -> None:
        self.busy, self.free_at_s = False, end_s
        self.decide()
