"""The crossover from a real pair's acceptance trace beside the one from i.i.d. alpha, same mean.

Runs an experiment whose synthetic backend replays an acceptance trace
(default experiments/acceptance-trace.toml), then its twin with the trace replaced by i.i.d.
acceptance at the trace's fitted alpha (the pooled maximum-likelihood alpha that the analysis
reports: the same mean acceptance per drafted position). Same grid, prompts, profile and seeds;
only how acceptance is distributed over rounds differs. Prints each variant's accepted-count
histogram and crossovers (measured, and predicted by the closed form at the fitted alpha), then
key=value pairs.

    python benchmarks/trace_vs_iid.py [--experiment FILE] [--out DIR] [--launcher sim|loopback|...] [--resume]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from orchestrator.spec.experiment import load_experiment  # noqa: E402
from orchestrator.report.analyze import analyze_sweep  # noqa: E402
from orchestrator.running.run import run_experiment  # noqa: E402


def iid_twin(experiment):
    trace = experiment.backend.trace()
    if trace is None:
        raise ValueError(f"experiment {experiment.name!r}: backend.acceptance_trace is not set")
    backend = dataclasses.replace(
        experiment.backend, acceptance_trace="", acceptance_rounds="", alpha=round(trace.alpha_measured, 6)
    )
    return dataclasses.replace(experiment, name=f"{experiment.name}-iid", backend=backend), trace


def histogram(out: Path, gamma: int) -> dict[int, float]:
    rounds = pd.read_csv(out / "rounds.csv")
    live = rounds[(rounds["proposed"] == gamma) & ~rounds["stale"].astype(bool) & (rounds["mode"] == "colocated")]
    counts = live["accepted"].value_counts(normalize=True).sort_index()
    return {int(k): float(v) for k, v in counts.items()}


def _ms(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.1f}" if math.isfinite(value) else ("never" if value < 0 else ">grid")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=REPO / "experiments" / "acceptance-trace.toml")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "acceptance-trace")
    parser.add_argument("--launcher", help="run on this launcher instead of the file's")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    traced = load_experiment(args.experiment)
    if args.launcher:
        traced = dataclasses.replace(traced, launcher=args.launcher)
    iid, trace = iid_twin(traced)
    gamma = traced.gamma[0]
    results = {}
    for label, experiment in (("trace", traced), ("iid", iid)):
        out = args.out / label
        run_experiment(experiment, out, resume=args.resume)
        summary = analyze_sweep(out)
        group = summary["groups"][0]
        results[label] = {
            "alpha": group["alpha_measured"],
            "crossovers": group["crossovers"],
            "histogram": histogram(out, gamma),
            "out": out,
        }

    print(
        f"trace {trace.source}: {len(trace.rounds)} rounds, measured alpha {trace.alpha_measured:.3f}, "
        f"mean accepted {trace.mean_accepted:.2f}; profile {traced.profile}, gamma {gamma}, "
        f"launcher {traced.launcher}"
    )
    print(f"{'variant':8} {'alpha':>6}  accepted-count histogram (co-located rounds)")
    for label, r in results.items():
        bars = "  ".join(f"{k}:{v:.2f}" for k, v in r["histogram"].items())
        print(f"{label:8} {r['alpha']:6.3f}  {bars}")
    names = sorted(results["trace"]["crossovers"])
    # predicted: the closed form (i.i.d.) at each variant's own fitted alpha, so measured minus
    # predicted is what the distribution of acceptance over rounds does beyond its mean
    print(f"{'crossover (RTT, ms)':24} {'trace meas':>10} {'trace pred':>10} {'iid meas':>10} {'iid pred':>10}")
    for name in names:
        t, i = results["trace"]["crossovers"][name], results["iid"]["crossovers"].get(name, {})
        print(
            f"{name:24} {_ms(t['measured_rtt_ms']):>10} {_ms(t['predicted_rtt_ms']):>10} "
            f"{_ms(i.get('measured_rtt_ms', math.nan)):>10} {_ms(i.get('predicted_rtt_ms', math.nan)):>10}"
        )
    print(f"results: {results['trace']['out']} {results['iid']['out']}")
    pairs = {"trace_alpha": f"{results['trace']['alpha']:.3f}", "iid_alpha": f"{results['iid']['alpha']:.3f}"}
    for name in names:
        pairs[f"{name}_trace_ms"] = _ms(results["trace"]["crossovers"][name]["measured_rtt_ms"])
        pairs[f"{name}_iid_ms"] = _ms(results["iid"]["crossovers"].get(name, {}).get("measured_rtt_ms", math.nan))
        pairs[f"{name}_trace_predicted_ms"] = _ms(results["trace"]["crossovers"][name]["predicted_rtt_ms"])
        pairs[f"{name}_iid_predicted_ms"] = _ms(
            results["iid"]["crossovers"].get(name, {}).get("predicted_rtt_ms", math.nan)
        )
    print(" ".join(f"{k}={v}" for k, v in pairs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
