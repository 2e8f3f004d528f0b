"""The kernel backend's apply / read back / remove, on whatever of the plan this kernel can take.

Without sch_netem only the htb part is applied (and the netem request must fail as NetemMissing);
with it, the whole plan.
"""

from __future__ import annotations

import pytest

from netem import kernel, probe
from netem.names import OUR_QDISC_MAJORS
from netem.plan import plan_link
from netem.spec import LinkSpec
from netem.topology import Topology, TopologyConfig

pytestmark = pytest.mark.root


def ours(netns, ifname):
    return [
        o for o in kernel.observe(netns, ifname) if o["command"] == "replace" and o["handle"] >> 16 in OUR_QDISC_MAJORS
    ]


def test_apply_is_idempotent_reads_back_and_removes_cleanly():
    with Topology(TopologyConfig(n_edges=1)) as topo:
        link = topo.links(LinkSpec(rtt_ms=20, jitter_ms=1, rate_mbit=8))[0]
        plan = plan_link(link, max_pps=1000)
        if probe.probe_backends().kernel_netem:
            applicable = plan
        else:
            applicable = [r for r in plan if r.kind != "netem"]
            with pytest.raises(kernel.NetemMissing):
                kernel.apply_plan(plan[:3])  # htb, its class, then netem: the last one fails
        kernel.apply_plan(applicable)
        kernel.apply_plan(applicable)  # replace: the same state again
        assert kernel.read_back(applicable) == []
        assert ours(link.edge.netns, link.edge.ifname)
        removed = kernel.remove_plan(applicable)
        assert len(removed) == 2  # one root qdisc per direction
        assert not ours(link.edge.netns, link.edge.ifname)
        assert not ours(link.edge.bridge_netns, link.edge.bridge_port)
        assert kernel.remove_plan(applicable) == []
