"""The NFQUEUE daemon: a crash at start is noticed, a death later is detected and reported.

No --queue-bypass: a dead daemon blackholes its links, and we must say so rather than measure a
link that silently lost its delay.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from netem import measure, names, probe
from netem.cleanup import our_processes
from netem.daemon import DaemonDied, NfqueueDaemon, QueueAssignment
from netem.shaper import Shaper, ShaperConfig
from netem.spec import DirectionSpec, LinkSpec
from netem.topology import Topology, TopologyConfig

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def need_nfqueue():
    if not probe.probe_backends().nfqueue:
        pytest.skip("no NFQUEUE backend on this machine")


def test_daemon_death_is_detected_reported_and_blackholes_the_link():
    died = threading.Event()
    reports = []

    def on_failure(failures):
        reports.extend(failures)
        died.set()

    with Topology(TopologyConfig(n_edges=1)) as topo:
        with Shaper(ShaperConfig(backend="nfqueue", verify_count=20, watchdog_interval_s=0.1), on_failure) as shaper:
            link = topo.links(LinkSpec(rtt_ms=10))
            shaper.apply(link)
            assert shaper.failures() == []
            os.kill(shaper.daemons[0].pid, signal.SIGKILL)
            assert died.wait(timeout=3.0), "the watchdog did not notice"
            assert "died" in reports[0] and "drop every packet" in reports[0]
            with pytest.raises(DaemonDied):
                shaper.check()
            rtts = measure.probe_rtts(
                [measure.RttTarget("edge0", link[0].edge.netns, link[0].verifier.ip)],
                count=10,
                interval_s=0.01,
                timeout_s=0.3,
            )[0]
            assert rtts == [], "without --queue-bypass a dead daemon must drop, not pass unshaped"
    assert our_processes() == []


def test_readiness_handshake_notices_a_daemon_that_crashes_on_start():
    direction = DirectionSpec(delay_ms=1)
    queue = QueueAssignment(queue_num=4321, label="x", direction=direction, limit_pkts=100, backlog_pkts=10, seed=1)
    tag = names.process_tag(names.new_tag())
    with Topology(TopologyConfig(n_edges=1)) as topo:
        first = NfqueueDaemon.start(topo.bridge_netns, [queue], tag)
        try:
            t0 = time.monotonic()
            with pytest.raises(DaemonDied, match="Failed to create queue 4321"):
                NfqueueDaemon.start(topo.bridge_netns, [queue], tag, ready_timeout_s=30)  # the queue is taken
            assert time.monotonic() - t0 < 10, "the crash must be noticed before the timeout"
        finally:
            first.stop()
    assert our_processes() == []


def test_stop_returns_the_daemons_counts():
    queue = QueueAssignment(
        queue_num=4322, label="x", direction=DirectionSpec(delay_ms=1), limit_pkts=100, backlog_pkts=10, seed=1
    )
    with Topology(TopologyConfig(n_edges=1)) as topo:
        daemon = NfqueueDaemon.start(topo.bridge_netns, [queue], names.process_tag(names.new_tag()))
        assert set(daemon.queue_status()) == {4322}
        stats = daemon.stop()
    assert stats["queues"][0]["queue_num"] == 4322 and stats["queues"][0]["n_in"] == 0
