"""The kernel backend's plan: the exact tc requests for each link, as plain data.

Per direction, on the egress of the interface the packets leave by (up: the edge's own
interface; down: the edge's port on the bridge, where verifier->edge traffic leaves the bridge):

    without a rate:  netem  handle D5DC:  at the root
    with a rate:     htb    handle D5DB:  at the root, default class D5DB:1
                     class  D5DB:1        rate = ceil = rate_mbit
                     netem  handle D5DC:  parent D5DB:1

netem sits below the rate limiter, so the limiter's backlog is not added to every packet's delay
twice and the limiter sees each packet once. The handle majors are our "prefix" for qdiscs (a qdisc
has no name), so `cleanup_leftovers` can tell our root qdiscs from anyone else's.

Attributes are in pyroute2's units (the `pyroute2_units` function is the only place that
converts): delay and jitter integer microseconds, loss percent, rate bytes per second.
Requests use "replace": applying a plan twice gives the same kernel state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from netem.endpoints import Link
from netem.model import DEFAULT_BACKLOG_PKTS, queue_limit_pkts
from netem.names import QDISC_MAJOR_NETEM, QDISC_MAJOR_RATE, qdisc_handle
from netem.spec import DirectionSpec

RATE_ROOT = qdisc_handle(QDISC_MAJOR_RATE, 0)
RATE_CLASS = qdisc_handle(QDISC_MAJOR_RATE, 1)
NETEM_HANDLE = qdisc_handle(QDISC_MAJOR_NETEM, 0)


@dataclass(frozen=True)
class TcRequest:
    command: str  # pyroute2 tc command: "replace" (a qdisc) or "replace-class"
    kind: str  # "htb" or "netem"
    netns: str | None
    ifname: str
    handle: int
    parent: int | None  # None: the root
    attrs: dict = field(default_factory=dict)  # pyroute2 keyword arguments, in its units

    def describe(self) -> str:
        where = "root" if self.parent is None else f"parent {self.parent >> 16:x}:{self.parent & 0xFFFF:x}"
        return (
            f"tc {self.command} {self.kind} dev {self.ifname} (netns {self.netns}) "
            f"handle {self.handle >> 16:x}:{self.handle & 0xFFFF:x} {where} {self.attrs}"
        )


class KernelPlanError(ValueError):
    """A spec the kernel backend cannot express."""


def pyroute2_units(direction: DirectionSpec, limit_pkts: int) -> tuple[dict, dict | None]:
    """netem kwargs and htb class kwargs (None without a rate) in pyroute2's units."""
    if direction.distribution != "uniform":
        # pyroute2 0.9 cannot send netem's distribution table (TCA_NETEM_DELAY_DIST is a TODO
        # there), and without a table netem draws uniformly.
        raise KernelPlanError(
            f"distribution {direction.distribution!r} needs a netem distribution table, which pyroute2 "
            "cannot load: use distribution='uniform' or the nfqueue backend"
        )
    netem = {
        "delay": round(direction.delay_ms * 1000),
        "jitter": round(direction.jitter_ms * 1000),
        "loss": direction.loss_pct,
        "limit": limit_pkts,
    }
    # pyroute2 refuses a correlation without the thing it correlates.
    if direction.correlation_pct and netem["jitter"]:
        netem["delay_corr"] = direction.correlation_pct
    if direction.correlation_pct and direction.loss_pct:
        netem["loss_corr"] = direction.correlation_pct
    rate = None
    if direction.rate_bytes_s is not None:
        rate_bytes_s = round(direction.rate_bytes_s)
        rate = {"rate": rate_bytes_s, "ceil": rate_bytes_s}
    return netem, rate


def plan_direction(netns: str | None, ifname: str, direction: DirectionSpec, max_pps: int) -> list[TcRequest]:
    netem, rate = pyroute2_units(direction, queue_limit_pkts(direction, max_pps, DEFAULT_BACKLOG_PKTS))
    if rate is None:
        return [TcRequest("replace", "netem", netns, ifname, NETEM_HANDLE, None, netem)]
    return [
        TcRequest("replace", "htb", netns, ifname, RATE_ROOT, None, {"default": RATE_CLASS & 0xFFFF}),
        TcRequest("replace-class", "htb", netns, ifname, RATE_CLASS, RATE_ROOT, rate),
        TcRequest("replace", "netem", netns, ifname, NETEM_HANDLE, RATE_CLASS, netem),
    ]


def plan_link(link: Link, max_pps: int) -> list[TcRequest]:
    up = plan_direction(link.edge.netns, link.edge.ifname, link.spec.up, max_pps)
    down = plan_direction(link.edge.bridge_netns, link.edge.bridge_port, link.spec.down, max_pps)
    return up + down


def plan_links(links: list[Link], max_pps: int) -> list[TcRequest]:
    return [request for link in links for request in plan_link(link, max_pps)]
