"""Emulated compute: precise waits and one serialized accelerator per process.

``time.sleep`` and ``asyncio.sleep`` overshoot by up to a millisecond or more (timer slack,
epoll's whole-millisecond timeouts), too coarse for draft steps of a few milliseconds. So we sleep
coarsely until ``_SPIN_S`` before the deadline and then spin on the clock.
"""
from __future__ import annotations

import asyncio
import time

_SPIN_S = 0.0015


def precise_sleep(duration_s: float) -> None:
    deadline = time.perf_counter() + duration_s
    coarse_s = duration_s - _SPIN_S
    if coarse_s > 0:
        time.sleep(coarse_s)
    while time.perf_counter() < deadline:
        pass


async def precise_sleep_until(deadline: float) -> None:
    """Await until perf_counter() reaches ``deadline``; other tasks run during the spin phase."""
    coarse_s = deadline - time.perf_counter() - _SPIN_S
    if coarse_s > 0:
        await asyncio.sleep(coarse_s)
    while time.perf_counter() < deadline:
        await asyncio.sleep(0)


class Accelerator:
    """One device that runs one job at a time, first come first served, on a virtual timeline.

    Concurrent sessions of a process contend for it like for one busy GPU: a job submitted while
    the device is busy starts when the jobs before it end.
    """

    def __init__(self) -> None:
        self.busy_until = 0.0
        self.busy_total_s = 0.0

    async def run(self, duration_s: float) -> tuple[float, float]:
        """Occupy the device for ``duration_s``; returns (queue_wait_s, compute_s)."""
        now = time.perf_counter()
        start = max(now, self.busy_until)
        self.busy_until = start + duration_s
        self.busy_total_s += duration_s
        await precise_sleep_until(self.busy_until)
        return start - now, duration_s
