"""Find and remove what a crashed run left behind, by our prefixes (see `netem.names`).

Order matters: daemons first (they hold packets), then the iptables jumps and chains (traffic
stops going to queues nobody serves), then our root qdiscs wherever a process's network namespace
shows one, then our namespaces (with anything still running inside them), then interfaces and
log files. Idempotent: a second call finds nothing and returns [].
"""
from __future__ import annotations

import glob
import os
import signal
import tempfile
import time

from pyroute2 import IPRoute
from pyroute2 import netns as pyroute2_netns
from pyroute2.netlink.exceptions import NetlinkError

from netem import kernel, names, nsutil, rules
from netem.endpoints import open_iproute
from netem.topology import remove_netns

_OUR_MODULES = ("netem.nfqueue_daemon",)


def cleanup_leftovers() -> list[str]:
    removed: list[str] = []
    removed += _kill_our_processes()
    removed += _remove_chains()
    removed += _remove_qdiscs()
    removed += _remove_namespaces()
    removed += _remove_interfaces()
    removed += _remove_logs()
    return removed


def find_leftovers() -> list[str]:
    """What `cleanup_leftovers` would remove, without touching it (for a check before a run)."""
    found = [f"process {pid}" for pid in our_processes()]
    try:
        found += [f"iptables chain {c}" for c in rules.list_chains(None, names.CHAIN_PREFIX)]
    except FileNotFoundError:
        pass
    found += [f"netns {n}" for n in sorted(pyroute2_netns.listnetns()) if n.startswith(names.PREFIX + "-")]
    with IPRoute() as ipr:
        host_ifnames = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
        found += [f"interface {n}" for n in host_ifnames if n.startswith(names.IFNAME_PREFIX)]
        found += [f"qdisc on {n}" for n in host_ifnames if _has_our_root_qdisc(ipr, n)]
    return found


def our_processes() -> list[int]:
    """Pids of our child processes: our module in argv and a ``--tag dsdbed-...`` marker."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        tagged = any(a == "--tag" and b.startswith(names.PREFIX + "-") for a, b in zip(argv, argv[1:]))
        if tagged and any(m in argv for m in _OUR_MODULES):
            pids.append(int(entry))
    return pids


def _kill_our_processes() -> list[str]:
    pids = our_processes()
    stop_processes(pids, grace_s=3.0)
    return [f"process {pid}" for pid in pids]


def stop_processes(pids: list[int], grace_s: float) -> None:
    """SIGTERM, up to grace_s for them to exit, then SIGKILL whatever is left."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_exists(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def _remove_chains() -> list[str]:
    try:
        chains = rules.list_chains(None, names.CHAIN_PREFIX)
    except FileNotFoundError:  # no iptables: we cannot have made chains either
        return []
    removed = []
    for chain in chains:
        removed += rules.remove_chain(None, chain)
    return removed


def _remove_qdiscs() -> list[str]:
    """Our root qdiscs in the host and in every network namespace a process or a name holds."""
    removed = []
    for netns in _all_netns():
        try:
            with open_iproute(netns) as ipr:
                ifnames = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
                ours = [n for n in ifnames if _has_our_root_qdisc(ipr, n)]
        except (OSError, RuntimeError, TimeoutError):
            continue  # the namespace went away while we looked
        for ifname in ours:
            removed += kernel.remove_our_root_qdisc(netns, ifname)
    return removed


def _has_our_root_qdisc(ipr: IPRoute, ifname: str) -> bool:
    index = ipr.link_lookup(ifname=ifname)
    if not index:
        return False
    return any(q["parent"] == kernel.TC_H_ROOT and q["handle"] >> 16 in names.OUR_QDISC_MAJORS
               for q in ipr.get_qdiscs(index=index[0]))


def _all_netns() -> list[str | None]:
    """One path per distinct network namespace (the host's first, as None)."""
    seen = {nsutil.netns_inode(None)}
    found: list[str | None] = [None]
    candidates = [nsutil.netns_path(n) for n in pyroute2_netns.listnetns()]
    candidates += [f"/proc/{p}/ns/net" for p in os.listdir("/proc") if p.isdigit()]
    for path in candidates:
        try:
            st = os.stat(path)
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            found.append(path)
    return found


def _remove_namespaces() -> list[str]:
    removed = []
    for name in sorted(pyroute2_netns.listnetns()):
        if name.startswith(names.PREFIX + "-"):
            remove_netns(name)
            removed.append(f"netns {name}")
    return removed


def _remove_interfaces() -> list[str]:
    removed = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            ifname = link.get_attr("IFLA_IFNAME")
            if ifname.startswith(names.IFNAME_PREFIX):
                try:
                    ipr.link("del", index=link["index"])
                except NetlinkError:
                    continue  # a veth whose peer we deleted a moment ago took it along
                removed.append(f"interface {ifname}")
    return removed


def _remove_logs() -> list[str]:
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{names.PREFIX}-*.log")):
        os.unlink(path)
        removed.append(f"file {path}")
    return removed


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
