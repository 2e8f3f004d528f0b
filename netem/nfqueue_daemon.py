"""The userspace shaper: holds each packet an iptables NFQUEUE rule hands it, releases it later.

Run as a child (see `netem.daemon`): ``python -m netem.nfqueue_daemon --tag dsdbed-TAG`` inside
the namespace whose iptables rules feed it, config as JSON on stdin::

    {"parent_pid": 123, "rt_priority": 10, "queues": [{"queue_num": 1000, "label": "edge0/up",
      "seed": 7, "limit_pkts": 2500, "backlog_pkts": 1000, "direction": {DirectionSpec fields}}]}

One process serves every queue (one queue per link direction): one epoll set over all queue
sockets, one heap of held packets ordered by release time. The loop:

1. wait until a queue socket is readable or the earliest release is due. epoll_wait counts in
   whole milliseconds and the kernel adds 0.1% of a timeout as slack, so a long wait stops
   ~1.5 ms short (coarse) and the rest is a short select() on the epoll fd (microsecond
   timeout, microseconds of slack);
2. drain the readable queues: each packet gets its release time from its `DirectionScheduler`
   (or is dropped) and goes on the heap; the kernel keeps the packet, we keep its id. A packet's
   clock starts at the kernel's receive timestamp, not when we got round to reading it;
3. accept every packet whose time has come, in heap order (FIFO per queue, see `netem.model`).

A queue with ``"reinject": true`` serves packets a local socket SENDS (the OUTPUT hook of the
namespace the daemon shapes from inside, `netem.inside`): the kernel keeps a held packet charged
to its sending socket, and TCP's small-queue limit then stalls the socket behind its own delayed
packets (2-3 small segments held and the next message waits for the first's release). So such a
packet is copied whole, dropped at once (the socket is credited, TCP saw a successful send) and
the copy is sent at its release time from a raw socket carrying ``reinject_mark``, which the
queue's rule does not match, so it is not queued twice.

Link schedules: further stdin lines ``{"changes": [{"at_mono_s": T, "queue_num": Q, "direction":
{...}}]}`` (CLOCK_MONOTONIC, shared by every process here) go on a second heap; the loop wakes for
the earliest as it does for a packet and switches that queue's settings at T (`DirectionScheduler.
update`: held packets are neither dropped nor re-timed). The daemon times the switch itself, to
the same precision as a release, rather than waiting for a message to arrive at T.

Timing on a shared 2-core machine: with CPU-bound neighbours a normal-priority process waits
milliseconds to be scheduled after a wake-up (measured: p99 3-5 ms), which is delay error on
every link. So the daemon runs SCHED_FIFO (``rt_priority``, 0 = off); it sleeps nearly all the
time, and the kernel's RT throttling still leaves other tasks 5% of each CPU if it ever spins.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import heapq
import itertools
import json
import math
import os
import select
import signal
import socket
import sys
import time

from netem.child import announce, child_preamble
from netem.model import DirectionScheduler
from netem.spec import DirectionSpec

COPY_RANGE_BYTES = 64  # the IP header is all we read: its length field sizes the packet
REINJECT_RANGE_BYTES = 65535  # a reinjected packet is copied whole (the kernel segments GSO first)
SO_MARK = 36
# Packets read but not yet verdicted also count against the kernel's queue length.
KERNEL_QUEUE_MARGIN_PKTS = 1024
COARSE_MARGIN_S = 0.0015
IDLE_WAIT_S = 0.5
SO_TIMESTAMPNS = 35


class Histogram:
    """Microsecond latencies in 10-us bins up to 50 ms: cheap enough for every packet."""

    BIN_US, N_BINS = 10, 5000

    def __init__(self):
        self.counts = [0] * (self.N_BINS + 1)
        self.max_us = 0.0

    def add(self, seconds: float) -> None:
        us = seconds * 1e6
        self.counts[min(max(int(us / self.BIN_US), 0), self.N_BINS)] += 1
        if us > self.max_us:
            self.max_us = us

    def summary(self) -> dict:
        total = sum(self.counts)
        out = {"n": total, "max_us": round(self.max_us, 1)}
        for name, pct in (("p50_us", 50), ("p99_us", 99)):
            seen, target = 0, total * pct / 100.0
            for i, c in enumerate(self.counts):
                seen += c
                if total and seen >= target:
                    out[name] = (i + 1) * self.BIN_US
                    break
        return out


class Clock:
    """Monotonic time, and the kernel's CLOCK_REALTIME packet stamps mapped onto it."""

    def __init__(self):
        self.resync()

    def resync(self) -> None:
        self.realtime_minus_mono_s = time.time() - time.monotonic()


class Queue:
    """One NFQUEUE queue number = one direction of one link."""

    def __init__(
        self,
        cfg: dict,
        heap: list,
        seq: itertools.count,
        clock: Clock,
        read_lag: Histogram,
        raw_socket: socket.socket | None = None,
    ):
        from netfilterqueue import COPY_PACKET, NetfilterQueue

        self.queue_num = int(cfg["queue_num"])
        self.label = cfg.get("label", str(self.queue_num))
        self.limit_pkts = int(cfg["limit_pkts"])
        self.scheduler = DirectionScheduler(
            DirectionSpec(**cfg["direction"]), seed=int(cfg["seed"]), backlog_pkts=int(cfg["backlog_pkts"])
        )
        self.reinject = bool(cfg.get("reinject", False))
        if self.reinject and raw_socket is None:
            raise ValueError(f"queue {self.queue_num}: reinject needs the daemon's raw socket (reinject_mark)")
        self.raw_socket = raw_socket
        self.held = 0
        self.n_limit = 0
        self.n_out = 0
        self.n_send_failed = 0
        self._heap, self._seq, self._clock, self._read_lag = heap, seq, clock, read_lag
        self.nfq = NetfilterQueue()
        self.nfq.bind(
            self.queue_num,
            self._on_packet,
            max_len=self.limit_pkts + KERNEL_QUEUE_MARGIN_PKTS,
            mode=COPY_PACKET,
            range=REINJECT_RANGE_BYTES if self.reinject else COPY_RANGE_BYTES,
        )

    def _on_packet(self, pkt) -> None:
        now_s = time.monotonic()
        arrival_s = now_s
        stamp_s = pkt.get_timestamp()  # 0.0 when the kernel did not stamp it
        if stamp_s:
            arrival_s = min(now_s, stamp_s - self._clock.realtime_minus_mono_s)
            self._read_lag.add(now_s - arrival_s)
        if self.held >= self.limit_pkts:
            self.n_limit += 1
            pkt.drop()
            return
        payload = pkt.get_payload()
        release_s = self.scheduler.on_arrival(arrival_s, ip_length(payload))
        if release_s is None:
            pkt.drop()
            return
        if self.reinject:
            pkt.drop()  # the sender's socket is credited now; the copy leaves later
            pkt = payload
        self.held += 1
        heapq.heappush(self._heap, (release_s, next(self._seq), pkt, self, now_s))

    def release(self, pkt) -> None:
        """Let a held packet go: accept it, or send its copy (reinject)."""
        self.held -= 1
        self.n_out += 1
        if not self.reinject:
            pkt.accept()
            return
        try:
            self.raw_socket.sendto(pkt, (socket.inet_ntoa(pkt[16:20]), 0))
        except OSError:
            self.n_send_failed += 1  # as a lost packet; counted in the stats

    def stats(self) -> dict:
        s = self.scheduler
        return {
            "queue_num": self.queue_num,
            "label": self.label,
            "n_in": s.n_in,
            "n_lost": s.n_lost,
            "n_overflow": s.n_overflow,
            "n_limit": self.n_limit,
            "n_out": self.n_out,
            "held": self.held,
            "n_send_failed": self.n_send_failed,
            "n_updates": s.n_updates,
        }


def ip_length(head: bytes) -> int:
    """The IP packet's length from its header (we only copy the first bytes of it)."""
    if len(head) >= 4 and head[0] >> 4 == 4:
        return (head[2] << 8) | head[3]
    if len(head) >= 6 and head[0] >> 4 == 6:
        return 40 + ((head[4] << 8) | head[5])
    return len(head)


class WakeLead:
    """How early to wake so that the typical wake-up lands on time.

    A timer wake-up here is typically 20-90 us late (more on a busy machine). Tracking the
    median lateness (a step up when late, a step down when early) and waking that much early
    centres the release on its due time instead of always after it.
    """

    STEP_S, MAX_S = 2e-6, 300e-6

    def __init__(self):
        self.lead_s = 0.0

    def update(self, lateness_s: float) -> None:
        self.lead_s += self.STEP_S if lateness_s > 0 else -self.STEP_S
        self.lead_s = min(max(self.lead_s, 0.0), self.MAX_S)


def release_due(heap: list, lead: WakeLead, late: Histogram) -> None:
    now_s = time.monotonic()
    first = True
    while heap and heap[0][0] - lead.lead_s <= now_s:
        release_s, _, pkt, queue, read_s = heapq.heappop(heap)
        queue.release(pkt)
        late.add(now_s - release_s)
        # Only a packet we had to wait for, and only the first of a wake-up, tells how late the
        # timer woke us (a packet due on arrival is "late" by however long the read took).
        if first and release_s > read_s:
            lead.update(now_s - release_s)
        first = False


class Control:
    """Timed setting changes read from stdin (see the module docstring)."""

    FD = 0

    def __init__(self, queues: list[Queue]):
        self.by_num = {q.queue_num: q for q in queues}
        self.pending: list = []  # (at_mono_s, seq, queue, DirectionSpec, keep_order)
        self._seq = itertools.count()
        self._buffer = b""
        self.n_applied = 0
        self.late = Histogram()

    def read(self) -> bool:
        """Read what stdin has; False at EOF (the parent closed it: no more changes)."""
        chunk = os.read(self.FD, 1 << 16)
        if not chunk:
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.strip():
                for change in json.loads(line)["changes"]:
                    queue = self.by_num[int(change["queue_num"])]
                    heapq.heappush(
                        self.pending,
                        (
                            float(change["at_mono_s"]),
                            next(self._seq),
                            queue,
                            DirectionSpec(**change["direction"]),
                            bool(change.get("keep_order", False)),
                        ),
                    )
        return True

    def next_s(self) -> float:
        return self.pending[0][0] if self.pending else math.inf

    def apply_due(self, now_s: float) -> None:
        while self.pending and self.pending[0][0] <= now_s:
            at_s, _, queue, direction, keep_order = heapq.heappop(self.pending)
            queue.scheduler.update(direction, keep_order)
            self.late.add(now_s - at_s)
            self.n_applied += 1


def serve(
    queues: list[Queue], heap: list, clock: Clock, lead: WakeLead, late: Histogram, control: Control | None = None
) -> None:
    epoll = select.epoll()
    by_fd = {}
    for q in queues:
        fd = q.nfq.get_fd()
        by_fd[fd] = q
        epoll.register(fd, select.EPOLLIN)
    if control is not None:
        epoll.register(Control.FD, select.EPOLLIN)
    while True:
        due_s = min(heap[0][0] if heap else math.inf, control.next_s() if control else math.inf)
        wait_s = due_s - lead.lead_s - time.monotonic() if due_s < math.inf else IDLE_WAIT_S
        if wait_s > 2 * COARSE_MARGIN_S:
            wait_s -= COARSE_MARGIN_S  # coarse: wake early, the precise wait follows
        if wait_s > 0:
            select.select([epoll], [], [], wait_s)
        if control is not None:
            # Before reading packets: one that arrived after the switch time gets the new settings.
            control.apply_due(time.monotonic() + lead.lead_s)
        events = epoll.poll(0)
        if events:
            clock.resync()
        for fd, _ in events:
            if fd == Control.FD:
                if not control.read():
                    epoll.unregister(Control.FD)
                continue
            by_fd[fd].nfq.run(False)
        release_due(heap, lead, late)


def _set_timer_slack_ns(ns: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_timerslack = 29
    libc.prctl(pr_set_timerslack, ns, 0, 0, 0)


def _raise_priority(rt_priority) -> bool | str:
    """SCHED_FIFO at rt_priority when it is > 0 and permitted (True), else nice -20 ("nice-20") or
    the priority we have (False)."""
    if rt_priority <= 0:
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(rt_priority)))
        return True
    except PermissionError:
        pass
    # A container (an edge shaping its own link): no CAP_SYS_NICE, or, with it, a cgroup
    # without a real-time budget (Docker gives containers none). Shape anyway: at nice
    # -20 where CAP_SYS_NICE allows (CFS then wakes us ahead of most), else as we are.
    # READY and STATS say so: expect milliseconds of delay error on a busy host.
    realtime: bool | str = False
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -20)
        realtime = "nice-20"
    except PermissionError:
        pass
    print(f"nfqueue_daemon: SCHED_FIFO not permitted; priority {realtime or 'normal'}", file=sys.stderr)
    return realtime


def _stop(signum, frame):
    raise SystemExit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", required=True, help="dsdbed-TAG: marks the process for cleanup")
    parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    config = child_preamble()
    _set_timer_slack_ns(1000)  # the default 50 us slack would show up in the delay
    realtime = _raise_priority(config.get("rt_priority", 0))
    # Any socket asking for receive timestamps makes the kernel stamp every packet it receives;
    # that stamp, not our read, starts a packet's delay.
    stamp_switch = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stamp_switch.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    # Held packets are plain objects without cycles: a collector pass over thousands of them
    # is a multi-millisecond stall of every link.
    gc.disable()
    heap: list = []
    seq = itertools.count()
    clock, lead, read_lag, late = Clock(), WakeLead(), Histogram(), Histogram()
    raw_socket = None
    if any(q.get("reinject") for q in config["queues"]):
        # IPPROTO_RAW: we write the whole IP header (the copy's own); the mark keeps it out of our rules.
        raw_socket = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        raw_socket.setsockopt(socket.SOL_SOCKET, SO_MARK, int(config["reinject_mark"]))
    queues = [Queue(q, heap, seq, clock, read_lag, raw_socket) for q in config["queues"]]
    control = Control(queues) if config.get("control") else None
    announce("READY", {"pid": os.getpid(), "queues": [q.queue_num for q in queues], "realtime": realtime})
    try:
        serve(queues, heap, clock, lead, late, control)
    finally:
        # Packets still held leave at once rather than being dropped by the unbind.
        while heap:
            _, _, pkt, queue, _ = heapq.heappop(heap)
            queue.release(pkt)
        stats = [q.stats() for q in queues]
        for q in queues:
            q.nfq.unbind()
        stamp_switch.close()
        announce(
            "STATS",
            {
                "queues": stats,
                "read_lag": read_lag.summary(),
                "release_late": late.summary(),
                "wake_lead_us": round(lead.lead_s * 1e6, 1),
                "realtime": realtime,
                "changes_applied": control.n_applied if control else 0,
                "change_late": control.late.summary() if control else {},
            },
        )


if __name__ == "__main__":
    sys.exit(main())
