"""Spin, then block: an event loop that polls its sockets for a short window when a message is due.

On this kind of host (a VM whose idle vCPUs halt) a process blocked in epoll_wait is woken by
an inter-processor interrupt through the hypervisor; with both processes of a sync round idle in
turn, that is paid twice a round. benchmarks/echo_floor.py measured it on a quiet 2-vCPU
Firecracker VM: a paced aiohttp WebSocket echo cost 0.86 ms a round trip blocking and 0.52 ms
with receives that poll instead (raw TCP: 0.49 vs 0.17 ms); on a loaded one, polling made it
worse (3-4 ms: the poller takes a CPU slice from the process it waits for).

So the poll is bounded and aimed: a caller that knows when its next message should come
(``expect(due_s)``: the edge after sending a block, at the round trip the last blocks took; the
verifier after answering a lone session, at the gap the edge's drafting left last time) opens a
window from ``lead_us`` before that time for ``spin_us`` at most. A timer (Linux timerfd) wakes
the loop at the window's start; inside it, a wait polls without blocking until something is
ready or the window closes, then blocks as usual. At most ``spin_us`` of busy polling per
``expect``; off (``spin_us = 0``) by default, and the services only aim it when one client is
served: the verifier when one session is open; the edge when its run is the only one of the
process and none of its last verdicts waited in the verifier's queue or shared a pass (other
clients are being served). What it did is counted (``SpinSelector.stats``) for the trace and the
metrics.

Measured with the quiet lock held (benchmarks/hf_overhead.py, default pair, one client): server
overhead p50 0.62 and 0.81 ms with ``--spin-us 5000 --spin-lead-us 2500`` (66-96% of the windows
caught their message; 2.1-2.3 ms of polling per round in each process, about 10% of a core)
against 0.83-0.97 ms without in the same batches; a 2000 us window caught only 46-67% (the verify
pass alone moves +-1 ms round to round here) and gained nothing. Two sync clients, one edge
process each (benchmarks/spin_clients.py): with polling aimed regardless, 161 -> 137 tok/s per
client, the reason for the shared-verifier check; with it, 6 windows in the whole run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import selectors
import statistics
import time
from dataclasses import asdict, dataclass

from dsd.checks import is_int
from services.compute import _TimerFd

MAX_SPIN_US = 5000


@dataclass(frozen=True)
class SpinConfig:
    spin_us: int = 0  # the longest busy poll per expected message (0: never poll)
    lead_us: int = 300  # the window opens this long before the message is due

    def __post_init__(self) -> None:
        for name, high in (("spin_us", MAX_SPIN_US), ("lead_us", MAX_SPIN_US)):
            value = getattr(self, name)
            if not (is_int(value) and 0 <= value <= high):
                raise ValueError(f"{name} must be a whole number of microseconds in [0, {high}], got {value!r}")
        if self.spin_us and self.lead_us > self.spin_us:
            raise ValueError(
                f"lead_us ({self.lead_us}) must not exceed spin_us ({self.spin_us}): "
                "the window would close before the message is due"
            )

    @property
    def on(self) -> bool:
        return self.spin_us > 0


class SpinSelector(selectors.EpollSelector):
    """An epoll selector that, inside a window opened by ``expect``, polls instead of blocking."""

    def __init__(self, config: SpinConfig) -> None:
        super().__init__()
        self.config = config
        self._start_s = math.inf  # the open window [start, end), perf_counter's clock
        self._end_s = -math.inf
        self.windows = 0  # expect() calls that opened a window
        self.caught = 0  # windows in which something became ready while polling
        self.spun_s = 0.0  # time spent polling, all windows together
        self.timer: _TimerFd | None = None  # set by install(): wakes the loop at a window's start

    def expect(self, due_s: float) -> None:
        """A message should arrive at ``due_s`` (perf_counter): poll from lead_us before it."""
        if not self.config.on:
            return
        self._start_s = due_s - self.config.lead_us * 1e-6
        self._end_s = self._start_s + self.config.spin_us * 1e-6
        self.windows += 1
        if self.timer is not None and self._start_s > time.perf_counter():
            self.timer.arm(self._start_s)

    def cancel(self) -> None:
        """What was expected came (or will not): close the window (and its timer, if pending)."""
        if self.timer is not None and self._start_s != math.inf and self._start_s > time.perf_counter():
            self.timer.arm(0.0)  # zero: disarmed
        self._start_s, self._end_s = math.inf, -math.inf

    def select(self, timeout=None):
        if timeout is not None and timeout <= 0:
            return super().select(0)
        now_s = time.perf_counter()
        if now_s < self._start_s or now_s >= self._end_s:
            return super().select(timeout)
        end_s = self._end_s if timeout is None else min(self._end_s, now_s + timeout)
        while True:
            ready = super().select(0)
            polled_s = time.perf_counter()
            if ready or polled_s >= end_s:
                break
        self.spun_s += min(polled_s, end_s) - now_s  # the window's share (a preempted last poll: not ours)
        if ready:
            self.caught += 1
            self.cancel()
            return ready
        if polled_s >= self._end_s:
            self.cancel()
        return super().select(None if timeout is None else max(0.0, timeout - (polled_s - now_s)))

    def stats(self) -> dict:
        return {**asdict(self.config), "windows": self.windows, "caught": self.caught, "spun_ms": 1e3 * self.spun_s}


def new_event_loop(config: SpinConfig) -> asyncio.AbstractEventLoop:
    """A selector event loop; with polling on, on a SpinSelector whose windows a timer opens."""
    if not config.on:
        return asyncio.SelectorEventLoop()
    selector = SpinSelector(config)
    loop = asyncio.SelectorEventLoop(selector)
    selector.timer = _TimerFd.create()
    if selector.timer is not None:
        loop.add_reader(selector.timer.fd, selector.timer.drain)
    return loop


def selector_of(loop: asyncio.AbstractEventLoop | None = None) -> SpinSelector | None:
    """The running loop's SpinSelector, or None where the loop does not poll."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
    selector = getattr(loop, "_selector", None)
    return selector if isinstance(selector, SpinSelector) else None


class Gaps:
    """The recent gaps between a send and the message it leads to (seconds): the next one is
    expected after the median of the last ``keep`` (the window, from ``lead_us`` before it,
    covers the spread around it)."""

    def __init__(self, keep: int = 8) -> None:
        if not (isinstance(keep, int) and keep >= 1):
            raise ValueError(f"keep must be a whole number >= 1, got {keep!r}")
        self.keep = keep
        self._gaps: list[float] = []

    def add(self, gap_s: float) -> None:
        if gap_s >= 0:
            self._gaps = (self._gaps + [gap_s])[-self.keep :]

    def expected_s(self) -> float | None:
        return statistics.median(self._gaps) if self._gaps else None


def add_spin_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("polling for an expected message (services/spinwait.py)")
    group.add_argument(
        "--spin-us",
        type=int,
        default=SpinConfig.spin_us,
        help="the longest busy poll per expected message, microseconds (0: off, the default)",
    )
    group.add_argument(
        "--spin-lead-us",
        type=int,
        default=SpinConfig.lead_us,
        help="start polling this long before the message is due, microseconds",
    )


def spin_from_args(args: argparse.Namespace) -> SpinConfig:
    return SpinConfig(args.spin_us, args.spin_lead_us)
