"""A link schedule on a live shaped link (root): every change takes effect within milliseconds of
its time, no probe is lost across the changes, and each RTT is what the schedule implies."""

from __future__ import annotations

import time

import pytest

from netem import measure
from netem.schedule import LinkSchedule, effect_brackets, expected_rtt_at_ms
from netem.shaper import Shaper, ShaperConfig
from netem.spec import LinkSpec
from netem.topology import Topology, TopologyConfig
from tests.checks import every

from .conftest import note_backend

pytestmark = pytest.mark.root


def test_scheduled_changes_take_effect_on_time_without_losing_held_packets(record_property):
    base = LinkSpec(rtt_ms=40)
    # Up to 100 ms with probes held, then down to 20 ms while 50 ms' worth are held each way.
    schedule = LinkSchedule.from_steps(
        [
            {"at_s": 0.4, "rtt_ms": 100},
            {"at_s": 0.8, "rtt_ms": 20},
            {"at_s": 1.2, "delay_up_ms": 5, "delay_down_ms": 25},
        ]
    )
    with Topology(TopologyConfig(n_edges=1)) as topo:
        with Shaper(ShaperConfig(verify_count=20)) as shaper:
            shaper.apply(topo.links([base]))
            note_backend(record_property, shaper.backend, shaper.records[0].backend_reason)
            t0 = time.monotonic() + 0.1
            shaper.schedule([(t0 + at_s, [spec]) for at_s, spec in schedule.specs(base)])
            timeline = [[]]
            target = measure.RttTarget("edge0", topo.edges[0].netns, topo.verifier.ip)
            measure.probe_rtts([target], count=800, interval_s=0.002, timeout_s=1.0, timeline=timeline)
        stats = shaper.daemon_stats
    samples = timeline[0]
    assert len(samples) == 800  # nothing dropped across the changes
    bytes_ = measure.PROBE_IP_BYTES
    errors = sorted(abs(rtt - expected_rtt_at_ms(schedule, base, sent - t0, bytes_)) for sent, rtt in samples)
    # Quiet, p95 is 0.2-0.3 ms (also beside two busy loops); a starved probe thread on a loaded CI
    # host has put 5% of samples over 2 ms, and on a host whose speed moved during the suite, 1%
    # (eight probes around the changes) 14-30 ms off. A change applied late or a held packet
    # re-timed would be off by 20-60 ms for a whole segment: a quarter of the samples.
    quantiles = [errors[int(q * len(errors))] for q in (0.5, 0.9, 0.97)]
    assert quantiles[0] < 0.5 and quantiles[1] < 2.0 and quantiles[2] < 10.0, (quantiles, errors[-10:])
    changes, old = [], base.expected_rtt_ms()
    for at_s, spec in schedule.specs(base):
        changes.append((t0 + at_s, old, spec.expected_rtt_ms()))
        old = spec.expected_rtt_ms()
    # (last probe still seeing the old link, first seeing the new), ms after the change was due
    settle_ms = [
        (1000 * (lo - at), 1000 * (hi - at))
        for (lo, hi), (at, _, _) in zip(effect_brackets(changes, samples, 1.0), changes)
    ]
    assert every(0 <= lo < 10 and lo <= hi < 100 for lo, hi in settle_ms), settle_ms
    if stats:  # NFQUEUE: the daemon's own count
        assert stats[0]["changes_applied"] == 2 * len(schedule.steps)
