"""The kernel backend: apply a `plan.TcRequest` list with pyroute2, read it back, remove it.

`observe` turns the kernel's answer into plain data and `compare` (pure) checks it against the
plan, so the comparison is tested without a kernel that has sch_netem.
"""

from __future__ import annotations

import math
from itertools import groupby

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import sched_netem

from netem.endpoints import ifindex, open_iproute
from netem.names import OUR_QDISC_MAJORS
from netem.plan import TcRequest

TC_H_ROOT = 0xFFFFFFFF
_ENOENT, _EINVAL = 2, 22


class NetemMissing(RuntimeError):
    """This kernel has no sch_netem (pyroute2 gets ENOENT when asking for one)."""


def _by_interface(plan: list[TcRequest]):
    key = lambda r: (r.netns or "", r.ifname)  # noqa: E731
    for (netns, ifname), requests in groupby(sorted(plan, key=key), key=key):
        yield (netns or None), ifname, list(requests)


def apply_plan(plan: list[TcRequest]) -> None:
    # sorted() is stable: each interface keeps the plan's parent-before-child order.
    for netns, ifname, requests in _by_interface(plan):
        with open_iproute(netns) as ipr:
            index = ifindex(ipr, ifname)
            for request in requests:
                _apply_one(ipr, index, request)


def _apply_one(ipr, index: int, request: TcRequest) -> None:
    kwargs = dict(request.attrs)
    if request.parent is not None:
        kwargs["parent"] = request.parent
    if request.kind == "htb" and request.command == "replace":
        # htb cannot change in place (replace gives EINVAL): keep ours, replace anything else.
        current = [q for q in ipr.get_qdiscs(index=index) if q["parent"] == TC_H_ROOT]
        if current and current[0].get_attr("TCA_KIND") == "htb" and current[0]["handle"] == request.handle:
            return
    try:
        ipr.tc(request.command, request.kind, index, request.handle, **kwargs)
    except NetlinkError as exc:
        if exc.code == _ENOENT and request.kind == "netem":
            raise NetemMissing(f"sch_netem is not available: {request.describe()}") from exc
        raise RuntimeError(f"{request.describe()} failed: {exc}") from exc


def observe(netns: str | None, ifname: str) -> list[dict]:
    """The qdiscs and classes on one interface, as plain data."""
    with open_iproute(netns) as ipr:
        index = ifindex(ipr, ifname)
        seen = [_qdisc_data(q) for q in ipr.get_qdiscs(index=index)]
        seen += [_class_data(c) for c in ipr.get_classes(index=index)]
    return seen


def _parent(msg) -> int | None:
    return None if msg["parent"] == TC_H_ROOT else msg["parent"]


def _qdisc_data(msg) -> dict:
    kind = msg.get_attr("TCA_KIND")
    data = {"command": "replace", "kind": kind, "handle": msg["handle"], "parent": _parent(msg), "options": {}}
    opts = msg.get_attr("TCA_OPTIONS")
    if kind == "netem" and opts is not None:
        data["options"] = {k: opts[k] for k in ("delay", "jitter", "loss", "limit")}
        corr = opts.get_attr("TCA_NETEM_CORR")
        if corr is not None:
            data["options"].update(delay_corr=corr["delay_corr"], loss_corr=corr["loss_corr"])
    return data


def _class_data(msg) -> dict:
    data = {
        "command": "replace-class",
        "kind": msg.get_attr("TCA_KIND"),
        "handle": msg["handle"],
        "parent": _parent(msg),
        "options": {},
    }
    opts = msg.get_attr("TCA_OPTIONS")
    parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
    if parms is not None:
        data["options"] = {"rate": parms["rate"], "ceil": parms["ceil"]}
    return data


def expected_options(request: TcRequest) -> dict:
    """What the kernel reports back for a request, in its units (netem: scheduler ticks, u32 shares)."""
    if request.kind == "netem":
        wire = sched_netem.get_parameters(dict(request.attrs))
        expected = {k: int(wire[k]) for k in ("delay", "jitter", "loss", "limit")}
        for name, value in wire["attrs"]:
            if name == "TCA_NETEM_CORR":
                expected.update(delay_corr=value["delay_corr"], loss_corr=value["loss_corr"])
        return expected
    if request.command == "replace-class":
        return {"rate": request.attrs["rate"], "ceil": request.attrs["ceil"]}
    return {}


def compare(requests: list[TcRequest], observed: list[dict]) -> list[str]:
    """Differences between planned requests and observed kernel state; empty when they agree.

    Delays come back through the kernel's nanosecond storage: one tick of rounding is allowed.
    The root htb's parent reads back as the root, and a top class's parent as the root too.
    """
    problems = []
    for request in requests:
        match = [o for o in observed if o["command"] == request.command and o["handle"] == request.handle]
        if not match:
            problems.append(f"missing: {request.describe()}")
            continue
        seen = match[0]
        if seen["kind"] != request.kind:
            problems.append(f"{request.describe()}: kernel has kind {seen['kind']!r}")
        if request.command == "replace" and seen["parent"] != request.parent:
            problems.append(f"{request.describe()}: kernel has parent {seen['parent']!r}")
        for key, want in expected_options(request).items():
            have = seen["options"].get(key)
            if have is None or not math.isclose(have, want, rel_tol=1e-3, abs_tol=1):
                problems.append(f"{request.describe()}: {key} is {have!r} in the kernel, planned {want!r}")
    return problems


def read_back(plan: list[TcRequest]) -> list[str]:
    problems = []
    for netns, ifname, requests in _by_interface(plan):
        problems += compare(requests, observe(netns, ifname))
    return problems


def remove_plan(plan: list[TcRequest]) -> list[str]:
    """Delete our root qdisc on every interface of the plan (children go with it)."""
    removed = []
    for netns, ifname, _ in _by_interface(plan):
        removed += remove_our_root_qdisc(netns, ifname)
    return removed


def remove_our_root_qdisc(netns: str | None, ifname: str) -> list[str]:
    try:
        with open_iproute(netns) as ipr:
            index = ifindex(ipr, ifname)
            for q in ipr.get_qdiscs(index=index):
                if q["parent"] == TC_H_ROOT and q["handle"] >> 16 in OUR_QDISC_MAJORS:
                    ipr.tc("del", index=index, handle=q["handle"], parent=TC_H_ROOT)
                    return [f"qdisc {q['handle'] >> 16:x}: on {ifname}" + (f" in {netns}" if netns else "")]
    except (LookupError, FileNotFoundError):
        pass  # the interface or its namespace is gone, and the qdisc with it
    except NetlinkError as exc:
        if exc.code not in (_ENOENT, _EINVAL):
            raise
    return []
