"""What a cut in a link's delay does to TCP: a stream of small messages over a link that steps from
--from-ms to --to-ms RTT mid-stream (netns, `Shaper.schedule`), the worst message latency after the
step, and the two namespaces' TCP counters.

    flock /tmp/dsd-netns.lock python benchmarks/step_reorder.py [--from-ms 150] [--to-ms 10] [--order queue]

A step changes the delay of packets sent from then on; packets already held keep their release
times (netem/model.py, like kernel netem's tfifo without a rate). After a cut, new packets
overtake held ones, as on a path change. Linux TCP answers that reordering with a fast
retransmit and then a retransmission timeout it later judges spurious, so the messages sent just
after the step stall for about twice the old RTT. With the FIFO floor kept across the step (new
packets never overtake, as when a queue drains) the latency falls smoothly and no message
stalls. Which one a schedule means (a path change, or a queue draining) is the experiment's
choice: `--order queue` (an experiment's `[link] schedule_order = "queue"`) keeps the FIFO floor
across the step. Measurements: docs/results/links.md.

The last line: ``worst_after_step_ms= before_ms= after_ms= tcp_timeouts= spurious_rtos=`` (timeouts
and spurious RTOs summed over both namespaces).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig, nsutil  # noqa: E402

PORT = 7777
MESSAGE_BYTES = 64
# The echo server and the paced client run inside the namespaces as their own processes.
SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT})); s.listen(1); s.settimeout(30); c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); c.settimeout(30)
while True:
    data = c.recv(65536)
    if not data:
        break
    c.sendall(data)
"""
CLIENT = f"""
import socket, struct, sys, time
c = socket.create_connection((sys.argv[1], {PORT}), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); c.setblocking(False)
t0 = time.monotonic(); buf = b""; next_s = t0; end_s = t0 + float(sys.argv[2])
while time.monotonic() < end_s + 1.0:
    now = time.monotonic()
    if now >= next_s and now < end_s:
        c.send(struct.pack("!d", now) + b"x" * {MESSAGE_BYTES - 8}); next_s += 0.01
    try:
        buf += c.recv(65536)
    except BlockingIOError:
        pass
    while len(buf) >= {MESSAGE_BYTES}:
        msg, buf = buf[:{MESSAGE_BYTES}], buf[{MESSAGE_BYTES}:]
        sent = struct.unpack("!d", msg[:8])[0]
        print(f"{{sent:.6f}} {{(time.monotonic() - sent) * 1e3:.3f}}")
    time.sleep(0.0005)
"""
COUNTERS = ("TcpExtTCPTimeouts", "TcpExtTCPSpuriousRTOs")


def tcp_counters(netns: str) -> dict[str, int]:
    out = subprocess.run(nsutil.in_netns(netns, ["nstat", "-az"]), capture_output=True, text=True, timeout=10).stdout
    values = {
        line.split()[0]: int(line.split()[1])
        for line in out.splitlines()[1:]
        if len(line.split()) >= 2 and line.split()[1].isdigit()
    }
    return {name: values.get(name, 0) for name in COUNTERS}


def run(from_ms: float, to_ms: float, step_after_s: float, duration_s: float, order: str = "path") -> dict:
    with Topology(TopologyConfig(n_edges=1)) as topo, Shaper(ShaperConfig(verify_count=20)) as shaper:
        shaper.apply(topo.links(LinkSpec(rtt_ms=from_ms)))
        server = subprocess.Popen(nsutil.in_netns(topo.verifier.netns, [sys.executable, "-c", SERVER]))
        try:
            time.sleep(0.3)
            client = subprocess.Popen(
                nsutil.in_netns(topo.edges[0].netns, [sys.executable, "-c", CLIENT, topo.verifier.ip, str(duration_s)]),
                stdout=subprocess.PIPE,
                text=True,
            )
            step_s = time.monotonic() + step_after_s
            shaper.schedule([(step_s, [LinkSpec(rtt_ms=to_ms)])], keep_order=order == "queue")
            out, _ = client.communicate(timeout=duration_s + 30)
            counters = [tcp_counters(ns) for ns in (topo.verifier.netns, topo.edges[0].netns)]
        finally:
            server.kill()
            server.wait()
        backend = shaper.backend
    rows = [tuple(map(float, line.split())) for line in out.splitlines() if line.strip()]
    before = [ms for sent, ms in rows if step_s - 1.0 < sent < step_s - 0.2]
    after = [ms for sent, ms in rows if sent > step_s + 1.0]
    return {
        "backend": backend,
        "worst_after_step_ms": max(ms for sent, ms in rows if sent >= step_s - 0.2),
        "before_ms": statistics.median(before),
        "after_ms": statistics.median(after),
        "tcp_timeouts": sum(c["TcpExtTCPTimeouts"] for c in counters),
        "spurious_rtos": sum(c["TcpExtTCPSpuriousRTOs"] for c in counters),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-ms", type=float, default=150.0)
    parser.add_argument("--to-ms", type=float, default=10.0)
    parser.add_argument("--step-after-s", type=float, default=2.5, help="after the client starts (about)")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument(
        "--order",
        choices=("path", "queue"),
        default="path",
        help="path: packets after the step may overtake held ones; queue: never",
    )
    args = parser.parse_args()
    if not 0 <= args.to_ms < args.from_ms <= 2000:
        raise SystemExit(f"--to-ms must be below --from-ms (both in 0..2000), got {args.to_ms} and {args.from_ms}")
    if not 1.5 <= args.step_after_s <= args.duration_s - 1.5 or args.duration_s > 60:
        raise SystemExit("--step-after-s must leave 1.5 s either side within --duration-s (at most 60)")
    result = run(args.from_ms, args.to_ms, args.step_after_s, args.duration_s, args.order)
    print(f"backend: {result.pop('backend')}", file=sys.stderr)
    print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
