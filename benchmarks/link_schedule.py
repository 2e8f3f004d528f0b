"""Links that change while they run, and jitter/loss fidelity (needs root; about a minute).

On one test network (`netem.Topology`), with the best shaper backend here (`--backend auto`):

1. steps: one link alternating between 20 and 60 ms RTT every 0.4 s (`netem.schedule` steps,
   `Shaper.schedule`), probed every 1 ms; a step's settle time runs from its scheduled time to
   the send time of the first probe that saw the new RTT (`schedule.effect_times`);
2. trace replay: a random-walk RTT trace (10..80 ms, a new value every 20 ms, 4 s), probed every
   2 ms; each probe's RTT against what the trace implies for it (`schedule.expected_rtt_at_ms`:
   the up delay in force when it left, the down delay when its reply started back);
3. jitter: a normal and a pareto link (20 ms RTT, jitter 2 ms per direction), and loss: a link
   losing 2.53% each way (5% of echo round trips), `--probes` probes each, 10 ms apart (FIFO
   release never holds a probe back at that spacing), all three at once.

Prints a table, then as the LAST line:
``backend= step_settle_ms_p50= step_settle_ms_max= trace_rtt_err_p50_ms= trace_rtt_err_p99_ms=
jitter_stdev_err_pct= loss_err_pct_points= goals_met=`` (goals: settle <= 5 ms, trace error
<= 0.5 ms, stdev within 10% for both distributions (the worse is printed), loss within 1 point).

    sudo python benchmarks/link_schedule.py [--probes 2000] [--backend auto] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig  # noqa: E402
from netem import measure, schedule  # noqa: E402

GOALS = {
    "step_settle_ms_p50": 5.0,
    "trace_rtt_err_p50_ms": 0.5,
    "jitter_stdev_err_pct": 10.0,
    "loss_err_pct_points": 1.0,
}
LOSS_PER_DIRECTION_PCT = 100 * (1 - math.sqrt(0.95))  # 5% of round trips


def timed_probes(topo: Topology, n_edges: int, interval_s: float, count: int) -> list[list[tuple[float, float]]]:
    targets = [measure.RttTarget(e.name, e.netns, topo.verifier.ip) for e in topo.edges[:n_edges]]
    timeline = [[] for _ in targets]
    measure.probe_rtts(targets, count=count, interval_s=interval_s, timeout_s=1.0, timeline=timeline)
    return timeline


def run_steps(topo: Topology, backend: str, n_steps: int = 12, period_s: float = 0.4) -> list[float]:
    base = LinkSpec(rtt_ms=20)
    steps = schedule.LinkSchedule.from_steps(
        [{"at_s": 0.3 + i * period_s, "rtt_ms": 60 if i % 2 == 0 else 20} for i in range(n_steps)]
    )
    with Shaper(ShaperConfig(backend=backend, verify_count=20)) as shaper:
        shaper.apply(topo.links([base]))
        t0 = time.monotonic() + 0.2  # the probes start ~10 ms after they are called
        shaper.schedule([(t0 + at_s, [spec]) for at_s, spec in steps.specs(base)])
        samples = timed_probes(topo, 1, 0.001, int((0.2 + 0.3 + n_steps * period_s) / 0.001))[0]
    changes, old = [], base.expected_rtt_ms(measure.PROBE_IP_BYTES)
    for at_s, spec in steps.specs(base):
        new = spec.expected_rtt_ms(measure.PROBE_IP_BYTES)
        changes.append((t0 + at_s, old, new))
        old = new
    effect = schedule.effect_times(changes, samples, tolerance_ms=1.0)
    return [1000 * (e - at) for e, (at, _, _) in zip(effect, changes)]


def random_walk_trace(path: Path, seed: int, duration_s: float = 4.0, step_s: float = 0.02) -> None:
    rng, rtt, rows = random.Random(seed), 40.0, ["t_s,rtt_ms"]
    for i in range(int(duration_s / step_s)):
        rtt = min(80.0, max(10.0, rtt + rng.gauss(0, 3)))
        rows.append(f"{i * step_s:.3f},{rtt:.3f}")
    path.write_text("\n".join(rows) + "\n")


def run_trace(topo: Topology, backend: str, seed: int) -> list[float]:
    path = Path(f"/tmp/dsdbed-trace-{os.getpid()}.csv")
    random_walk_trace(path, seed)
    trace = schedule.LinkSchedule.from_trace_csv(path)
    path.unlink()
    base = LinkSpec(rtt_ms=40)
    with Shaper(ShaperConfig(backend=backend, verify_count=20)) as shaper:
        shaper.apply(topo.links([base]))
        t0 = time.monotonic() + 0.2
        shaper.schedule([(t0 + at_s, [spec]) for at_s, spec in trace.specs(base)])
        samples = timed_probes(topo, 1, 0.002, int((0.2 + 4.0) / 0.002))[0]
    errors = []
    for sent_s, rtt_ms in samples:
        if 0 <= sent_s - t0 <= 3.9:
            errors.append(abs(rtt_ms - schedule.expected_rtt_at_ms(trace, base, sent_s - t0, measure.PROBE_IP_BYTES)))
    return errors


def run_fidelity(topo: Topology, backend: str, n_probes: int) -> dict:
    specs = [
        LinkSpec(rtt_ms=20, jitter_ms=2, distribution="normal"),
        LinkSpec(rtt_ms=20, jitter_ms=2, distribution="pareto"),
        LinkSpec(rtt_ms=20, loss_pct=LOSS_PER_DIRECTION_PCT),
    ]
    with Shaper(ShaperConfig(backend=backend, verify_count=20)) as shaper:
        shaper.apply(topo.links(specs))
        targets = [measure.RttTarget(e.name, e.netns, topo.verifier.ip) for e in topo.edges[:3]]
        rtts = measure.probe_rtts(targets, count=n_probes, interval_s=0.01, timeout_s=1.0)
    out = {}
    for name, spec, values in zip(("normal", "pareto"), specs, rtts):
        stdev = statistics.stdev(values)
        out[f"stdev_{name}_ms"] = (stdev, spec.expected_rtt_stdev_ms)
    loss_pct = 100.0 * (n_probes - len(rtts[2])) / n_probes
    out["loss_pct"] = (loss_pct, specs[2].expected_rtt_loss_pct)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--backend", default="auto", choices=("auto", "kernel-netem", "nfqueue"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, iptables)")
    with Topology(TopologyConfig(n_edges=3)) as topo:
        settle_ms = run_steps(topo, args.backend)
        trace_err_ms = run_trace(topo, args.backend, args.seed)
        fidelity = run_fidelity(topo, args.backend, args.probes)
        with Shaper(ShaperConfig(backend=args.backend, verify_count=0)) as shaper:
            shaper.apply(topo.links([LinkSpec(rtt_ms=1)]))
            backend = shaper.backend
    seen = [s for s in settle_ms if not math.isnan(s)]
    print(f"{'case':<28}{'measured':>12}{'configured':>12}")
    print(f"{'steps seen':<28}{len(seen):>12}{len(settle_ms):>12}")
    print(f"{'settle ms p50 / max':<28}{statistics.median(seen):>12.3f}{max(seen):>12.3f}")
    print(
        f"{'trace |err| ms p50 / p99':<28}{measure.percentile(trace_err_ms, 50, 'linear'):>12.3f}"
        f"{measure.percentile(trace_err_ms, 99, 'linear'):>12.3f}   ({len(trace_err_ms)} probes)"
    )
    for key, (got, want) in fidelity.items():
        print(f"{key:<28}{got:>12.3f}{want:>12.3f}")
    stdev_err_pct = max(abs(got / want - 1) * 100 for k, (got, want) in fidelity.items() if k.startswith("stdev"))
    loss_got, loss_want = fidelity["loss_pct"]
    figures = {
        "step_settle_ms_p50": statistics.median(seen) if seen else math.nan,
        "step_settle_ms_max": max(seen) if seen else math.nan,
        "trace_rtt_err_p50_ms": measure.percentile(trace_err_ms, 50, "linear"),
        "trace_rtt_err_p99_ms": measure.percentile(trace_err_ms, 99, "linear"),
        "jitter_stdev_err_pct": stdev_err_pct,
        "loss_err_pct_points": abs(loss_got - loss_want),
    }
    met = all(figures[k] <= goal for k, goal in GOALS.items()) and len(seen) == len(settle_ms)
    print(f"backend={backend} " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()) + f" goals_met={met}")


if __name__ == "__main__":
    main()
