"""The façade: shape a set of links, check the kernel agrees, measure them, remove it all.

    with Shaper(ShaperConfig()) as shaper:
        records = shaper.apply(links)   # plan -> apply -> read back -> measure
        ...                             # run the experiment; shaper.check() raises if shaping died
    # every rule, qdisc and daemon is gone here, also after an error or Ctrl-C

The backend is chosen once per `apply` (`netem.probe`): the kernel's netem where it exists,
else the NFQUEUE daemon. Each record says which one shaped its link.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable

from netem import kernel, names, owners, rules
from netem.daemon import DaemonDied, NfqueueDaemon, QueueAssignment
from netem.endpoints import Link
from netem.measure import LinkMeasurement, measure_links
from netem.model import queue_limit_pkts
from netem.plan import TcRequest, plan_links
from netem.probe import BACKENDS, KERNEL_NETEM, NFQUEUE, choose_backend
from netem.spec import LinkSpec

log = logging.getLogger(__name__)

MAX_QUEUE_NUM = 65535


class ShaperFailed(RuntimeError):
    """Shaping could not be set up as planned, or stopped working."""


@dataclass(frozen=True)
class ShaperConfig:
    backend: str = "auto"  # "auto", "kernel-netem" or "nfqueue"
    tag: str = field(default_factory=names.new_tag)
    max_pps: int = 20_000  # peak packets/s per link direction: sizes every queue for pps x delay
    backlog_pkts: int = 1000  # packets that may wait for a rate-capped wire (a txqueuelen)
    queue_base: int = 1000  # NFQUEUE numbers: link i uses base+2i (up) and base+2i+1 (down)
    rt_priority: int = 10  # SCHED_FIFO priority of the NFQUEUE daemon; 0 = none
    seed: int = 0  # jitter and loss draws of the NFQUEUE daemon
    verify_count: int = 100  # echo probes per link after applying; 0 = do not measure
    verify_interval_s: float = 0.02
    verify_tolerance_ms: float = 2.0  # apply() fails when a link's median RTT is further off than this
    ready_timeout_s: float = 15.0
    watchdog_interval_s: float = 0.5

    def __post_init__(self):
        if self.backend not in ("auto", *BACKENDS):
            raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {self.backend!r}")
        names.check_tag(self.tag)
        for name, lo, hi in (
            ("max_pps", 1, 10_000_000),
            ("backlog_pkts", 1, 1_000_000),
            ("queue_base", 0, MAX_QUEUE_NUM),
            ("rt_priority", 0, 99),
            ("seed", 0, 2**63),
            ("verify_count", 0, 100_000),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        for name in ("verify_interval_s", "verify_tolerance_ms", "ready_timeout_s", "watchdog_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be a number of seconds in (0, 3600], got {value!r}")


@dataclass
class LinkRecord:
    """What was done to one link, for the trace's sidecar: flat with `as_row()`."""

    link: str
    edge: str
    verifier: str
    edge_ip: str
    verifier_ip: str
    spec: LinkSpec
    backend: str  # "kernel-netem" or "nfqueue"
    backend_reason: str
    queues: tuple[int, int] | None = None  # nfqueue: (up, down)
    interfaces: tuple[str, ...] = ()  # kernel-netem: where the qdiscs are
    measured: LinkMeasurement | None = None

    def as_row(self) -> dict:
        row = {
            "link": self.link,
            "edge": self.edge,
            "verifier": self.verifier,
            "edge_ip": self.edge_ip,
            "verifier_ip": self.verifier_ip,
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "queue_up": self.queues[0] if self.queues else None,
            "queue_down": self.queues[1] if self.queues else None,
            "interfaces": " ".join(self.interfaces),
        }
        row.update({f"spec_{k}": v for k, v in self.spec.as_dict().items()})
        if self.measured is not None:
            row.update({f"measured_{k}": v for k, v in dataclasses.asdict(self.measured).items()})
            row["measured_rtt_err_p50_ms"] = self.measured.rtt_err_p50_ms
        return row


class Shaper:
    """Context manager over one `apply`; `close` (or leaving the `with`) undoes everything."""

    def __init__(self, config: ShaperConfig, on_failure: Callable[[list[str]], None] | None = None):
        self.config = config
        self.on_failure = on_failure  # called from the watchdog thread when shaping dies
        self.records: list[LinkRecord] = []
        self.links: list[Link] = []
        self.backend: str | None = None
        self.tc_plan: list[TcRequest] = []
        self.rule_plans: list[rules.RulePlan] = []
        self.daemons: list[NfqueueDaemon] = []
        self.daemon_stats: list[dict] = []
        self._failures: list[str] = []
        self._stop_watchdog = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._schedule_threads: list[threading.Thread] = []
        self._claimed = False

    def __enter__(self) -> Shaper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- apply ------------------------------------------------------------------------------

    def apply(self, links: list[Link]) -> list[LinkRecord]:
        if self.records or self.daemons or self.tc_plan:
            raise RuntimeError("apply() was called already: use one Shaper per set of links")
        _check_links(links)
        self.links = list(links)
        owners.claim(self.config.tag)  # its chains and daemons are a live run's from here
        self._claimed = True
        unusable = _kernel_unusable_reason(links)
        self.backend, reason = choose_backend(self.config.backend, unusable)
        log.info("shaping %d links with %s (%s)", len(links), self.backend, reason)
        try:
            if self.backend == KERNEL_NETEM:
                self.records = self._apply_kernel(links, reason)
            else:
                self.records = self._apply_nfqueue(links, reason)
            if self.config.verify_count:
                self.verify()
                problems = [
                    f"{r.link}: {p}" for r in self.records for p in r.measured.problems(self.config.verify_tolerance_ms)
                ]
                if problems:
                    raise ShaperFailed("links do not behave as configured: " + "; ".join(problems))
        except BaseException:
            self.close()
            raise
        return self.records

    def _apply_kernel(self, links: list[Link], reason: str) -> list[LinkRecord]:
        self.tc_plan = plan_links(links, self.config.max_pps)
        for request in self.tc_plan:
            log.debug("plan: %s", request.describe())
        kernel.apply_plan(self.tc_plan)
        problems = kernel.read_back(self.tc_plan)
        if problems:
            raise ShaperFailed("kernel state differs from the plan: " + "; ".join(problems))
        return [
            _record(
                link,
                KERNEL_NETEM,
                reason,
                interfaces=(
                    f"{link.edge.netns}:{link.edge.ifname}",
                    f"{link.edge.bridge_netns}:{link.edge.bridge_port}",
                ),
            )
            for link in links
        ]

    def _apply_nfqueue(self, links: list[Link], reason: str) -> list[LinkRecord]:
        cfg = self.config
        if cfg.queue_base + 2 * len(links) - 1 > MAX_QUEUE_NUM:
            raise ValueError(f"queue_base {cfg.queue_base} leaves no room for {len(links)} links x 2 queues")
        records, by_bridge = [], {}
        for i, link in enumerate(links):
            q_up, q_down = cfg.queue_base + 2 * i, cfg.queue_base + 2 * i + 1
            by_bridge.setdefault(link.edge.bridge_netns, []).append((link, q_up, q_down))
            records.append(_record(link, NFQUEUE, reason, queues=(q_up, q_down)))
        for bridge_netns, group in by_bridge.items():
            if not rules.bridge_netfilter_enabled(bridge_netns):
                raise ShaperFailed(
                    f"bridge netfilter is off in {bridge_netns or 'this namespace'}: set "
                    "net.bridge.bridge-nf-call-iptables=1 (modprobe br_netfilter), else no rule matches"
                )
            assignments, queue_rules = [], []
            for link, q_up, q_down in group:
                for queue_num, label, direction, port_in, port_out in (
                    (q_up, f"{link.name}/up", link.spec.up, link.edge.bridge_port, link.verifier.bridge_port),
                    (q_down, f"{link.name}/down", link.spec.down, link.verifier.bridge_port, link.edge.bridge_port),
                ):
                    assignments.append(
                        QueueAssignment(
                            queue_num=queue_num,
                            label=label,
                            direction=direction,
                            limit_pkts=queue_limit_pkts(direction, cfg.max_pps, cfg.backlog_pkts),
                            backlog_pkts=cfg.backlog_pkts,
                            seed=cfg.seed * 1_000_003 + queue_num,
                        )
                    )
                    queue_rules.append(rules.QueueRule(port_in, port_out, queue_num))
            # The daemon first: a rule pointing at a queue nobody serves drops packets.
            self.daemons.append(
                NfqueueDaemon.start(
                    bridge_netns,
                    assignments,
                    names.process_tag(cfg.tag),
                    rt_priority=cfg.rt_priority,
                    ready_timeout_s=cfg.ready_timeout_s,
                )
            )
            plan = rules.plan_rules(
                bridge_netns, names.chain_name(cfg.tag), rules.parent_chain_for(bridge_netns), queue_rules
            )
            self.rule_plans.append(plan)
            rules.apply_rules(plan)
            problems = rules.read_back(plan)
            if problems:
                raise ShaperFailed("iptables state differs from the plan: " + "; ".join(problems))
        self._start_watchdog()
        return records

    # ---- change while running (link schedules) --------------------------------------------------

    def schedule(self, changes: list[tuple[float, list[LinkSpec | None]]], keep_order: bool = False) -> None:
        """Change links while they run, without restarting anything: each (at CLOCK_MONOTONIC
        seconds, one LinkSpec per link or None = unchanged). NFQUEUE: the daemon switches each queue
        at its time (held packets kept as they were). Kernel: a thread replaces the netem qdiscs in
        place at each time (`kernel.apply_plan` with "replace" changes a qdisc, keeping its queue).
        After a cut in delay new packets overtake held ones (a path change), unless keep_order
        (a queue draining; NFQUEUE only: netem's tfifo orders by release time)."""
        if not self.records:
            raise RuntimeError("schedule() needs apply() first")
        if keep_order and self.backend != NFQUEUE:
            raise ShaperFailed(
                f'keep_order (schedule_order = "queue") needs the nfqueue backend; this '
                f"run shapes with {self.backend}, whose netem orders packets by release time"
            )
        for _, specs in changes:
            if len(specs) != len(self.links):
                raise ValueError(f"one LinkSpec (or None) per link ({len(self.links)}), got {len(specs)}")
        if self.backend == NFQUEUE:
            for daemon in self.daemons:
                by_queue = {q.queue_num for q in daemon.queues}
                timed = [
                    (at_s, queue_num, direction)
                    for at_s, specs in changes
                    for record, spec in zip(self.records, specs)
                    if spec is not None
                    for queue_num, direction in zip(record.queues, (spec.up, spec.down))
                    if queue_num in by_queue
                ]
                if timed:
                    daemon.schedule(timed, keep_order)
            return
        unusable = _kernel_unusable_reason(
            [
                dataclasses.replace(link, spec=spec)
                for _, specs in changes
                for link, spec in zip(self.links, specs)
                if spec is not None
            ]
        )
        if unusable:
            raise ShaperFailed(f"the kernel backend cannot change to this link: {unusable}")
        plans = [
            (
                at_s,
                plan_links(
                    [dataclasses.replace(link, spec=spec) for link, spec in zip(self.links, specs) if spec is not None],
                    self.config.max_pps,
                ),
            )
            for at_s, specs in changes
        ]
        thread = threading.Thread(target=self._run_kernel_schedule, args=(plans,), name="dsdbed-schedule", daemon=True)
        self._schedule_threads.append(thread)
        thread.start()

    def _run_kernel_schedule(self, plans: list[tuple[float, list[TcRequest]]]) -> None:
        for at_s, plan in plans:
            if self._stop_watchdog.wait(max(0.0, at_s - time.monotonic())):
                return  # closing
            try:
                kernel.apply_plan(plan)
            except Exception as exc:  # noqa: BLE001 - reported like a dead daemon
                self._failures.append(f"link schedule: {exc}")
                return

    def wire_counters(self) -> list[dict] | None:
        """Per link, the packets and IP bytes that entered each direction so far (NFQUEUE: its
        rules' counters). None on the kernel backend.
        NOTE: the kernel path could read its qdiscs' byte counters; not done yet."""
        if self.backend != NFQUEUE:
            return None
        counts: dict[int, tuple[int, int]] = {}
        for plan in self.rule_plans:
            counts.update(rules.queue_counters(plan))
        out = []
        for record in self.records:
            (up_pkts, up_bytes), (down_pkts, down_bytes) = (counts.get(q, (0, 0)) for q in record.queues)
            out.append(
                {
                    "wire_pkts_up": up_pkts,
                    "wire_bytes_up": up_bytes,
                    "wire_pkts_down": down_pkts,
                    "wire_bytes_down": down_bytes,
                }
            )
        return out

    # ---- verify and watch -------------------------------------------------------------------

    def verify(self, count: int | None = None, interval_s: float | None = None) -> list[LinkRecord]:
        """Measure every link's RTT from its edge now; fills each record's `measured`."""
        self.check()
        measured = measure_links(
            self.links, count or self.config.verify_count, interval_s or self.config.verify_interval_s
        )
        for record, m in zip(self.records, measured):
            record.measured = m
        self.check()
        return self.records

    def failures(self) -> list[str]:
        """Why shaping is broken right now (a dead daemon, a queue without listener); [] if fine."""
        found = list(self._failures)
        for daemon in self.daemons:
            found += [f for f in daemon.failures() if f not in found]
        return found

    def warnings(self) -> list[str]:
        """Packets the kernel dropped for lack of queue room (raise max_pps if any)."""
        return [w for daemon in self.daemons for w in daemon.drop_warnings()]

    def check(self) -> None:
        failures = self.failures()
        if failures:
            raise DaemonDied("; ".join(failures))

    def _start_watchdog(self) -> None:
        self._watchdog = threading.Thread(target=self._watch, name="dsdbed-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._stop_watchdog.wait(self.config.watchdog_interval_s):
            failures = [f for d in self.daemons for f in d.failures()]
            if failures and not self._failures:
                self._failures = failures
                log.error("link shaping failed: %s", "; ".join(failures))
                if self.on_failure is not None:
                    self.on_failure(failures)

    # ---- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Remove everything, in the order that never blackholes a link: rules, daemon, qdiscs."""
        self._stop_watchdog.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
            self._watchdog = None
        for thread in self._schedule_threads:
            thread.join(timeout=5)
        self._schedule_threads = []
        errors = []
        for plan in self.rule_plans:
            _collect(errors, rules.remove_rules, plan)
        self.rule_plans = []
        for daemon in self.daemons:
            stats = _collect(errors, daemon.stop)
            if stats:
                self.daemon_stats.append(stats)
        self.daemons = []
        if self.tc_plan:
            _collect(errors, kernel.remove_plan, self.tc_plan)
            self.tc_plan = []
        if self._claimed:  # what teardown missed is a dead run's from here
            owners.release(self.config.tag)
            self._claimed = False
        if errors:
            raise ShaperFailed("teardown incomplete (run cleanup_leftovers): " + "; ".join(errors))


def _collect(errors: list[str], fn, *args):
    """Run one teardown step; keep going after a failure so the other steps still happen."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported together at the end
        errors.append(f"{getattr(fn, '__name__', fn)}: {exc}")
        return None


def _record(link: Link, backend: str, reason: str, **kwargs) -> LinkRecord:
    return LinkRecord(
        link=link.name,
        edge=link.edge.name,
        verifier=link.verifier.name,
        edge_ip=link.edge.ip,
        verifier_ip=link.verifier.ip,
        spec=link.spec,
        backend=backend,
        backend_reason=reason,
        **kwargs,
    )


def _check_links(links: list[Link]) -> None:
    if not links:
        raise ValueError("links must not be empty")
    seen_names, seen_ports = set(), set()
    for link in links:
        if link.name in seen_names:
            raise ValueError(f"link names must be unique, {link.name!r} repeats")
        port = (link.edge.bridge_netns, link.edge.bridge_port)
        if port in seen_ports:
            raise ValueError(f"link {link.name!r}: edge {link.edge.name} already has a link (one per edge)")
        seen_names.add(link.name)
        seen_ports.add(port)


def _kernel_unusable_reason(links: list[Link]) -> str | None:
    for link in links:
        if link.spec.distribution != "uniform":
            return f"link {link.name} uses distribution {link.spec.distribution!r}, which pyroute2 cannot give netem"
    return None
