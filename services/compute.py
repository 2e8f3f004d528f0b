"""Where a model pass runs, and the backend flags both services share.

EmulatedDevice (synthetic backend): the models answer at once, so a pass is charged its modelled
time (one job at a time on a virtual timeline, like one busy accelerator). The model call
runs first and only the rest of the modelled time is waited out, so the Python work counts as
part of the modelled time instead of adding to it (as long as it is shorter). The waits go
through one PreciseTimer per process.

ThreadDevice (real models): the pass computes for real in one worker thread, so the event loop
keeps serving sockets meanwhile; one thread is one device, so passes never overlap.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from typing import TypeVar

from dsd.backends.factory import BACKEND_KINDS, DEFAULT_PAIR, BackendConfig
from dsd.profiles import HardwareProfile, get_profile

T = TypeVar("T")
# Sleep coarsely until this long before a deadline, then spin: epoll's timeouts are whole
# milliseconds and timer slack adds more.
_SPIN_S = 0.0015


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

    async def sleep_until(self, deadline_s: float) -> None:
        if deadline_s <= time.perf_counter():
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._deadlines, (deadline_s, next(self._order), future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="precise-timer")
        elif self._deadlines[0][2] is future:
            self._changed.set()          # a new earliest deadline: re-plan the coarse sleep
        await future

    async def _run(self) -> None:
        while self._deadlines:
            now_s = time.perf_counter()
            while self._deadlines and self._deadlines[0][0] <= now_s:
                _, _, future = heapq.heappop(self._deadlines)
                if not future.done():
                    future.set_result(None)
            if not self._deadlines:
                break
            coarse_s = self._deadlines[0][0] - now_s - _SPIN_S
            if coarse_s > 0:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(coarse_s):
                        await self._changed.wait()
            else:
                await asyncio.sleep(0)       # spin: one loop iteration, then look at the clock


class EmulatedDevice:
    """One emulated device: its passes run one at a time, each charged its modelled time."""

    def __init__(self, timer: PreciseTimer) -> None:
        self.timer = timer
        self.busy_until_s = 0.0
        self.busy_s = 0.0

    async def run(self, work: Callable[[], T], cost_s: float) -> tuple[T, float]:
        """Returns (work's result, compute_s charged)."""
        start_s = max(time.perf_counter(), self.busy_until_s)
        result = work()
        elapsed_s = time.perf_counter() - start_s
        compute_s = max(cost_s, elapsed_s)
        self.busy_until_s = start_s + compute_s
        self.busy_s += compute_s
        await self.timer.sleep_until(self.busy_until_s)
        return result, compute_s


class ThreadDevice:
    def __init__(self, executor: ThreadPoolExecutor | None = None) -> None:
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix="device")
        self.busy_s = 0.0

    async def run(self, work: Callable[[], T], cost_s: float = 0.0) -> tuple[T, float]:
        """Returns (work's result, compute_s measured); cost_s is ignored: the work is real."""
        def timed():
            start = time.perf_counter()
            return work(), time.perf_counter() - start

        result, compute_s = await asyncio.get_running_loop().run_in_executor(self.executor, timed)
        self.busy_s += compute_s
        return result, compute_s


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("backend")
    group.add_argument("--backend", choices=BACKEND_KINDS, default="synthetic")
    group.add_argument("--pair-path", default=str(DEFAULT_PAIR),
                       help="hf: a built pair folder (target/, draft/, manifest.json)")
    group.add_argument("--target-path", default="", help="hf: a model folder (with --draft-path)")
    group.add_argument("--draft-path", default="", help="hf: a model folder (with --target-path)")
    group.add_argument("--dtype", default="float32")
    group.add_argument("--alpha", type=float, default=0.8, help="synthetic: acceptance probability")
    group.add_argument("--vocab-size", type=int, default=512, help="synthetic")
    group.add_argument("--synthetic-seed", type=int, default=0, help="synthetic")
    group.add_argument("--eos-prob", type=float, default=0.0, help="synthetic")
    group.add_argument("--profile", default="", help="synthetic: a profile name in dsd/profiles.toml")
    group.add_argument("--profile-json", default="",
                       help="synthetic: the HardwareProfile fields as a JSON object")
    group.add_argument("--threads", type=int, default=1, help="torch intra-op threads")


def backend_from_args(args: argparse.Namespace) -> tuple[BackendConfig, HardwareProfile | None]:
    config = BackendConfig(kind=args.backend, pair_path=args.pair_path, target_path=args.target_path,
                           draft_path=args.draft_path, dtype=args.dtype, alpha=args.alpha,
                           vocab_size=args.vocab_size, seed=args.synthetic_seed, eos_prob=args.eos_prob)
    if args.profile and args.profile_json:
        raise ValueError("give --profile or --profile-json, not both")
    profile = None
    if args.profile:
        profile = get_profile(args.profile)
    elif args.profile_json:
        profile = profile_from_json(args.profile_json)
    if config.kind == "synthetic" and profile is None:
        raise ValueError("the synthetic backend computes nothing: give --profile or --profile-json "
                         "for the compute times to emulate")
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


def profile_to_json(profile: HardwareProfile) -> str:
    values = asdict(profile)
    values.pop("sources")
    return json.dumps(values)


def make_device(config: BackendConfig, timer: PreciseTimer | None = None):
    return EmulatedDevice(timer or PreciseTimer()) if config.kind == "synthetic" else ThreadDevice()
