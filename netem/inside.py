"""Shaping a link from inside one of its ends: the edge's own network namespace.

Where the orchestrator cannot reach the bridge between an edge and its verifier (a container on
another Docker Swarm node, a device someone started by hand), the edge shapes its own link to one
peer, the verifier, from inside its namespace (CAP_NET_ADMIN and CAP_NET_RAW there). The same
pieces as `Shaper`, placed differently:

    with InsideShaper(ShaperConfig()) as shaper:
        record = shaper.apply("10.0.9.2", LinkSpec(rtt_ms=20))   # base RTT, apply, read back, measure
        ...                                  # shaper.check() raises if the daemon died
    # rules, daemon, qdiscs and the ifb device are gone here

- kernel-netem (where the kernel has sch_netem): "up" is a netem qdisc at the root of the
  interface the route to the peer leaves by; "down" is a netem qdisc on an ifb device that the
  interface's ingress redirects to (u32 match-all + mirred). NOTE: netem at an interface's root
  delays everything that leaves by it, control traffic included; only the NFQUEUE backend picks
  the peer's packets out. netem orphans the packets it holds, so TCP's small-queue limit does not
  stall the sender.
- nfqueue: one chain of ours, jumped to from OUTPUT and INPUT: packets to the peer are queued
  for "up", packets from the peer for "down", in the daemon (`netem.nfqueue_daemon`), which runs
  in this namespace. An "up" packet is sent by a local socket, so the daemon copies it, drops
  the original at once and sends the copy at its release time from a raw socket whose firewall
  mark (``REINJECT_MARK``) the rule skips (see the daemon's docstring: holding the original
  would stall TCP behind its own delayed segments). A "down" packet has left its sender's
  accounting when it arrives, and is held as on a bridge.

The link is verified as the bridge shaper's is (`netem.measure`: ICMP echo to the peer, kernel
receive timestamps), against the base RTT measured just before shaping plus the configured one:
a real link's own round trip is not zero.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netem import kernel, names, nsutil, owners, rules
from netem.daemon import NfqueueDaemon, QueueAssignment
from netem.measure import PROBE_IP_BYTES, LinkMeasurement, RttTarget, probe_rtts, summarize
from netem.model import queue_limit_pkts
from netem.plan import TcRequest, plan_direction
from netem.probe import BACKENDS, KERNEL_NETEM, NFQUEUE
from netem.shaper import ShaperConfig, ShaperFailed
from netem.spec import LinkSpec

log = logging.getLogger(__name__)

REINJECT_MARK = 0x44534442  # "DSDB": copies the daemon sends; the "up" rule skips them
INGRESS_HANDLE = 0xFFFF0000
ETH_P_ALL = 0x0003
BASE_PROBES = 20


@dataclass(frozen=True)
class InsideRulePlan:
    """The chain that queues the link's packets, in the namespace we run in."""

    chain: str
    peer_ip: str
    queue_up: int
    queue_down: int
    mark: int = REINJECT_MARK

    def rule_specs(self) -> list[str]:
        """The chain's rules exactly as ``iptables -S CHAIN`` prints them."""
        return [
            f"-A {self.chain} -d {self.peer_ip}/32 -m mark ! --mark 0x{self.mark:x} "
            f"-j NFQUEUE --queue-num {self.queue_up}",
            f"-A {self.chain} -s {self.peer_ip}/32 -j NFQUEUE --queue-num {self.queue_down}",
        ]

    def restore_text(self) -> str:
        return "\n".join(["*filter", f":{self.chain} - [0:0]", *self.rule_specs(), "COMMIT", ""])

    @property
    def jumps(self) -> list[list[str]]:
        # OUTPUT sees what we send (only the -d rule can match), INPUT what we receive (-s).
        return [["OUTPUT", "-j", self.chain], ["INPUT", "-j", self.chain]]


def plan_inside_rules(tag: str, peer_ip: str, queue_base: int) -> InsideRulePlan:
    return InsideRulePlan(names.chain_name(tag), peer_ip, queue_base, queue_base + 1)


def ifb_name(tag: str) -> str:
    return names.check_ifname(f"dsdbi{tag}"[: names.IFNAME_MAX_CHARS])


def plan_inside_kernel(ifname: str, ifb: str, spec: LinkSpec, max_pps: int) -> list[TcRequest]:
    """Up: netem at the root of the interface towards the peer; down: netem on the ifb device."""
    return plan_direction(None, ifname, spec.up, max_pps) + plan_direction(None, ifb, spec.down, max_pps)


def route_interface(peer_ip: str) -> str:
    """The interface the route to the peer leaves by, in this namespace."""
    with IPRoute() as ipr:
        try:
            routes = ipr.route("get", dst=peer_ip)
        except NetlinkError as exc:
            raise ShaperFailed(f"no route to the peer {peer_ip}: {exc}") from None
        index = routes[0].get_attr("RTA_OIF")
        ifname = ipr.get_links(index)[0].get_attr("IFLA_IFNAME")
    if ifname == "lo":
        raise ShaperFailed(f"the peer {peer_ip} is this host (route via lo): there is no link to shape")
    return ifname


# ---- which backend works here --------------------------------------------------------------


def probe_here(tag: str) -> tuple[bool, bool, str]:
    """(kernel netem works, NFQUEUE works, detail), tried in this namespace without touching any
    traffic: a netem qdisc on a throwaway veth pair, an NFQUEUE rule in a chain nothing jumps to."""
    netem_ok, netem_detail = False, ""
    pair = (names.check_ifname(f"dsdbp{tag}a"[:15]), names.check_ifname(f"dsdbp{tag}b"[:15]))
    with IPRoute() as ipr:
        try:
            ipr.link("add", ifname=pair[0], kind="veth", peer=pair[1])
            try:
                ipr.tc(
                    "add",
                    "netem",
                    ipr.link_lookup(ifname=pair[0])[0],
                    names.qdisc_handle(names.QDISC_MAJOR_NETEM),
                    delay=1000,
                )
                netem_ok, netem_detail = True, "sch_netem works"
            except NetlinkError as exc:
                netem_detail = "sch_netem missing (ENOENT)" if exc.code == 2 else f"sch_netem failed: {exc}"
            finally:
                ipr.link("del", ifname=pair[0])
        except NetlinkError as exc:
            netem_detail = f"cannot make a veth here ({exc}): CAP_NET_ADMIN?"
    try:
        __import__("netfilterqueue")
    except ImportError as exc:
        return netem_ok, False, f"{netem_detail}; NetfilterQueue not importable ({exc})"
    chain = f"{names.chain_name(tag)}-P"
    try:
        made = nsutil.run(["iptables", "-w", "-N", chain], check=False)
        if made.returncode != 0:
            return netem_ok, False, f"{netem_detail}; iptables -N failed: {made.stderr.strip()}"
        added = nsutil.run(["iptables", "-w", "-A", chain, "-j", "NFQUEUE", "--queue-num", "0"], check=False)
        nfq_ok = added.returncode == 0
        nfq_detail = "iptables NFQUEUE works" if nfq_ok else f"iptables -j NFQUEUE failed: {added.stderr.strip()}"
    except FileNotFoundError:
        return netem_ok, False, f"{netem_detail}; iptables not installed"
    finally:
        rules.remove_chain(None, chain)
    return netem_ok, nfq_ok, f"{netem_detail}; {nfq_detail}"


def choose_here(requested: str, tag: str) -> tuple[str, str]:
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {requested!r}")
    netem_ok, nfq_ok, detail = probe_here(tag)
    if (requested == KERNEL_NETEM and not netem_ok) or (requested == NFQUEUE and not nfq_ok):
        raise ShaperFailed(f"backend {requested} requested but unavailable here: {detail}")
    if requested != "auto":
        return requested, "requested"
    if netem_ok:
        return KERNEL_NETEM, f"auto: {detail}"
    if nfq_ok:
        return NFQUEUE, f"auto: {detail}"
    raise ShaperFailed(f"no backend can shape this link from inside: {detail}")


# ---- the shaper ----------------------------------------------------------------------------


@dataclass
class InsideRecord:
    """What was done to the link, as JSON for the edge's control API."""

    peer_ip: str
    interface: str
    spec: LinkSpec
    backend: str
    backend_reason: str
    base: LinkMeasurement | None = None  # before shaping: the real link's own RTT
    measured: LinkMeasurement | None = None  # after: should be base + configured
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        def m(x):
            return None if x is None else {k: getattr(x, k) for k in x.__dataclass_fields__}

        return {
            "peer_ip": self.peer_ip,
            "interface": self.interface,
            "spec": self.spec.as_dict(),
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "base": m(self.base),
            "measured": m(self.measured),
            "problems": self.problems,
        }


class InsideShaper:
    """One `apply` per instance, like `Shaper`; `close` undoes it in the order that never
    blackholes the link (rules, daemon, qdiscs, ifb)."""

    def __init__(self, config: ShaperConfig):
        self.config = config
        self.record: InsideRecord | None = None
        self.rule_plan: InsideRulePlan | None = None
        self.daemon: NfqueueDaemon | None = None
        self.tc_plan: list[TcRequest] = []
        self.ifb: str | None = None
        self._ingress_on: str | None = None
        self._lock = threading.Lock()
        self._claimed = False

    def __enter__(self) -> InsideShaper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def apply(self, peer_ip: str, spec: LinkSpec, tolerance_ms: float | None = None) -> InsideRecord:
        if self.record is not None:
            raise RuntimeError("apply() was called already: use one InsideShaper per link setting")
        socket.inet_aton(peer_ip)  # an IPv4 address (the rules are IPv4 only)
        tolerance_ms = self.config.verify_tolerance_ms if tolerance_ms is None else tolerance_ms
        ifname = route_interface(peer_ip)
        with self._lock:
            if not self._claimed:  # the probe's and the shaping's objects are ours from here
                owners.claim(self.config.tag)
                self._claimed = True
        backend, reason = choose_here(self.config.backend, self.config.tag)
        if backend == KERNEL_NETEM and spec.distribution != "uniform":
            raise ShaperFailed(f"distribution {spec.distribution!r} needs the nfqueue backend here")
        record = InsideRecord(peer_ip, ifname, spec, backend, reason)
        count = self.config.verify_count
        if count:
            record.base = self._measure(peer_ip, LinkSpec(rtt_ms=0.0), min(count, BASE_PROBES))
        log.info("shaping the link to %s on %s with %s (%s)", peer_ip, ifname, backend, reason)
        try:
            if backend == KERNEL_NETEM:
                self._apply_kernel(ifname, spec)
            else:
                self._apply_nfqueue(peer_ip, spec)
                priority = self.daemon.child.ready_info.get("realtime", True)
                if priority is not True:
                    record.backend_reason += (
                        f"; daemon not real-time ({priority or 'normal priority'}): SCHED_FIFO "
                        "needs CAP_SYS_NICE and a cgroup real-time budget"
                    )
            self.record = record
            if count:
                record.measured = self._measure(peer_ip, spec, count, base=record.base)
                record.problems = record.measured.problems(tolerance_ms)
                if record.problems:
                    raise ShaperFailed(
                        f"link to {peer_ip} does not behave as configured: " + "; ".join(record.problems)
                    )
        except BaseException:
            self.close()
            raise
        return record

    def _apply_kernel(self, ifname: str, spec: LinkSpec) -> None:
        ifb = ifb_name(self.config.tag)
        with IPRoute() as ipr:
            ipr.link("add", ifname=ifb, kind="ifb")
            self.ifb = ifb
            ifb_index = ipr.link_lookup(ifname=ifb)[0]
            ipr.link("set", index=ifb_index, state="up")
            index = ipr.link_lookup(ifname=ifname)[0]
            ipr.tc("add", "ingress", index, INGRESS_HANDLE)
            self._ingress_on = ifname
            ipr.tc(
                "add-filter",
                "u32",
                index,
                parent=INGRESS_HANDLE,
                protocol=ETH_P_ALL,
                keys=["0x0/0x0+0"],
                action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb_index},
            )
        self.tc_plan = plan_inside_kernel(ifname, ifb, spec, self.config.max_pps)
        kernel.apply_plan(self.tc_plan)
        problems = kernel.read_back(self.tc_plan)
        if problems:
            raise ShaperFailed("kernel state differs from the plan: " + "; ".join(problems))

    def _apply_nfqueue(self, peer_ip: str, spec: LinkSpec) -> None:
        c = self.config
        plan = plan_inside_rules(c.tag, peer_ip, c.queue_base)
        assignments = [
            QueueAssignment(
                queue_num=q,
                label=f"{peer_ip}/{label}",
                direction=d,
                limit_pkts=queue_limit_pkts(d, c.max_pps, c.backlog_pkts),
                backlog_pkts=c.backlog_pkts,
                seed=c.seed * 1_000_003 + q,
                reinject=label == "up",
            )
            for q, label, d in ((plan.queue_up, "up", spec.up), (plan.queue_down, "down", spec.down))
        ]
        # The daemon first: a rule pointing at a queue nobody serves drops packets.
        self.daemon = NfqueueDaemon.start(
            None,
            assignments,
            names.process_tag(c.tag),
            rt_priority=c.rt_priority,
            ready_timeout_s=c.ready_timeout_s,
            reinject_mark=plan.mark,
        )
        self.rule_plan = plan
        nsutil.run(["iptables-restore", "-w", "--noflush"], input_text=plan.restore_text())
        for jump in plan.jumps:
            nsutil.run(["iptables", "-w", "-I", jump[0], "1", *jump[1:]])
        problems = read_back_rules(plan)
        if problems:
            raise ShaperFailed("iptables state differs from the plan: " + "; ".join(problems))

    def _measure(
        self, peer_ip: str, spec: LinkSpec, count: int, base: LinkMeasurement | None = None
    ) -> LinkMeasurement:
        """ICMP echo to the peer from here; expected: the base median plus the configured RTT."""
        base_ms = base.rtt_p50_ms if base is not None and base.n_received else 0.0
        expected_ms = spec.expected_rtt_ms(PROBE_IP_BYTES) + base_ms
        timeout_s = 1.0 + 3.0 * expected_ms / 1000.0
        # Read times, not the kernel's receive stamps: "down" is held after the stamp is taken.
        rtts = probe_rtts(
            [RttTarget(peer_ip, None, peer_ip)], count, self.config.verify_interval_s, timeout_s, kernel_stamps=False
        )[0]
        s = summarize(rtts, count)
        return LinkMeasurement(
            configured_rtt_ms=expected_ms,
            expected_rtt_stdev_ms=spec.expected_rtt_stdev_ms,
            expected_loss_pct=spec.expected_rtt_loss_pct,
            rtt_p50_ms=s.p50_ms,
            rtt_p99_ms=s.p99_ms,
            rtt_stdev_ms=s.stdev_ms,
            loss_pct=s.loss_pct,
            n_sent=s.n_sent,
            n_received=s.n_received,
        )

    def failures(self) -> list[str]:
        return self.daemon.failures() if self.daemon is not None else []

    def check(self) -> None:
        if self.daemon is not None:
            self.daemon.check()

    def close(self) -> None:
        with self._lock:
            errors = []
            if self.rule_plan is not None:
                _step(errors, rules.remove_chain, None, self.rule_plan.chain)
                self.rule_plan = None
            if self.daemon is not None:
                _step(errors, self.daemon.stop)
                self.daemon = None
            if self.tc_plan:
                _step(errors, kernel.remove_plan, self.tc_plan)
                self.tc_plan = []
            if self._ingress_on is not None:
                _step(errors, _remove_ingress, self._ingress_on)
                self._ingress_on = None
            if self.ifb is not None:
                _step(errors, _remove_link, self.ifb)
                self.ifb = None
            if self._claimed:
                owners.release(self.config.tag)
                self._claimed = False
            if errors:
                raise ShaperFailed("teardown incomplete: " + "; ".join(errors))


def read_back_rules(plan: InsideRulePlan) -> list[str]:
    listed = nsutil.run(["iptables", "-w", "-S", plan.chain], check=False)
    if listed.returncode != 0:
        return [f"chain {plan.chain} missing: {listed.stderr.strip()}"]
    have = {line for line in listed.stdout.splitlines() if line.startswith("-A ")}
    want = set(plan.rule_specs())
    problems = [f"rule missing: {line}" for line in sorted(want - have)]
    problems += [f"unexpected rule: {line}" for line in sorted(have - want)]
    for jump in plan.jumps:
        if nsutil.run(["iptables", "-w", "-C", *jump], check=False).returncode != 0:
            problems.append(f"jump missing: -A {' '.join(jump)}")
    return problems


def _remove_ingress(ifname: str) -> None:
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if found:
            try:
                ipr.tc("del", "ingress", found[0], INGRESS_HANDLE)
            except NetlinkError as exc:
                if exc.code not in (2, 22):  # already gone
                    raise


def _remove_link(ifname: str) -> None:
    with IPRoute() as ipr:
        if ipr.link_lookup(ifname=ifname):
            ipr.link("del", ifname=ifname)


def _step(errors: list[str], fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported together
        errors.append(f"{getattr(fn, '__name__', fn)}: {exc}")
