"""Find and remove what a crashed run left behind, by our prefixes (see `netem.names`).

Order matters: daemons first (they hold packets), then the iptables jumps and chains (traffic
stops going to queues nobody serves), then our root qdiscs wherever a process's network namespace
shows one, then our namespaces (with anything still running inside them), then interfaces and
log files. Idempotent: a second call finds nothing and returns [].

A live run's objects are not leftovers (`netem.owners`: its tag's owner process still runs):
neither function touches or reports them; `live_runs` names those runs instead.
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

from netem import kernel, names, nsutil, owners, rules
from netem.endpoints import open_iproute
from netem.topology import remove_netns

_OUR_MODULES = ("netem.nfqueue_daemon",)


def cleanup_leftovers() -> list[str]:
    live = owners.live_tags()
    removed: list[str] = []
    removed += _kill_our_processes(live)
    removed += _remove_chains(live)
    removed += _remove_qdiscs(live)
    removed += _remove_namespaces(live)
    removed += _remove_interfaces(live)
    removed += _remove_logs(live)
    removed += owners.remove_dead_owner_files()
    return removed


def find_leftovers() -> list[str]:
    """What `cleanup_leftovers` would remove, without touching it (for a check before a run)."""
    live = owners.live_tags()
    found = [f"process {pid}" for pid in our_processes(live)]
    found += [f"iptables chain {c}" for c in _our_chains(live)]
    found += [f"netns {n}" for n in _our_namespaces(live)]
    with IPRoute() as ipr:
        host_ifnames = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
        found += [
            f"interface {n}"
            for n in host_ifnames
            if n.startswith(names.IFNAME_PREFIX) and not owners.ifname_is_live(n, live)
        ]
        found += [
            f"qdisc on {n}" for n in host_ifnames if _has_our_root_qdisc(ipr, n) and not owners.ifname_is_live(n, live)
        ]
    return found


def live_runs() -> list[str]:
    """Other processes' runs whose objects exist now, one line each (neither found nor removed)."""
    live = owners.live_tags()
    in_use = {owners.tag_of("netns", n) for n in pyroute2_netns.listnetns()}
    in_use |= {tag for tag, _ in _tagged_processes()}
    return [owners.describe(tag, pid) for tag, pid in sorted(live.items()) if tag in in_use]


def our_processes(live: dict[str, int] | None = None) -> list[int]:
    """Pids of our child processes of runs not in `live`: our module and a ``--tag dsdbed-...`` marker."""
    live = {} if live is None else live
    return [pid for tag, pid in _tagged_processes() if tag not in live]


def _tagged_processes() -> list[tuple[str, int]]:
    """(tag, pid) of every process of our modules that carries a tag marker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        tags = [owners.tag_of("process", b) for a, b in zip(argv, argv[1:]) if a == "--tag"]
        if tags and tags[0] and any(m in argv for m in _OUR_MODULES):
            found.append((tags[0], int(entry)))
    return found


def _kill_our_processes(live: dict[str, int]) -> list[str]:
    pids = our_processes(live)
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


def _our_chains(live: dict[str, int]) -> list[str]:
    """Our chains in the host's tables, but a live run's."""
    try:
        chains = rules.list_chains(None, names.CHAIN_PREFIX)
    except FileNotFoundError:  # no iptables: we cannot have made chains either
        return []
    return [c for c in chains if owners.tag_of("chain", c) not in live]


def _our_namespaces(live: dict[str, int]) -> list[str]:
    return [
        n
        for n in sorted(pyroute2_netns.listnetns())
        if n.startswith(names.PREFIX + "-") and owners.tag_of("netns", n) not in live
    ]


def _remove_chains(live: dict[str, int]) -> list[str]:
    removed = []
    for chain in _our_chains(live):
        removed += rules.remove_chain(None, chain)
    return removed


def _remove_qdiscs(live: dict[str, int]) -> list[str]:
    """Our root qdiscs in the host and in every network namespace a process or a name holds,
    but a live run's namespaces and interfaces."""
    removed = []
    for netns in _all_netns(live):
        try:
            with open_iproute(netns) as ipr:
                ifnames = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
                ours = [n for n in ifnames if _has_our_root_qdisc(ipr, n)]
        except (OSError, RuntimeError, TimeoutError):
            continue  # the namespace went away while we looked
        for ifname in (n for n in ours if not owners.ifname_is_live(n, live)):
            removed += kernel.remove_our_root_qdisc(netns, ifname)
    return removed


def _has_our_root_qdisc(ipr: IPRoute, ifname: str) -> bool:
    index = ipr.link_lookup(ifname=ifname)
    if not index:
        return False
    return any(
        q["parent"] == kernel.TC_H_ROOT and q["handle"] >> 16 in names.OUR_QDISC_MAJORS
        for q in ipr.get_qdiscs(index=index[0])
    )


def _all_netns(live: dict[str, int]) -> list[str | None]:
    """One path per distinct network namespace (the host's first, as None), without a live
    run's named ones (nor the processes inside them)."""
    seen = {nsutil.netns_inode(None)}
    for name in pyroute2_netns.listnetns():
        if owners.tag_of("netns", name) in live:
            try:
                seen.add(os.stat(nsutil.netns_path(name)).st_ino)
            except FileNotFoundError:
                continue
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


def _remove_namespaces(live: dict[str, int]) -> list[str]:
    removed = []
    for name in _our_namespaces(live):
        remove_netns(name)
        removed.append(f"netns {name}")
    return removed


def _remove_interfaces(live: dict[str, int]) -> list[str]:
    removed = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            ifname = link.get_attr("IFLA_IFNAME")
            if ifname.startswith(names.IFNAME_PREFIX) and not owners.ifname_is_live(ifname, live):
                try:
                    ipr.link("del", index=link["index"])
                except NetlinkError:
                    continue  # a veth whose peer we deleted a moment ago took it along
                removed.append(f"interface {ifname}")
    return removed


def _remove_logs(live: dict[str, int]) -> list[str]:
    """Our children's logs, but those a live run's daemons still write (their stderr)."""
    in_use = set()
    for tag, pid in _tagged_processes():
        if tag in live:
            try:
                in_use.add(os.readlink(f"/proc/{pid}/fd/2"))
            except OSError:
                continue
    removed = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{names.PREFIX}-*.log")):
        if os.path.realpath(path) in in_use:
            continue
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
