"""A test network: N edge namespaces and one verifier namespace on a bridge in its own namespace.

    dsdbed-TAG-e0 [dsdbeth0] --- [dsdbp0] \
    ...                                    dsdbbr0  (in dsdbed-TAG-br)
    dsdbed-TAG-v  [dsdbeth0] --- [dsdbpv] /

Addresses come from ``subnet`` (default 198.18.0.0/24, the range RFC 2544 sets aside for
benchmarking): the verifier gets the first host address, edge i the (i+2)-th. The namespaces have
no route anywhere else, so traffic to these addresses never leaves them. IPv6 is off in every
namespace: the iptables rules of the userspace shaper are IPv4 only and nothing may bypass them.

Declared first (`plan_topology`, plain data), then realised by `Topology` and torn down on exit.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
from dataclasses import dataclass, field

from pyroute2 import netns as pyroute2_netns

from netem import names, nsutil, owners
from netem.endpoints import Endpoint, Link, ifindex, open_iproute
from netem.spec import LinkSpec

log = logging.getLogger(__name__)

BRIDGE_IFNAME = "dsdbbr0"
ENDPOINT_IFNAME = "dsdbeth0"
DEFAULT_SUBNET = "198.18.0.0/24"
MAX_EDGES = 250


@dataclass(frozen=True)
class TopologyConfig:
    n_edges: int
    tag: str = field(default_factory=names.new_tag)
    subnet: str = DEFAULT_SUBNET

    def __post_init__(self):
        if isinstance(self.n_edges, bool) or not isinstance(self.n_edges, int) or not 1 <= self.n_edges <= MAX_EDGES:
            raise ValueError(f"n_edges must be an integer in [1, {MAX_EDGES}], got {self.n_edges!r}")
        names.check_tag(self.tag)
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as exc:
            raise ValueError(f"subnet must be an IPv4 network, got {self.subnet!r}: {exc}") from None
        if net.num_addresses - 2 < self.n_edges + 1:
            raise ValueError(f"subnet {self.subnet!r} has too few addresses for {self.n_edges} edges + verifier")


@dataclass(frozen=True)
class PlannedEndpoint:
    name: str  # "verifier", "edge0", ...
    netns_name: str
    bridge_port: str
    ip: str


@dataclass(frozen=True)
class TopologyPlan:
    bridge_netns_name: str
    prefixlen: int
    verifier: PlannedEndpoint
    edges: tuple[PlannedEndpoint, ...]

    @property
    def all_netns(self) -> list[str]:
        return [self.bridge_netns_name, self.verifier.netns_name, *(e.netns_name for e in self.edges)]


def plan_topology(config: TopologyConfig) -> TopologyPlan:
    net = ipaddress.IPv4Network(config.subnet)
    hosts = net.hosts()
    verifier = PlannedEndpoint(
        "verifier", names.netns_name(config.tag, "v"), names.check_ifname("dsdbpv"), str(next(hosts))
    )
    edges = tuple(
        PlannedEndpoint(
            f"edge{i}", names.netns_name(config.tag, f"e{i}"), names.check_ifname(f"dsdbp{i}"), str(next(hosts))
        )
        for i in range(config.n_edges)
    )
    return TopologyPlan(names.netns_name(config.tag, "br"), net.prefixlen, verifier, edges)


class Topology:
    """Context manager: realises a `TopologyPlan`, removes every namespace on exit."""

    def __init__(self, config: TopologyConfig):
        self.config = config
        self.plan = plan_topology(config)
        self.verifier: Endpoint | None = None
        self.edges: list[Endpoint] = []
        self._created: list[str] = []
        self._claimed = False

    @property
    def bridge_netns(self) -> str:
        return nsutil.netns_path(self.plan.bridge_netns_name)

    def links(self, specs: list[LinkSpec] | LinkSpec) -> list[Link]:
        """Links for the first len(specs) edges, in order (a single spec: one link per edge)."""
        if isinstance(specs, LinkSpec):
            specs = [specs] * len(self.edges)
        if not 1 <= len(specs) <= len(self.edges):
            raise ValueError(f"specs must have 1 to {len(self.edges)} entries (one per edge), got {len(specs)}")
        return [Link(e.name, e, self.verifier, s) for e, s in zip(self.edges, specs)]

    def __enter__(self) -> Topology:
        try:
            self._realise()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _realise(self) -> None:
        plan = self.plan
        owners.claim(self.config.tag)  # before the first namespace: ours while we run
        self._claimed = True
        for name in plan.all_netns:
            if os.path.exists(nsutil.netns_path(name)):
                raise RuntimeError(f"network namespace {name} exists already (tag reused?)")
            pyroute2_netns.create(name)
            self._created.append(name)
            path = nsutil.netns_path(name)
            # Before any interface exists, so none of them ever gets an IPv6 address.
            for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
                nsutil.write_sysctl(path, key, "1")
        bridge_ns = nsutil.netns_path(plan.bridge_netns_name)
        with open_iproute(bridge_ns) as ipr:
            ipr.link("set", index=ifindex(ipr, "lo"), state="up")
            # STP off and no forward delay: ports forward the moment they are up.
            ipr.link("add", ifname=BRIDGE_IFNAME, kind="bridge", br_stp_state=0, br_forward_delay=0)
            bridge_index = ifindex(ipr, BRIDGE_IFNAME)
            ipr.link("set", index=bridge_index, state="up")
            for ep in (plan.verifier, *plan.edges):
                ipr.link(
                    "add",
                    ifname=ep.bridge_port,
                    kind="veth",
                    peer={"ifname": ENDPOINT_IFNAME, "net_ns_fd": nsutil.netns_path(ep.netns_name)},
                )
                port_index = ifindex(ipr, ep.bridge_port)
                ipr.link("set", index=port_index, master=bridge_index, state="up")
        for ep in (plan.verifier, *plan.edges):
            with open_iproute(nsutil.netns_path(ep.netns_name)) as ipr:
                ipr.link("set", index=ifindex(ipr, "lo"), state="up")
                index = ifindex(ipr, ENDPOINT_IFNAME)
                ipr.addr("add", index=index, address=ep.ip, prefixlen=plan.prefixlen)
                ipr.link("set", index=index, state="up")
        self.verifier = self._endpoint(plan.verifier)
        self.edges = [self._endpoint(e) for e in plan.edges]

    def _endpoint(self, ep: PlannedEndpoint) -> Endpoint:
        return Endpoint(
            name=ep.name,
            netns=nsutil.netns_path(ep.netns_name),
            ifname=ENDPOINT_IFNAME,
            ip=ep.ip,
            bridge_port=ep.bridge_port,
            bridge_netns=self.bridge_netns,
        )

    def close(self) -> None:
        for name in reversed(self._created):
            remove_netns(name)
        self._created.clear()
        if self._claimed:
            owners.release(self.config.tag)
            self._claimed = False


def remove_netns(name: str) -> None:
    """Delete a namespace of ours; a process still inside would keep it alive unseen, so it goes too.

    Only our own namespaces get here (created by this run, or found by prefix), so whatever runs
    inside was started by us.
    """
    for pid in netns_pids(name):
        log.warning("killing pid %d left in network namespace %s", pid, name)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        pyroute2_netns.remove(name)
    except FileNotFoundError:
        pass


def netns_pids(name: str) -> list[int]:
    try:
        st = os.stat(nsutil.netns_path(name))
    except FileNotFoundError:
        return []
    key = (st.st_dev, st.st_ino)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
            if (st.st_dev, st.st_ino) == key:
                pids.append(int(entry))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return pids
