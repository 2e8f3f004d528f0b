"""CPU isolation and contention, made visible.

Pinning: where the machine has at least MIN_CPUS_TO_PIN usable CPUs, the orchestrator, the
shaping daemon, the verifier and the edges each get a CPU set of their own (disjoint), so that a
draft step on an edge does not wait for the verifier's pass on the same core. ``plan_cpus`` is
the plan as data; ``pin`` applies it to a running process (every thread of it: threads started
before pinning would otherwise keep the old mask; later ones inherit it) and reads it back.
With fewer CPUs, ``cpu_pinning = "auto"`` pins nothing and the plan says why; "on" pins anyway
(the verifier on a CPU of its own, everything else sharing the rest: not disjoint, recorded as
such); "off" never pins.

Contention: ``CpuSample`` reads /proc/stat and the load average; two samples around a point give
the share of the machine that was busy, the share stolen by the hypervisor, and the load,
recorded in the point's done.json and points.csv. A point is flagged as contended when the
1-minute load exceeds the CPU count (more runnable threads than cores, ours included) or more
than STEAL_LIMIT_PCT of the CPU time was stolen.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

MIN_CPUS_TO_PIN = 4
PINNING_MODES = ("auto", "on", "off")
STEAL_LIMIT_PCT = 2.0


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def plan_cpus(cpus: list[int], n_edges: int, mode: str = "auto") -> dict:
    """{"pinned": bool, "disjoint": bool, "reason": str, "sets": {role: [cpu, ...]}} with roles
    orchestrator, shaper, verifier and edge0..edgeN-1 (edges share one set)."""
    if mode not in PINNING_MODES:
        raise ValueError(f"cpu_pinning must be one of {PINNING_MODES}, got {mode!r}")
    if n_edges < 1:
        raise ValueError(f"n_edges must be >= 1, got {n_edges!r}")
    cpus = sorted(cpus)
    n = len(cpus)
    if mode == "off":
        return {"pinned": False, "disjoint": False, "reason": "cpu_pinning = off", "sets": {}, "cpus": cpus}
    if n >= MIN_CPUS_TO_PIN:
        n_verifier = max(1, (n - 2) // 2)
        sets = {"orchestrator": cpus[:1], "shaper": cpus[1:2], "verifier": cpus[2 : 2 + n_verifier]}
        edges = cpus[2 + n_verifier :]
        return {
            "pinned": True,
            "disjoint": True,
            "reason": f"{n} CPUs: disjoint sets",
            "sets": {**sets, **{f"edge{i}": edges for i in range(n_edges)}},
            "cpus": cpus,
        }
    if mode == "auto" or n < 2:
        return {
            "pinned": False,
            "disjoint": False,
            "cpus": cpus,
            "sets": {},
            "reason": f"only {n} CPU(s) (disjoint sets for verifier, edges, shaper and orchestrator need "
            f"{MIN_CPUS_TO_PIN}): not pinned; every process shares every CPU",
        }
    rest = cpus[:-1]
    return {
        "pinned": True,
        "disjoint": False,
        "cpus": cpus,
        "reason": f"only {n} CPUs, pinned on request: the verifier alone on CPU {cpus[-1]}, the edges, the "
        f"shaper and the orchestrator share {rest}",
        "sets": {
            "orchestrator": rest,
            "shaper": rest,
            "verifier": cpus[-1:],
            **{f"edge{i}": rest for i in range(n_edges)},
        },
    }


def pin(pid: int, cpus: list[int]) -> list[int]:
    """Set the CPU mask of every thread of pid; returns the mask read back from the main thread."""
    tasks = Path(f"/proc/{pid}/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.exists() else [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return sorted(os.sched_getaffinity(pid))


def pin_testbed(testbed, plan: dict) -> dict:
    """Apply the plan to a testbed's running processes (services and shaping daemons; compose:
    its containers' cpusets); with an unpinned plan, give them every usable CPU back. Returns {process name: mask read back}."""
    applied = {}
    everything = plan.get("cpus") or usable_cpus()
    for process in testbed.local_processes():
        if process.proc.poll() is None:
            role = "verifier" if process.name == "verifier" else process.name
            cpus = plan["sets"].get(role, everything) if plan["pinned"] else everything
            applied[process.name] = pin(process.proc.pid, cpus)
    if hasattr(testbed, "pin_containers"):  # compose: a cpuset per container
        applied.update(testbed.pin_containers(plan["sets"] if plan["pinned"] else {}, everything))
    shaper = testbed.local_shaper()
    for i, daemon in enumerate(shaper.daemons if shaper is not None else []):
        if daemon.child.alive():
            cpus = plan["sets"].get("shaper", everything) if plan["pinned"] else everything
            applied[f"shaper{i}"] = pin(daemon.pid, cpus)
    return applied


def pin_self(plan: dict) -> list[int]:
    """The orchestrator's own thread (the one that runs the sweep)."""
    cpus = plan["sets"].get("orchestrator") if plan["pinned"] else (plan.get("cpus") or usable_cpus())
    os.sched_setaffinity(0, cpus)
    return sorted(os.sched_getaffinity(0))


# --- contention ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuSample:
    at_s: float
    busy: int  # jiffies spent not idle (user, nice, system, irq, softirq, steal)
    total: int
    steal: int
    load_1m: float

    @classmethod
    def now(cls) -> CpuSample:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        total = sum(fields)
        return cls(time.time(), total - idle - iowait, total, steal, os.getloadavg()[0])


def conditions(before: CpuSample, after: CpuSample, n_cpus: int | None = None) -> dict:
    """What the machine did while a point ran (whole machine, every process, ours included)."""
    n_cpus = n_cpus or os.cpu_count() or 1
    total = max(after.total - before.total, 1)
    steal_pct = 100 * (after.steal - before.steal) / total
    load_1m = max(before.load_1m, after.load_1m)
    return {
        "cpu_busy_pct": 100 * (after.busy - before.busy) / total,
        "cpu_steal_pct": steal_pct,
        "load_avg_1m": load_1m,
        "cpus": n_cpus,
        "contended": bool(load_1m > n_cpus or steal_pct > STEAL_LIMIT_PCT),
    }
