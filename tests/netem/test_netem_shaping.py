"""A shaped test network really behaves as configured: RTT, jitter, loss, rate, TCP.

Runs whichever backend `auto` picks (the kernel's netem where it exists, the NFQUEUE daemon
here) and records it. Tolerances are looser than the benchmark's goals: this machine is shared,
and a test must not flake on a neighbour's CPU burst.
"""

from __future__ import annotations

import math
import socket
import threading
import time

import pytest

from netem import measure, nsutil
from netem.shaper import Shaper, ShaperConfig
from netem.spec import LinkSpec
from netem.topology import Topology, TopologyConfig
from tests.checks import every

from .conftest import note_backend

pytestmark = pytest.mark.root

SPECS = {
    "edge0": LinkSpec(rtt_ms=20),
    "edge1": LinkSpec(rtt_ms=60, jitter_ms=6),
    "edge2": LinkSpec(rtt_ms=10, loss_pct=10),
    "edge3": LinkSpec(rtt_ms=10, rate_mbit=10),
}
N_PROBES = 400


@pytest.fixture(scope="module")
def shaped():
    """Five edges; the first four shaped as SPECS, edge4 left alone."""
    with Topology(TopologyConfig(n_edges=5)) as topo:
        links = topo.links(list(SPECS.values()))
        with Shaper(ShaperConfig(verify_count=0)) as shaper:
            records = shaper.apply(links)
            measured = dict(zip(SPECS, measure.measure_links(links, count=N_PROBES, interval_s=0.01)))
            yield topo, shaper, records, measured


def test_every_record_names_its_backend(shaped, record_property):
    _, shaper, records, _ = shaped
    assert {r.backend for r in records} == {shaper.backend}
    assert every(r.as_row()["backend"] == shaper.backend for r in records)
    note_backend(record_property, shaper.backend, records[0].backend_reason)


def test_kernel_state_matches_the_plan_and_nothing_failed(shaped):
    _, shaper, _, _ = shaped
    assert shaper.failures() == []
    assert shaper.warnings() == []


@pytest.mark.parametrize("edge", ["edge0", "edge1", "edge2", "edge3"])
def test_measured_rtt_is_near_configured(shaped, edge):
    m = shaped[3][edge]
    assert abs(m.rtt_err_p50_ms) < 1.0, m
    assert m.rtt_p99_ms < m.configured_rtt_ms + 3 * m.expected_rtt_stdev_ms + 5.0, m


def test_jitter_stdev_is_near_configured(shaped):
    m = shaped[3]["edge1"]
    assert m.rtt_stdev_ms == pytest.approx(m.expected_rtt_stdev_ms, rel=0.25), m


def test_loss_is_within_sampling_error(shaped):
    m = shaped[3]["edge2"]
    assert m.expected_loss_pct == pytest.approx(19.0)
    assert m.loss_sigma < 4.0, m
    assert shaped[3]["edge0"].loss_pct == 0.0


def test_rate_cap_holds_within_five_percent(shaped):
    topo, _, _, _ = shaped
    edge, verifier = topo.edges[3], topo.verifier
    rate_mbit = measure.measure_rate_mbit(edge.netns, verifier.netns, verifier.ip, offered_mbit=15, duration_s=2.5)
    # htb counts Ethernet headers that the IP-level measurement does not see: 1442 vs 1428 bytes.
    assert rate_mbit == pytest.approx(10.0, rel=0.05)


def test_tcp_connect_takes_one_rtt_and_data_flows(shaped):
    topo, _, _, _ = shaped
    edge, verifier = topo.edges[0], topo.verifier
    server = nsutil.socket_in_netns(verifier.netns, socket.AF_INET, socket.SOCK_STREAM)
    client = nsutil.socket_in_netns(edge.netns, socket.AF_INET, socket.SOCK_STREAM)
    received = []
    try:
        server.bind((verifier.ip, 0))
        server.listen()
        server.settimeout(5)

        def serve():
            conn, _ = server.accept()
            with conn:
                while chunk := conn.recv(65536):
                    received.append(len(chunk))

        thread = threading.Thread(target=serve)
        thread.start()
        client.settimeout(5)
        t0 = time.monotonic()
        client.connect((verifier.ip, server.getsockname()[1]))
        connect_ms = (time.monotonic() - t0) * 1000
        client.sendall(b"x" * 1_000_000)
        client.close()
        thread.join(timeout=10)
    finally:
        client.close()
        server.close()
    assert 19.5 < connect_ms < 25.0
    assert sum(received) == 1_000_000


def test_unshaped_edge_is_not_delayed(shaped):
    topo, _, _, _ = shaped
    target = measure.RttTarget("edge4", topo.edges[4].netns, topo.verifier.ip)
    rtts = measure.probe_rtts([target], count=50, interval_s=0.005)[0]
    assert len(rtts) == 50 and measure.percentile(rtts, 50) < 1.0


def test_sixteen_links_with_their_own_rtts_share_one_backend():
    specs = [LinkSpec(rtt_ms=5 + 3 * i) for i in range(16)]
    with (
        Topology(TopologyConfig(n_edges=16)) as topo,
        Shaper(ShaperConfig(verify_count=60, verify_interval_s=0.02)) as shaper,
    ):
        records = shaper.apply(topo.links(specs))
        if shaper.backend == "nfqueue":
            assert len(shaper.daemons) == 1 and len(shaper.daemons[0].queues) == 32
        for record in records:
            m = record.measured
            assert m.n_received == m.n_sent and abs(m.rtt_err_p50_ms) < 1.0, (record.link, m)
    assert not math.isnan(records[0].measured.rtt_p99_ms)
