"""The iptables rules that hand each link direction's packets to its NFQUEUE queue.

Where: the FORWARD path of the bridge (``-m physdev --physdev-in A --physdev-out B``; bridge
netfilter calls iptables for bridged IPv4), in a chain of ours (``DSDBED-TAG``) that FORWARD
jumps to first; where Docker owns the namespace, its ``DOCKER-USER`` chain jumps to it instead
(Docker evaluates DOCKER-USER first in FORWARD and rewrites FORWARD itself). Never on the
sender's OUTPUT hook: a held packet there counts against the sending socket and TCP collapses.

No ``--queue-bypass``: with it a dead daemon lets packets through unshaped, so an experiment would
silently measure a link without its delay. Without it a dead daemon drops every packet of the
link, which no experiment can mistake for a working link, and the shaper's watchdog says why
(see `netem.daemon`). One queue number per link direction.

We call ``iptables``, the same binary (and so the same nf_tables or legacy back end) Docker uses;
mixing back ends would put our chain where Docker's jump cannot reach it.

NOTE: IPv4 only (the test topology turns IPv6 off); IPv6 traffic between containers would pass
unshaped.
NOTE: where conntrack runs (Docker's host namespace; not our bridge namespaces), a new flow's
packets held here before its first packet is confirmed clash at confirmation and are dropped
(``insert_failed``). TCP never has two such packets in flight; ICMP does (the RTT probe warms
each flow up first), and so would a burst opening a UDP flow on a kernel without clash resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

from netem import nsutil

IPTABLES = "iptables"
DOCKER_USER = "DOCKER-USER"
FORWARD = "FORWARD"


@dataclass(frozen=True)
class QueueRule:
    physdev_in: str
    physdev_out: str
    queue_num: int


@dataclass(frozen=True)
class RulePlan:
    netns: str | None  # the bridge's namespace
    chain: str  # DSDBED-TAG
    parent_chain: str  # FORWARD or DOCKER-USER
    rules: tuple[QueueRule, ...]

    def rule_specs(self) -> list[str]:
        """The chain's rules exactly as ``iptables -S CHAIN`` prints them."""
        return [
            f"-A {self.chain} -m physdev --physdev-in {r.physdev_in} --physdev-out {r.physdev_out} "
            f"-j NFQUEUE --queue-num {r.queue_num}"
            for r in self.rules
        ]

    def restore_text(self) -> str:
        # ":CHAIN" with --noflush creates the chain or empties it: applying twice is harmless.
        return "\n".join(["*filter", f":{self.chain} - [0:0]", *self.rule_specs(), "COMMIT", ""])

    @property
    def jump_spec(self) -> list[str]:
        return [self.parent_chain, "-j", self.chain]


def bridge_netfilter_enabled(netns: str | None) -> bool:
    """Whether bridged IPv4 goes through iptables in `netns` (br_netfilter; Docker turns it on).

    Without it the physdev rules never match and every link would silently stay unshaped.
    """

    def read() -> str:
        with open("/proc/sys/net/bridge/bridge-nf-call-iptables") as f:
            return f.read().strip()

    try:
        return nsutil.call_in_netns(netns, read) == "1"
    except FileNotFoundError:  # br_netfilter not loaded
        return False


def parent_chain_for(netns: str | None) -> str:
    """DOCKER-USER where Docker set up this namespace's firewall, FORWARD elsewhere."""
    probe = nsutil.run([IPTABLES, "-w", "-S", DOCKER_USER], netns=netns, check=False)
    return DOCKER_USER if probe.returncode == 0 else FORWARD


def plan_rules(netns: str | None, chain: str, parent_chain: str, rules: list[QueueRule]) -> RulePlan:
    return RulePlan(netns=netns, chain=chain, parent_chain=parent_chain, rules=tuple(rules))


def apply_rules(plan: RulePlan) -> None:
    nsutil.run([IPTABLES + "-restore", "-w", "--noflush"], netns=plan.netns, input_text=plan.restore_text())
    if not _jump_present(plan):
        nsutil.run([IPTABLES, "-w", "-I", plan.parent_chain, "1", "-j", plan.chain], netns=plan.netns)


def read_back(plan: RulePlan) -> list[str]:
    """Differences between the plan and the kernel, as sentences; empty when they agree."""
    problems = []
    listed = nsutil.run([IPTABLES, "-w", "-S", plan.chain], netns=plan.netns, check=False)
    if listed.returncode != 0:
        return [f"chain {plan.chain} missing: {listed.stderr.strip()}"]
    have = [line for line in listed.stdout.splitlines() if line.startswith("-A ")]
    want = plan.rule_specs()
    for line in sorted(set(want) - set(have)):
        problems.append(f"rule missing: {line}")
    for line in sorted(set(have) - set(want)):
        problems.append(f"unexpected rule: {line}")
    if not _jump_present(plan):
        problems.append(f"jump missing: -A {' '.join(plan.jump_spec)}")
    return problems


def queue_counters(plan: RulePlan) -> dict[int, tuple[int, int]]:
    """Packets and IP bytes each queue's rule has handed over since it was made: what crossed
    each link direction (offered: the configured loss comes after). {queue_num: (pkts, bytes)}."""
    listed = nsutil.run([IPTABLES, "-w", "-S", plan.chain, "-v"], netns=plan.netns, check=False)
    return parse_counters(listed.stdout) if listed.returncode == 0 else {}


def parse_counters(text: str) -> dict[int, tuple[int, int]]:
    """From ``iptables -S CHAIN -v``: "-A CHAIN ... -c PKTS BYTES -j NFQUEUE --queue-num N"."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if line.startswith("-A ") and "-c" in words and "--queue-num" in words:
            c = words.index("-c")
            out[int(words[words.index("--queue-num") + 1])] = (int(words[c + 1]), int(words[c + 2]))
    return out


def remove_rules(plan: RulePlan) -> None:
    """Jump first (traffic stops entering the chain), then the chain; absent pieces are fine."""
    remove_chain(plan.netns, plan.chain)


def remove_chain(netns: str | None, chain: str) -> list[str]:
    """Delete every jump to `chain` in the filter table, then the chain. Returns what was removed."""
    removed = []
    listed = nsutil.run([IPTABLES, "-w", "-S"], netns=netns, check=False)
    for line in listed.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["-A"] and parts[-2:] == ["-j", chain]:
            nsutil.run([IPTABLES, "-w", "-D", *parts[1:]], netns=netns, check=False)
            removed.append(f"iptables rule {line!r}" + (f" in {netns}" if netns else ""))
    if nsutil.run([IPTABLES, "-w", "-S", chain], netns=netns, check=False).returncode == 0:
        nsutil.run([IPTABLES, "-w", "-F", chain], netns=netns)
        nsutil.run([IPTABLES, "-w", "-X", chain], netns=netns)
        removed.append(f"iptables chain {chain}" + (f" in {netns}" if netns else ""))
    return removed


def list_chains(netns: str | None, prefix: str) -> list[str]:
    listed = nsutil.run([IPTABLES, "-w", "-S"], netns=netns, check=False)
    return [
        line.split()[1]
        for line in listed.stdout.splitlines()
        if line.startswith("-N ") and line.split()[1].startswith(prefix)
    ]


def _jump_present(plan: RulePlan) -> bool:
    check = nsutil.run([IPTABLES, "-w", "-C", *plan.jump_spec], netns=plan.netns, check=False)
    return check.returncode == 0
