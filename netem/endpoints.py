"""The two ends of a link, found the same way for a namespace we made and a Docker container.

An endpoint is an interface inside a network namespace, plugged into a bridge through a veth
pair. The peer's index is the interface's IFLA_LINK; its name is looked up in the bridge's
namespace. A container is the same thing with the namespace at ``/proc/PID/ns/net`` and the
bridge in the host's namespace.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from pyroute2 import IPRoute

from netem import nsutil
from netem.spec import LinkSpec


@dataclass(frozen=True)
class Endpoint:
    name: str  # a label for traces: "edge3", a container name
    netns: str | None  # path of its network namespace; None = ours
    ifname: str  # its interface inside netns
    ip: str  # its IPv4 address on the bridge's network
    bridge_port: str  # the peer veth, a port of the bridge
    bridge_netns: str | None  # where the bridge (and so bridge_port) lives; None = ours


@dataclass(frozen=True)
class Link:
    """One edge<->verifier link to shape: "up" is edge -> verifier, "down" the reverse."""

    name: str
    edge: Endpoint
    verifier: Endpoint
    spec: LinkSpec

    def __post_init__(self):
        if self.edge.bridge_netns != self.verifier.bridge_netns:
            raise ValueError(
                f"link {self.name!r}: edge and verifier must share a bridge namespace, got "
                f"{self.edge.bridge_netns!r} and {self.verifier.bridge_netns!r}"
            )


def open_iproute(netns: str | None) -> IPRoute:
    # flags=0: pyroute2 would otherwise create a namespace that is not there.
    if netns is None:
        return IPRoute()
    return IPRoute(netns=nsutil.netns_path(netns), flags=0)


def ifindex(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise LookupError(f"no interface {ifname!r}")
    return found[0]


def endpoint_from_netns(name: str, netns: str | None, ifname: str, bridge_netns: str | None) -> Endpoint:
    with open_iproute(netns) as ipr:
        index = ifindex(ipr, ifname)
        link = ipr.get_links(index)[0]
        peer_index = link.get_attr("IFLA_LINK")
        if peer_index is None or link.get_attr("IFLA_LINK_NETNSID") is None:
            raise LookupError(f"{name}: {ifname} in {netns} is not a veth with its peer in another namespace")
        addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=index, family=socket.AF_INET)]
    if not addrs:
        raise LookupError(f"{name}: {ifname} in {netns} has no IPv4 address")
    with open_iproute(bridge_netns) as ipr:
        peers = ipr.get_links(peer_index)
        bridge_port = peers[0].get_attr("IFLA_IFNAME")
    return Endpoint(
        name=name, netns=netns, ifname=ifname, ip=addrs[0], bridge_port=bridge_port, bridge_netns=bridge_netns
    )


def endpoint_from_container(container, ifname: str = "eth0", bridge_netns: str | None = None) -> Endpoint:
    """A Docker container (docker SDK object, or anything with .name and .attrs) on a bridge network.

    Docker's bridges live in the host's namespace (bridge_netns None). Resolve again after a
    restart: the PID, and with it the host-side veth, change.
    """
    if hasattr(container, "reload"):
        container.reload()  # attrs are a snapshot; State.Pid changes when it restarts
    pid = container.attrs["State"]["Pid"]
    if not pid:
        raise LookupError(f"container {container.name} is not running")
    return endpoint_from_netns(container.name, f"/proc/{pid}/ns/net", ifname, bridge_netns=bridge_netns)
