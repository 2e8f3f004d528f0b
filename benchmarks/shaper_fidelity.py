"""How faithfully the link shaper reproduces what it is told (needs root; about a minute).

Sweeps, all on one test network (`netem.Topology`) whose edges reach the verifier only through
the shaper; RTTs are measured by ICMP echo from inside each edge (`netem.measure`):

1. one link at a configured RTT of 5, 10, 20, 50, 100, 200 ms;
2. jitter (uniform and normal; 8 identical links pooled, probes 50 ms apart so that FIFO release
   never holds one probe behind another), loss, and two rate caps;
3. 64 links at once, link i at RTT 5 + 3i ms, all served by one backend.

Prints a table, then as the LAST line ``key=value`` pairs: backend, rtt_err_p50_ms and
rtt_err_p99_ms (worst absolute error of the p50 and of the p99 over the single-link RTTs), the
same for the 64 links, jitter stdev error (%), loss error (binomial standard errors), rate error
(%), and whether each goal was met (p50 <= 0.5 ms, p99 <= 2 ms, jitter within 20%, loss within
3 standard errors, rate within 5%). ``late_max_us`` in the table is the daemon's worst release
delay beyond the due time: a CPU stall on the machine, not a modelling error, shows up there.

    sudo python benchmarks/shaper_fidelity.py [--probes 300] [--backend auto] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig  # noqa: E402
from netem import measure  # noqa: E402

N_MANY = 64
N_POOLED = 8
GOALS = {
    "rtt_err_p50_ms": 0.5,
    "rtt_err_p99_ms": 2.0,
    "jitter_stdev_err_pct": 20.0,
    "loss_err_sigma": 3.0,
    "rate_err_pct": 5.0,
}
RATE_CASES = ((10.0, 15.0), (50.0, 75.0))  # (cap, offered) Mbit/s, UDP for 3 s


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "rtt", "jitter", "loss" or "many"
    specs: tuple[LinkSpec, ...]  # one per shaped edge
    n_probes: int  # per link
    interval_s: float


def sweep_plan(n_probes: int) -> list[Case]:
    cases = [Case(f"rtt {rtt} ms", "rtt", (LinkSpec(rtt_ms=rtt),), n_probes, 0.01) for rtt in (5, 10, 20, 50, 100, 200)]
    for dist in ("uniform", "normal"):
        spec = LinkSpec(rtt_ms=50, jitter_ms=5, distribution=dist)
        cases.append(Case(f"jitter {dist}", "jitter", (spec,) * N_POOLED, n_probes // 3, 0.05))
    cases.append(Case("loss 5%/dir", "loss", (LinkSpec(rtt_ms=20, loss_pct=5),) * N_POOLED, 250, 0.01))
    cases.append(
        Case(f"{N_MANY} links", "many", tuple(LinkSpec(rtt_ms=5 + 3 * i) for i in range(N_MANY)), n_probes // 2, 0.02)
    )
    return cases


def run_case(topo: Topology, case: Case, backend: str):
    """Shape, probe every link at once, tear down. (backend, measured per link, pooled, daemon stats)."""
    links = topo.links(list(case.specs))
    with Shaper(ShaperConfig(backend=backend, verify_count=0)) as shaper:
        shaper.apply(links)
        targets = [measure.RttTarget(link.name, link.edge.netns, link.verifier.ip) for link in links]
        timeout_s = 1.0 + 3 * max(s.expected_rtt_ms() for s in case.specs) / 1000
        rtts = measure.probe_rtts(targets, case.n_probes, case.interval_s, timeout_s=timeout_s)
        warnings = shaper.warnings()
    for w in warnings:
        print(f"  warning: {w}")
    per_link = [_measurement(spec, r, case.n_probes) for spec, r in zip(case.specs, rtts)]
    pooled = _measurement(case.specs[0], [x for r in rtts for x in r], case.n_probes * len(rtts))
    late = [s.get("release_late", {}) for s in shaper.daemon_stats]
    return shaper.backend, per_link, pooled, late


def _measurement(spec: LinkSpec, rtts_ms: list[float], n_sent: int) -> measure.LinkMeasurement:
    s = measure.summarize(rtts_ms, n_sent)
    return measure.LinkMeasurement(
        configured_rtt_ms=spec.expected_rtt_ms(measure.PROBE_IP_BYTES),
        expected_rtt_stdev_ms=spec.expected_rtt_stdev_ms,
        expected_loss_pct=spec.expected_rtt_loss_pct,
        rtt_p50_ms=s.p50_ms,
        rtt_p99_ms=s.p99_ms,
        rtt_stdev_ms=s.stdev_ms,
        loss_pct=s.loss_pct,
        n_sent=s.n_sent,
        n_received=s.n_received,
    )


def run_rate(topo: Topology, cap_mbit: float, offered_mbit: float, backend: str) -> float:
    edge, verifier = topo.edges[0], topo.verifier
    with Shaper(ShaperConfig(backend=backend, verify_count=0)) as shaper:
        shaper.apply(topo.links([LinkSpec(rtt_ms=10, rate_mbit=cap_mbit)]))
        return measure.measure_rate_mbit(edge.netns, verifier.netns, verifier.ip, offered_mbit, duration_s=3.0)


HEADER = (
    f"{'case':<16} {'n':>6} {'conf_ms':>9} {'p50_ms':>9} {'p99_ms':>9} {'sd_ms':>7} {'sd_exp':>7} "
    f"{'loss%':>6} {'exp%':>6} {'err_p50':>8} {'err_p99':>8} {'late_max_us':>11}"
)


def row(name: str, m: measure.LinkMeasurement, late: list[dict] = ()) -> str:
    late_max = max((d.get("max_us", 0) for d in late), default=float("nan"))
    return (
        f"{name:<16} {m.n_sent:6d} {m.configured_rtt_ms:9.2f} {m.rtt_p50_ms:9.3f} {m.rtt_p99_ms:9.3f} "
        f"{m.rtt_stdev_ms:7.3f} {m.expected_rtt_stdev_ms:7.3f} {m.loss_pct:6.2f} {m.expected_loss_pct:6.2f} "
        f"{m.rtt_err_p50_ms:+8.3f} {m.rtt_p99_ms - m.configured_rtt_ms:+8.3f} {late_max:11.0f}"
    )


def main() -> int:
    args = _parse_args()
    cases = sweep_plan(args.probes)
    if args.dry_run:
        _print_plan(cases)
        return 0
    if os.geteuid() != 0:
        print("needs root (network namespaces, iptables, tc)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    print(HEADER)
    with Topology(TopologyConfig(n_edges=N_MANY)) as topo:
        err, backends, late_p99 = _measure_cases(topo, cases, args.backend)
        for cap, offered in RATE_CASES:
            got = run_rate(topo, cap, offered, args.backend)
            err["rate"].append(100 * abs(got - cap) / cap)
            print(f"rate {cap:g} Mbit/s: measured {got:.3f} Mbit/s (IP layer), error {err['rate'][-1]:.2f}%")
    figures = _figures(err, backends, late_p99, time.monotonic() - t0)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=300, help="echo probes per link for the RTT points")
    parser.add_argument("--backend", default="auto", choices=("auto", "kernel-netem", "nfqueue"))
    parser.add_argument("--dry-run", action="store_true", help="print the sweep and exit")
    args = parser.parse_args()
    if args.probes < 30:
        parser.error("--probes must be at least 30")
    return args


def _print_plan(cases) -> None:
    for c in cases:
        print(f"{c.name}: {len(c.specs)} link(s) x {c.n_probes} probes every {c.interval_s * 1000:g} ms; {c.specs[0]}")
    for cap, offered in RATE_CASES:
        print(f"rate {cap:g} Mbit/s: UDP offered at {offered:g} Mbit/s for 3 s")


def _measure_cases(topo, cases, backend_choice: str) -> tuple[dict, set, list]:
    """Runs every case, printing its rows; returns (errors by figure, backends used, late p99s)."""
    err = {k: [] for k in ("p50", "p99", "many_p50", "many_p99", "jitter", "loss", "rate")}
    backends, late_p99 = set(), []
    for case in cases:
        backend, per_link, pooled, late = run_case(topo, case, backend_choice)
        backends.add(backend)
        late_p99 += [d.get("p99_us", 0) for d in late]
        if case.kind == "rtt":
            err["p50"].append(abs(pooled.rtt_err_p50_ms))
            err["p99"].append(abs(pooled.rtt_p99_ms - pooled.configured_rtt_ms))
            print(row(case.name, pooled, late))
        elif case.kind == "jitter":
            err["jitter"].append(100 * abs(pooled.rtt_stdev_ms / pooled.expected_rtt_stdev_ms - 1))
            print(row(case.name, pooled, late))
        elif case.kind == "loss":
            err["loss"].append(pooled.loss_sigma)
            print(row(case.name, pooled, late))
        else:
            _many_links(case, per_link, pooled, late, err)
    return err, backends, late_p99


def _many_links(case, per_link, pooled, late, err: dict) -> None:
    for i, m in enumerate(per_link):
        err["many_p50"].append(abs(m.rtt_err_p50_ms))
        err["many_p99"].append(abs(m.rtt_p99_ms - m.configured_rtt_ms))
        if i % 9 == 0 or i == len(per_link) - 1:
            print(row(f"  link {i}", m, late))
    print(
        f"{case.name}: worst |err_p50| {max(err['many_p50']):.3f} ms, worst |err_p99| "
        f"{max(err['many_p99']):.3f} ms, {pooled.n_sent - pooled.n_received} of {pooled.n_sent} probes lost"
    )


def _figures(err: dict, backends: set, late_p99: list, elapsed_s: float) -> dict:
    figures = {
        "backend": "+".join(sorted(backends)),
        "rtt_err_p50_ms": max(err["p50"]),
        "rtt_err_p99_ms": max(err["p99"]),
        "many_links": N_MANY,
        "many_rtt_err_p50_ms": max(err["many_p50"]),
        "many_rtt_err_p99_ms": max(err["many_p99"]),
        "jitter_stdev_err_pct": max(err["jitter"]),
        "loss_err_sigma": max(err["loss"]),
        "rate_err_pct": max(err["rate"]),
        "release_late_p99_us": max(late_p99) if late_p99 else "na",
        "elapsed_s": elapsed_s,
    }
    for key, goal in GOALS.items():
        figures[key.rsplit("_", 1)[0] + "_ok"] = int(figures[key] <= goal)
    figures["many_rtt_err_ok"] = int(
        figures["many_rtt_err_p50_ms"] <= GOALS["rtt_err_p50_ms"]
        and figures["many_rtt_err_p99_ms"] <= GOALS["rtt_err_p99_ms"]
    )
    return figures


if __name__ == "__main__":
    sys.exit(main())
