"""Shaping a link from inside the edge's own namespace (netem.inside): the plan as data, and on
root a real link shaped and verified from inside, TCP not stalled by its own delayed segments,
and nothing left behind."""

import json
import os
import subprocess
import sys
import time

import pytest

from netem import LinkSpec, Topology, TopologyConfig
from netem.inside import InsideRulePlan, ifb_name, plan_inside_kernel, plan_inside_rules
from netem.plan import NETEM_HANDLE
from tests.checks import every

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rules_queue_the_peers_packets_and_skip_the_daemons_own_copies():
    plan = plan_inside_rules("abc123", "10.1.2.3", 1000)
    assert plan == InsideRulePlan("DSDBED-abc123", "10.1.2.3", 1000, 1001)
    up, down = plan.rule_specs()
    assert up == ("-A DSDBED-abc123 -d 10.1.2.3/32 -m mark ! --mark 0x44534442 -j NFQUEUE --queue-num 1000")
    assert down == "-A DSDBED-abc123 -s 10.1.2.3/32 -j NFQUEUE --queue-num 1001"
    assert plan.jumps == [["OUTPUT", "-j", "DSDBED-abc123"], ["INPUT", "-j", "DSDBED-abc123"]]
    assert plan.restore_text().splitlines()[:2] == ["*filter", ":DSDBED-abc123 - [0:0]"]


def test_kernel_plan_puts_up_on_the_interface_and_down_on_the_ifb():
    ifb = ifb_name("abc123")
    assert ifb == "dsdbiabc123" and len(ifb) <= 15
    plan = plan_inside_kernel("eth0", ifb, LinkSpec(delay_up_ms=5, delay_down_ms=15, rate_mbit=10), 1000)
    netems = [r for r in plan if r.kind == "netem"]
    assert [(r.ifname, r.attrs["delay"]) for r in netems] == [("eth0", 5000), (ifb, 15000)]
    assert every(r.handle == NETEM_HANDLE and r.netns is None for r in netems)
    assert sum(r.kind == "htb" for r in plan) == 4  # the rate: a root and a class on each


INSIDE = r"""
import json, socket, sys, time
from netem import LinkSpec, ShaperConfig
from netem.inside import InsideShaper
peer = sys.argv[1]

def echo_ms(n_burst):
    s = socket.create_connection((peer, 9998)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(8):
        t = time.perf_counter()
        for _ in range(n_burst):
            s.sendall(b"m" * 300)
        got = 0
        while got < 300 * n_burst:
            got += len(s.recv(65536))
        times.append((time.perf_counter() - t) * 1000)
    s.close()
    return sorted(times)[len(times) // 2]

def bulk_mbit():
    s = socket.create_connection((peer, 9999)); t = time.time(); n = 0
    while time.time() - t < 2:
        s.sendall(b"x" * 65536); n += 65536
    s.shutdown(socket.SHUT_WR); s.recv(1); dt = time.time() - t; s.close()
    return n * 8 / dt / 1e6

shaper = InsideShaper(ShaperConfig(verify_count=50))
record = shaper.apply(peer, LinkSpec(rtt_ms=20))
out = {"record": record.as_json(), "one_ms": echo_ms(1), "burst_ms": echo_ms(6), "bulk_mbit": bulk_mbit(),
       "chains_while": [l for l in __import__("subprocess").run(["iptables", "-S"], capture_output=True,
                        text=True).stdout.splitlines() if "DSDBED" in l]}
shaper.close()
out["after_ms"] = echo_ms(1)
out["chains_after"] = [l for l in __import__("subprocess").run(["iptables", "-S"], capture_output=True,
                       text=True).stdout.splitlines() if "DSDBED" in l]
print(json.dumps(out))
"""

SERVER = r"""
import socket, threading
def sink():
    l = socket.socket(); l.bind(("0.0.0.0", 9999)); l.listen()
    while True:
        c, _ = l.accept()
        while c.recv(1 << 20):
            pass
        c.send(b"k"); c.close()
threading.Thread(target=sink, daemon=True).start()
l = socket.socket(); l.bind(("0.0.0.0", 9998)); l.listen()
while True:
    c, _ = l.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (d := c.recv(65536)):
        c.sendall(d)
"""


@pytest.mark.root
def test_an_edge_shapes_its_own_link_from_inside_and_tcp_keeps_its_pace(record_property):
    env = dict(os.environ, PYTHONPATH=REPO)
    with Topology(TopologyConfig(n_edges=1)) as topo:
        server = subprocess.Popen(
            ["nsenter", f"--net={topo.verifier.netns}", "--", sys.executable, "-c", SERVER],
            env=env,
            start_new_session=True,
        )
        try:
            time.sleep(0.5)
            done = subprocess.run(
                ["nsenter", f"--net={topo.edges[0].netns}", "--", sys.executable, "-c", INSIDE, topo.verifier.ip],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            server.kill()
            server.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    record = out["record"]
    record_property("inside", json.dumps({k: v for k, v in out.items() if k != "record"}))
    assert record["interface"] == "dsdbeth0" and record["problems"] == []
    assert abs(record["measured"]["rtt_p50_ms"] - record["measured"]["configured_rtt_ms"]) < 2
    assert 19 < out["one_ms"] < 25
    # Six messages back to back cost one round trip, not six: the sending socket is not stalled
    # behind its own held segments (TCP small queues; see the daemon's reinject).
    assert out["burst_ms"] < out["one_ms"] + 5
    assert out["bulk_mbit"] > 50
    assert len(out["chains_while"]) == 5 and out["chains_after"] == []
    assert out["after_ms"] < 5
