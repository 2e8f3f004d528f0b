"""Endpoints: a namespace we made and a container-like process resolve through the same code."""

from __future__ import annotations

import subprocess

import pytest

from netem import nsutil
from netem.endpoints import endpoint_from_container, endpoint_from_netns
from netem.topology import Topology, TopologyConfig

pytestmark = pytest.mark.root


class FakeContainer:
    """What endpoint_from_container reads from a docker SDK container."""

    def __init__(self, name: str, pid: int):
        self.name = name
        self.attrs = {"State": {"Pid": pid}}


def test_topology_endpoints_resolve_back_to_their_bridge_ports():
    with Topology(TopologyConfig(n_edges=2)) as topo:
        for ep in [topo.verifier, *topo.edges]:
            assert endpoint_from_netns(ep.name, ep.netns, ep.ifname, topo.bridge_netns) == ep


def test_container_endpoint_found_through_proc_pid_ns_net_and_iflink():
    with Topology(TopologyConfig(n_edges=1)) as topo:
        edge = topo.edges[0]
        # A process inside the edge's namespace stands in for the container's PID 1.
        holder = subprocess.Popen(nsutil.in_netns(edge.netns, ["sleep", "30"]))
        try:
            ep = endpoint_from_container(
                FakeContainer("c0", holder.pid), ifname=edge.ifname, bridge_netns=topo.bridge_netns
            )
            assert ep.netns == f"/proc/{holder.pid}/ns/net"
            assert (ep.ip, ep.bridge_port, ep.bridge_netns) == (edge.ip, edge.bridge_port, topo.bridge_netns)
        finally:
            holder.kill()
            holder.wait()


def test_stopped_container_is_a_lookup_error():
    with pytest.raises(LookupError, match="not running"):
        endpoint_from_container(FakeContainer("c0", 0))
