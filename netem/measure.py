"""Measuring a shaped link from inside its endpoints: RTT by ICMP echo, rate by a UDP stream.

RTT: a raw ICMP socket in the edge's namespace sends echo requests to the verifier, whose kernel
answers them itself (no echo process whose wake-up would add to the figure). The reply's arrival
time is the kernel's receive timestamp (SO_TIMESTAMPNS), so the prober's own wake-up does not
count either. Many links are probed at once, their sends interleaved. The send time is stamped
just before the send, so a prober thread preempted in between would add to the RTT: where it may
(root), the thread probes at SCHED_FIFO (``PROBE_RT_PRIORITY``, below the NFQUEUE daemon's), so a
busy host's CPU-bound tasks do not come between stamp and send (with two busy loops beside it, the
p90 error of a scheduled link's probes was 2.4 ms at normal priority).

Rate: a UDP stream offered above the cap; the received IP bytes per second once the queue has
filled. IP bytes, because that is what the userspace shaper counts (htb counts the Ethernet
header too: 14 bytes more per packet).

Statistics are pure functions near the end, followed by a link's configured-vs-measured summary.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from netem import nsutil

SO_TIMESTAMPNS = 35  # linux/asm-generic/socket.h; the socket module does not export it
_ICMP_ECHO_REQUEST, _ICMP_ECHO_REPLY = 8, 0
_PROBE = struct.Struct("!IIq")  # target index, sequence number, send time (ns, CLOCK_REALTIME)
_WARM_UP_SEQ = 0xFFFFFFFF
PROBE_PAYLOAD_BYTES = 56  # as ping: 84 IP bytes on the wire
PROBE_IP_BYTES = PROBE_PAYLOAD_BYTES + 8 + 20
UDP_IP_OVERHEAD_BYTES = 28
PROBE_RT_PRIORITY = 5  # SCHED_FIFO priority of a probing thread; the shaper's daemon runs at 10


@dataclass(frozen=True)
class RttTarget:
    name: str
    src_netns: str | None  # where the probe starts (the edge)
    dst_ip: str  # what answers (the verifier)


@dataclass(frozen=True)
class RttStats:
    n_sent: int
    n_received: int
    loss_pct: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    stdev_ms: float
    min_ms: float
    max_ms: float


def probe_rtts(
    targets: list[RttTarget],
    count: int,
    interval_s: float,
    timeout_s: float = 2.0,
    stop: threading.Event | None = None,
    timeline: list[list] | None = None,
    kernel_stamps: bool = True,
) -> list[list[float]]:
    """`count` echo requests per target, one every `interval_s`; the RTTs (ms) of the replies.

    Bounded: returns at the latest `timeout_s` after the last send. `stop` ends the sending early
    (a prober running beside an experiment); `timeline`, one list per target, gets
    (CLOCK_MONOTONIC send time, RTT ms) of every reply, for when a changing link took effect.
    ``kernel_stamps=False`` times a reply when we read it instead: a delay applied inside the
    prober's own namespace after the packet arrived (`netem.inside`) comes after the kernel's
    receive stamp, which would hide it.
    """
    if count < 1 or interval_s <= 0:
        raise ValueError(f"count must be >= 1 and interval_s > 0, got {count!r}, {interval_s!r}")
    with _thread_realtime(PROBE_RT_PRIORITY):
        return _probe_rtts(targets, count, interval_s, timeout_s, stop, timeline, kernel_stamps)


@contextlib.contextmanager
def _thread_realtime(priority: int):
    """The calling thread at SCHED_FIFO `priority` for the block, where permitted (else unchanged);
    its own policy back afterwards. Linux applies sched_setscheduler(0) to the calling thread."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, policy, param)


def _probe_rtts(
    targets: list[RttTarget],
    count: int,
    interval_s: float,
    timeout_s: float,
    stop: threading.Event | None,
    timeline: list[list] | None,
    kernel_stamps: bool,
) -> list[list[float]]:
    socks = [_icmp_socket(t.src_netns) for t in targets]
    ident_base = os.getpid() & 0xFF00
    rtts: list[list[float]] = [[] for _ in targets]
    by_fd = {s.fileno(): i for i, s in enumerate(socks)}
    n = len(targets)
    total = count * n
    try:
        _warm_up(socks, targets, ident_base, by_fd, timeout_s)
        real_minus_mono_s = time.time() - time.monotonic()
        start_s = time.monotonic() + 0.01
        send_at = lambda j: start_s + (j // n) * interval_s + (j % n) * interval_s / n  # noqa: E731
        end_s = send_at(total - 1) + timeout_s
        next_send = 0
        while time.monotonic() < end_s:
            now_s = time.monotonic()
            if stop is not None and stop.is_set() and next_send < total:
                total = next_send  # no more sends: wait for the replies in flight
                end_s = now_s + timeout_s
            while next_send < total and send_at(next_send) <= now_s:
                i, k = next_send % n, next_send // n
                _send_echo(socks[i], targets[i].dst_ip, ident_base + (i & 0xFF), i, k)
                next_send += 1
            wake_s = send_at(next_send) if next_send < total else end_s
            if stop is not None:
                wake_s = min(wake_s, now_s + 0.1)
            ready, _, _ = select.select(socks, [], [], max(0.0, wake_s - time.monotonic()))
            for sock in ready:
                _read_replies(
                    sock,
                    by_fd[sock.fileno()],
                    rtts,
                    timeline=timeline,
                    real_minus_mono_s=real_minus_mono_s,
                    kernel_stamps=kernel_stamps,
                )
            if next_send == total and sum(map(len, rtts)) == total:
                break
    finally:
        for sock in socks:
            sock.close()
    return rtts


def _warm_up(socks, targets, ident_base: int, by_fd: dict, timeout_s: float) -> None:
    """One answered echo per target before measuring, not counted.

    It resolves ARP, and it lets conntrack confirm the ICMP flow: where conntrack runs (Docker's
    host namespace), packets of a new flow held in a queue before its first packet is confirmed
    clash at confirmation and are dropped (insert_failed), which would count as link loss.
    Bounded: re-sent every 0.25 s to targets without an answer, for at most `timeout_s`.
    """
    answered = [[] for _ in targets]
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s and not all(answered):
        for i, sock in enumerate(socks):
            if not answered[i]:
                _send_echo(sock, targets[i].dst_ip, ident_base + (i & 0xFF), i, _WARM_UP_SEQ)
        resend_s = min(deadline_s, time.monotonic() + 0.25)
        while time.monotonic() < resend_s and not all(answered):
            ready, _, _ = select.select(socks, [], [], max(0.0, resend_s - time.monotonic()))
            for sock in ready:
                _read_replies(sock, by_fd[sock.fileno()], answered, count_warm_up=True)


def _icmp_socket(netns: str | None) -> socket.socket:
    sock = nsutil.socket_in_netns(netns, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.setblocking(False)
    return sock


def _send_echo(sock: socket.socket, dst_ip: str, ident: int, index: int, seq: int) -> None:
    payload = _PROBE.pack(index, seq, time.time_ns()).ljust(PROBE_PAYLOAD_BYTES, b"\0")
    header = struct.pack("!BBHHH", _ICMP_ECHO_REQUEST, 0, 0, ident, seq & 0xFFFF)
    checksum = _inet_checksum(header + payload)
    header = struct.pack("!BBHHH", _ICMP_ECHO_REQUEST, 0, checksum, ident, seq & 0xFFFF)
    try:
        sock.sendto(header + payload, (dst_ip, 0))
    except BlockingIOError:
        pass  # counted as lost: the socket buffer is full, which a probe must not wait out


def _read_replies(
    sock: socket.socket,
    index: int,
    rtts: list[list[float]],
    count_warm_up: bool = False,
    timeline: list[list] | None = None,
    real_minus_mono_s: float = 0.0,
    kernel_stamps: bool = True,
) -> None:
    while True:
        try:
            data, ancillary, _, _ = sock.recvmsg(2048, 64)
        except BlockingIOError:
            return
        ihl = (data[0] & 0x0F) * 4
        icmp = data[ihl:]
        if len(icmp) < 8 + _PROBE.size or icmp[0] != _ICMP_ECHO_REPLY:
            continue
        got_index, seq, sent_ns = _PROBE.unpack_from(icmp, 8)
        if got_index != index:
            continue  # another prober's reply in the same namespace
        if (seq == _WARM_UP_SEQ) != count_warm_up:
            continue  # a late warm-up reply is not a measurement, nor the reverse
        rx_ns = _rx_time_ns(ancillary) if kernel_stamps else time.time_ns()
        rtts[index].append((rx_ns - sent_ns) / 1e6)
        if timeline is not None:
            timeline[index].append((sent_ns / 1e9 - real_minus_mono_s, rtts[index][-1]))


def _rx_time_ns(ancillary) -> int:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec * 1_000_000_000 + nsec
    return time.time_ns()


def _inet_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def measure_rate_mbit(
    src_netns: str | None,
    dst_netns: str | None,
    dst_ip: str,
    offered_mbit: float,
    duration_s: float = 3.0,
    warmup_s: float = 1.0,
    payload_bytes: int = 1400,
) -> float:
    """Received IP-layer rate of a UDP stream offered at `offered_mbit` for `duration_s`.

    The first `warmup_s` of arrivals are left out: the shaper's queue is still filling then.
    """
    rx = nsutil.socket_in_netns(dst_netns, socket.AF_INET, socket.SOCK_DGRAM)
    tx = nsutil.socket_in_netns(src_netns, socket.AF_INET, socket.SOCK_DGRAM)
    arrivals_s: list[float] = []
    try:
        rx.bind((dst_ip, 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        rx.settimeout(0.2)
        stop = threading.Event()

        def receive() -> None:
            while not stop.is_set():
                try:
                    rx.recv(65535)
                except TimeoutError:
                    continue
                arrivals_s.append(time.monotonic())

        receiver = threading.Thread(target=receive, name="dsdbed-rate-rx")
        receiver.start()
        try:
            _send_paced(tx, (dst_ip, rx.getsockname()[1]), offered_mbit, duration_s, payload_bytes)
            time.sleep(0.3)  # the tail still in flight is not counted anyway
        finally:
            stop.set()
            receiver.join()
    finally:
        rx.close()
        tx.close()
    window = [t for t in arrivals_s if t >= arrivals_s[0] + warmup_s] if arrivals_s else []
    if len(window) < 2:
        return 0.0
    ip_bytes = (len(window) - 1) * (payload_bytes + UDP_IP_OVERHEAD_BYTES)
    return ip_bytes * 8 / (window[-1] - window[0]) / 1e6


def _send_paced(
    sock: socket.socket, dst: tuple[str, int], rate_mbit: float, duration_s: float, payload_bytes: int
) -> None:
    gap_s = (payload_bytes + UDP_IP_OVERHEAD_BYTES) * 8 / (rate_mbit * 1e6)
    payload = b"\0" * payload_bytes
    start_s = time.monotonic()
    n_sent = 0
    while (now_s := time.monotonic()) < start_s + duration_s:
        due = int((now_s - start_s) / gap_s) + 1
        while n_sent < due:
            sock.sendto(payload, dst)
            n_sent += 1
        time.sleep(min(0.001, gap_s))


# ---- statistics (pure) --------------------------------------------------------------------------


def percentile(values: list[float], pct: float, method: str = "inverted_cdf") -> float:
    """The pct-th percentile of values, NaN if there are none; the testbed's one definition.
    ``inverted_cdf``: the smallest value with at least pct% of the values at or below it (always a
    value that occurred: a latency a token had, an RTT a probe saw). ``linear``: interpolation
    between the closest ranks (numpy's default), for a configured figure to compare against."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if method == "inverted_cdf":
        rank = max(1, math.ceil(pct / 100.0 * len(ordered) - 1e-9))
        return ordered[min(rank, len(ordered)) - 1]
    if method != "linear":
        raise ValueError(f"method must be 'inverted_cdf' or 'linear', got {method!r}")
    rank = (len(ordered) - 1) * pct / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def summarize(rtts_ms: list[float], n_sent: int) -> RttStats:
    n = len(rtts_ms)
    mean = sum(rtts_ms) / n if n else math.nan
    var = sum((x - mean) ** 2 for x in rtts_ms) / (n - 1) if n > 1 else math.nan
    return RttStats(
        n_sent=n_sent,
        n_received=n,
        loss_pct=100.0 * (n_sent - n) / n_sent if n_sent else math.nan,
        p50_ms=percentile(rtts_ms, 50, "linear"),
        p99_ms=percentile(rtts_ms, 99, "linear"),
        mean_ms=mean,
        stdev_ms=math.sqrt(var) if n > 1 else math.nan,
        min_ms=min(rtts_ms) if n else math.nan,
        max_ms=max(rtts_ms) if n else math.nan,
    )


def loss_sigma(n_sent: int, measured_loss_pct: float, expected_loss_pct: float) -> float:
    """How many binomial standard errors the measured loss is from the expected one."""
    p = expected_loss_pct / 100.0
    if n_sent == 0:
        return math.nan
    se = math.sqrt(max(p * (1 - p), 1e-12) / n_sent)
    return abs(measured_loss_pct / 100.0 - p) / se


# ---- a shaped link, configured vs measured ----------------------------------------------------


@dataclass(frozen=True)
class LinkMeasurement:
    """One link's RTT as configured and as measured from its edge (ms, percent)."""

    configured_rtt_ms: float  # base RTT plus the probe's serialisation at the rate cap
    expected_rtt_stdev_ms: float
    expected_loss_pct: float  # a probe and its reply both have to get through
    rtt_p50_ms: float
    rtt_p99_ms: float
    rtt_stdev_ms: float
    loss_pct: float
    n_sent: int
    n_received: int
    expected_rtt_p50_ms: float = math.nan  # the median RTT jitter gives (skewed tables: below the base)
    rtt_mean_ms: float = math.nan

    @property
    def rtt_err_p50_ms(self) -> float:
        expected = self.configured_rtt_ms if math.isnan(self.expected_rtt_p50_ms) else self.expected_rtt_p50_ms
        return self.rtt_p50_ms - expected

    @property
    def p50_sampling_error_ms(self) -> float:
        """Standard error of a median of n_received draws (1.25 stdev / sqrt(n) for a normal)."""
        return 1.25 * self.expected_rtt_stdev_ms / math.sqrt(max(self.n_received, 1))

    @property
    def loss_sigma(self) -> float:
        return loss_sigma(self.n_sent, self.loss_pct, self.expected_loss_pct)

    def problems(self, tolerance_ms: float) -> list[str]:
        """Signs that shaping is not in effect: no replies, a median off by more than tolerance_ms,
        or loss far beyond sampling error (5 standard errors: this is a sanity check, not a test)."""
        if self.n_received == 0:
            return [f"no probe came back of {self.n_sent}"] if self.expected_loss_pct < 99 else []
        problems = []
        # With jitter the sample median itself wanders: allowed 4 of its standard errors on top.
        if abs(self.rtt_err_p50_ms) > tolerance_ms + 4 * self.p50_sampling_error_ms:
            problems.append(f"median RTT {self.rtt_p50_ms:.3f} ms, configured {self.configured_rtt_ms:.3f} ms")
        if self.loss_sigma > 5 and self.n_sent - self.n_received > 2:
            problems.append(f"loss {self.loss_pct:.1f}%, expected {self.expected_loss_pct:.1f}%")
        return problems


def measure_links(links, count: int = 100, interval_s: float = 0.02) -> list[LinkMeasurement]:
    """Probe every `endpoints.Link` at once, from its edge to its verifier."""
    targets = [RttTarget(link.name, link.edge.netns, link.verifier.ip) for link in links]
    timeout_s = 1.0 + 3.0 * max(link.spec.expected_rtt_ms(PROBE_IP_BYTES) for link in links) / 1000.0
    rtts = probe_rtts(targets, count=count, interval_s=interval_s, timeout_s=timeout_s)
    out = []
    for link, rtts_ms in zip(links, rtts):
        s = summarize(rtts_ms, count)
        out.append(
            LinkMeasurement(
                configured_rtt_ms=link.spec.expected_rtt_ms(PROBE_IP_BYTES),
                expected_rtt_stdev_ms=link.spec.expected_rtt_stdev_ms,
                expected_loss_pct=link.spec.expected_rtt_loss_pct,
                rtt_p50_ms=s.p50_ms,
                rtt_p99_ms=s.p99_ms,
                rtt_stdev_ms=s.stdev_ms,
                loss_pct=s.loss_pct,
                n_sent=s.n_sent,
                n_received=s.n_received,
                expected_rtt_p50_ms=link.spec.expected_rtt_p50_ms(PROBE_IP_BYTES),
                rtt_mean_ms=s.mean_ms,
            )
        )
    return out
