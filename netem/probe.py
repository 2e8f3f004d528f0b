"""Which backend can shape links on this machine, found by trying, in a throwaway namespace.

- kernel-netem: a netem qdisc on a veth. pyroute2 raises NetlinkError ENOENT when the kernel
  has no sch_netem (and cannot load it).
- nfqueue: the NetfilterQueue module imports and iptables accepts an NFQUEUE rule.

Nothing outside the probe namespace (``dsdbed-<tag>-probe``) is touched; it is removed at once.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass

from pyroute2 import netns as pyroute2_netns
from pyroute2.netlink.exceptions import NetlinkError

from netem import names, nsutil, owners
from netem.endpoints import ifindex, open_iproute
from netem.topology import remove_netns

log = logging.getLogger(__name__)

KERNEL_NETEM = "kernel-netem"
NFQUEUE = "nfqueue"
BACKENDS = (KERNEL_NETEM, NFQUEUE)


@dataclass(frozen=True)
class ProbeResult:
    kernel_netem: bool
    nfqueue: bool
    detail: str


@functools.lru_cache(maxsize=1)
def probe_backends() -> ProbeResult:
    """Probe once per process: the answer does not change while we run."""
    tag = names.new_tag()
    name = names.netns_name(tag, "probe")
    owners.claim(tag)
    try:
        pyroute2_netns.create(name)
        try:
            path = nsutil.netns_path(name)
            netem_ok, netem_detail = _probe_netem(path)
            nfq_ok, nfq_detail = _probe_nfqueue(path)
        finally:
            remove_netns(name)
    finally:
        owners.release(tag)
    result = ProbeResult(netem_ok, nfq_ok, f"{netem_detail}; {nfq_detail}")
    log.info("backend probe: %s", result)
    return result


def _probe_netem(netns: str) -> tuple[bool, str]:
    with open_iproute(netns) as ipr:
        ipr.link("add", ifname="dsdbprobe0", kind="veth", peer="dsdbprobe1")
        index = ifindex(ipr, "dsdbprobe0")
        try:
            ipr.tc("add", "netem", index, names.qdisc_handle(names.QDISC_MAJOR_NETEM), delay=1000)
        except NetlinkError as exc:
            if exc.code == 2:
                return False, "sch_netem missing (ENOENT)"
            return False, f"sch_netem failed: {exc}"
    return True, "sch_netem works"


def _probe_nfqueue(netns: str) -> tuple[bool, str]:
    try:
        importlib.import_module("netfilterqueue")  # the compiled extension must load, not just exist
    except ImportError as exc:
        return False, f"NetfilterQueue not importable ({exc}): pip install NetfilterQueue"
    try:
        added = nsutil.run(
            ["iptables", "-w", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0"], netns=netns, check=False
        )
    except FileNotFoundError:
        return False, "iptables not installed"
    if added.returncode != 0:
        return False, f"iptables -j NFQUEUE failed: {added.stderr.strip()}"
    return True, "iptables NFQUEUE works"


def choose_backend(requested: str, needs_kernel_free: str | None = None) -> tuple[str, str]:
    """(backend, why). `requested` is "auto" or one of BACKENDS; `needs_kernel_free` names a
    reason the links cannot use the kernel backend (e.g. a distribution netem cannot load)."""
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {requested!r}")
    result = probe_backends()
    if requested == KERNEL_NETEM:
        if not result.kernel_netem:
            raise RuntimeError(f"backend kernel-netem requested but unavailable: {result.detail}")
        return KERNEL_NETEM, "requested"
    if requested == NFQUEUE:
        if not result.nfqueue:
            raise RuntimeError(f"backend nfqueue requested but unavailable: {result.detail}")
        return NFQUEUE, "requested"
    if result.kernel_netem and needs_kernel_free is None:
        return KERNEL_NETEM, f"auto: {result.detail}"
    if result.nfqueue:
        reason = needs_kernel_free or result.detail
        return NFQUEUE, f"auto: {reason}"
    raise RuntimeError(f"no backend can shape links here: {result.detail}")
