"""Where a model pass runs, and the backend flags both services share.

EmulatedDevice (synthetic backend): the models answer at once, so a pass is charged its modelled
time (one job at a time on a virtual timeline, like one busy accelerator). A pass starts on that
timeline when its input was ready (the request's arrival, or the end of the pass it follows); the
model call runs first and only the rest of the modelled time is waited out, so the harness's own
Python work before and during the pass counts as part of the modelled time instead of adding to
it (as long as it is shorter). The waits go through one PreciseTimer per process.

PreciseTimer wakes its spinner with a Linux timerfd (through ctypes; Python 3.11 has no
os.timerfd_*): epoll's own timeouts are whole milliseconds, so without one the spinner spins for
the last 1.5 ms of every wait, and with it for the last 0.25 ms. Spinning is what costs: on a
loaded 2-core host the edge and the verifier spinning at once take CPU from each other and wake late.

ThreadDevice (real models): the pass computes for real in one worker thread, so the event loop
keeps serving sockets meanwhile; one thread is one device, so passes never overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import heapq
import itertools
import json
import os
import sys
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any, TypeVar

from dsd.backends.factory import backend_from_json
from dsd.backends.protocol import BackendConfig
from dsd.costs.profiles import HardwareProfile, get_profile

T = TypeVar("T")
# Sleep coarsely until this long before a deadline, then spin: epoll's timeouts are whole
# milliseconds and timer slack adds more; a timerfd wakes within ~0.1 ms (a busy host: more).
_SPIN_S = 0.0015
_SPIN_TIMERFD_S = 0.00025


class _TimerFd:
    """A Linux timerfd on CLOCK_MONOTONIC (perf_counter's clock here), armed at absolute times."""

    _CLOCK_MONOTONIC, _TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1
    _PR_SET_TIMERSLACK = 29

    class _Itimerspec(ctypes.Structure):  # two struct timespec {tv_sec, tv_nsec}
        _fields_ = [("it_interval", ctypes.c_long * 2), ("it_value", ctypes.c_long * 2)]

    def __init__(self, libc, fd: int) -> None:
        self._libc, self.fd = libc, fd
        weakref.finalize(self, os.close, fd)

    @classmethod
    def create(cls) -> _TimerFd | None:
        """None where there is no timerfd, or perf_counter is not CLOCK_MONOTONIC."""
        clock = time.get_clock_info("perf_counter").implementation
        if not sys.platform.startswith("linux") or "CLOCK_MONOTONIC)" not in clock:
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(cls._CLOCK_MONOTONIC, cls._TFD_NONBLOCK | cls._TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        libc.prctl(cls._PR_SET_TIMERSLACK, 1, 0, 0, 0)  # hrtimer slack 50 us -> 1 ns; best effort
        return cls(libc, fd)

    def arm(self, at_s: float) -> None:
        seconds = int(at_s)
        spec = self._Itimerspec((0, 0), (seconds, int((at_s - seconds) * 1e9)))
        if self._libc.timerfd_settime(self.fd, self._TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)


class PreciseTimer:
    """Precise waits for every emulated device of a process, with one spinner.

    Spinning each waiter on the event loop for the last ``_SPIN_S`` would, with dozens of
    devices in one edge process, make every loop iteration slow and every wake-up late. So
    waiters sleep on futures and one task sleeps
    coarsely until the earliest deadline is near, then spins alone and wakes each waiter on time.
    """

    def __init__(self) -> None:
        self._deadlines: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._timerfd = _TimerFd.create()
        self._reader_loop: asyncio.AbstractEventLoop | None = None

    def _fired(self) -> None:
        if self._timerfd is not None:  # registered only with one
            self._timerfd.drain()
        self._changed.set()

    async def sleep_until(self, deadline_s: float) -> None:
        if deadline_s <= time.perf_counter():
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._deadlines, (deadline_s, next(self._order), future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="precise-timer")
        elif self._deadlines[0][2] is future:
            self._changed.set()  # a new earliest deadline: re-plan the coarse sleep
        await future

    async def _run(self) -> None:
        timerfd = self._timerfd
        loop = asyncio.get_running_loop()
        if timerfd is not None and self._reader_loop is not loop:  # once per event loop
            loop.add_reader(timerfd.fd, self._fired)
            self._reader_loop = loop
        spin_s = _SPIN_S if timerfd is None else _SPIN_TIMERFD_S
        while self._deadlines:
            now_s = time.perf_counter()
            while self._deadlines and self._deadlines[0][0] <= now_s:
                _, _, future = heapq.heappop(self._deadlines)
                if not future.done():
                    future.set_result(None)
            if not self._deadlines:
                break
            coarse_s = self._deadlines[0][0] - now_s - spin_s
            if coarse_s > 0:
                self._changed.clear()
                if timerfd is not None:
                    timerfd.arm(self._deadlines[0][0] - spin_s)
                    await self._changed.wait()  # the timer fired, or a new earliest deadline
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(coarse_s):
                        await self._changed.wait()
            else:
                await asyncio.sleep(0)  # spin: one loop iteration, then look at the clock


class EmulatedDevice:
    """One emulated device: its passes run one at a time, each charged its modelled time.

    A pass starts when the device is free and its input was ready (``ready_s``: when the request
    reached this process, or when the previous pass it follows ended), not when the harness got
    round to it: decoding the message, the hop to the session's task and the bookkeeping before
    the pass run inside the modelled time instead of adding to it, as the model call itself does.
    Only what is left of the modelled time is waited out; if the Python work took longer than
    the model, the pass is charged what it took.
    """

    starts_when_ready = True  # a pass may start at its ready_s, before the harness reached it

    def __init__(self, timer: PreciseTimer) -> None:
        self.timer = timer
        self.busy_until_s = 0.0
        self.busy_s = 0.0
        self.runs = 0  # clients using it (one per edge run)

    async def run(
        self,
        work: Callable[[], T],
        cost_s: float,
        ready_s: float | None = None,
        then: Callable[[T, float, float], T] | None = None,
    ) -> tuple[T, float, float]:
        """Returns (work's result, start_s, compute_s charged); start_s on perf_counter's clock.

        ``then(result, start_s, compute_s)``, if given, replaces the result before what is left
        of the modelled time is waited out (e.g. the reply encoded, ready to go at the pass's end).
        """
        now_s = time.perf_counter()
        start_s = max(now_s if ready_s is None else min(ready_s, now_s), self.busy_until_s)
        result = work()
        compute_s = max(cost_s, time.perf_counter() - start_s)
        self.busy_until_s = start_s + compute_s
        self.busy_s += compute_s
        if then is not None:  # if it outlasts the modelled time, the pass ends late: overhead
            result = then(result, start_s, compute_s)
        await self.timer.sleep_until(self.busy_until_s)
        return result, start_s, compute_s


class ThreadDevice:
    starts_when_ready = False  # real work starts when the thread takes it; the wait before is real

    def __init__(self, executor: ThreadPoolExecutor | None = None) -> None:
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix="device")
        self.busy_s = 0.0
        self.runs = 0  # clients using it (the edge's runs): one alone may use run_here

    async def run(
        self,
        work: Callable[[], T],
        cost_s: float = 0.0,
        ready_s: float | None = None,
        then: Callable[[T, float, float], T] | None = None,
    ) -> tuple[T, float, float]:
        """Returns (work's result, start_s, compute_s measured); cost_s and ready_s are ignored:
        the work is real, and starts when the thread takes it. ``then`` as for EmulatedDevice."""

        def timed():
            start_s = time.perf_counter()
            return work(), start_s, time.perf_counter() - start_s

        result, start_s, compute_s = await asyncio.get_running_loop().run_in_executor(self.executor, timed)
        self.busy_s += compute_s
        return (result if then is None else then(result, start_s, compute_s)), start_s, compute_s

    def run_here(
        self, work: Callable[[], T], then: Callable[[T, float, float], Any] | None = None
    ) -> tuple[Any, float, float]:
        """``run`` on the calling thread (the event loop's): no hand-off to the worker thread and
        back, which costs two thread wake-ups (0.1-0.5 ms on a busy 2-core host); the loop reads
        nothing meanwhile, so only for a caller that knows nothing else needs it. Only call it
        when no pass is running on the worker thread (one device: passes never overlap)."""
        start_s = time.perf_counter()
        result = work()
        compute_s = time.perf_counter() - start_s
        self.busy_s += compute_s
        return (result if then is None else then(result, start_s, compute_s)), start_s, compute_s


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("backend")
    group.add_argument(
        "--backend-json",
        default="",
        help='the backend config as one JSON object, {"kind": "synthetic"|"hf"|..., FIELD: VALUE, ...} '
        "(dsd/backends/factory.py); empty: the synthetic backend's defaults",
    )
    group.add_argument("--profile", default="", help="emulated backends: a profile name in dsd/costs/profiles.toml")
    group.add_argument(
        "--profile-json", default="", help="emulated backends: the HardwareProfile fields as a JSON object"
    )
    group.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def backend_from_args(args: argparse.Namespace) -> tuple[BackendConfig, HardwareProfile | None]:
    config = backend_from_json(args.backend_json)
    if args.profile and args.profile_json:
        raise ValueError("give --profile or --profile-json, not both")
    profile = None
    if args.profile:
        profile = get_profile(args.profile)
    elif args.profile_json:
        profile = profile_from_json(args.profile_json)
    if config.emulated and profile is None:
        raise ValueError(
            f"the {config.kind} backend computes nothing: give --profile or --profile-json "
            "for the compute times to emulate"
        )
    return config, profile


def profile_from_json(text: str) -> HardwareProfile:
    values = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError(f"--profile-json must be a JSON object, got {type(values).__name__}")
    known = {f.name for f in fields(HardwareProfile)} - {"sources"}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"--profile-json: unknown keys {sorted(unknown)}")
    values.setdefault("name", "custom")
    return HardwareProfile(**values)


def freeze_startup_heap() -> None:
    """Keep the garbage collector off what starting the service allocated.

    torch, the models and the libraries are hundreds of thousands of objects that live until
    exit, and every full collection walks them all: ~100 ms here, a stall of the event loop
    that lands in whatever round or probe is in flight. Frozen, they are skipped and a full
    collection walks only what serving allocated (under 1 ms here). Call once, after loading
    the models, before serving.
    """
    gc.collect()
    gc.freeze()


def make_device(config: BackendConfig, timer: PreciseTimer | None = None):
    return EmulatedDevice(timer or PreciseTimer()) if config.emulated else ThreadDevice()
