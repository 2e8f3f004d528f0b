"""Measured per-token latency and crossovers vs the closed form, on the synthetic backend.

The synthetic backend emulates a fixed hardware profile, so the compute is known (t_draft,
t_verify, t_ar from the profile) and alpha is known in expectation; what remains is the testbed:
the network, the services, the scheduler, the timers. A small grid of RTT x mode with repeats
runs on the best launcher available, then `dsdbed analyze` measures alpha (the one of these
token streams) and the parameters, and this prints a table and, last, key=value pairs.

Two predictions are set beside the measurements:
- client view (the headline max_latency_err_pct, max_crossover_err_pct): the closed form with
  each part timed as the edge sees it, compute plus the harness's own per-round overhead
  (measured from the round receipts and printed as overhead_*_ms); this tests how the parts
  combine: E(alpha, gamma), the round structure, the pipelining overlap.
- compute only (*_compute_only): the closed form with the compute times alone; the gap to the
  client view is what the harness itself costs per round.
Per-token latency is the steady state: from a request's first round to its last full one.

The headline is out of sample (oos_*): the sweep's calibration points (first
repeat of AR, co-located and sync at RTT 0) fix the parameters, every other point and the
crossovers are predicted from them alone before they run (predictions.csv), and the error is
taken over the non-calibration points only. crossover_ci_width_ms is the widest 95% bootstrap
interval of a located crossover (crossover_ci_width_pct: relative to the crossover).

The calibration's alpha is fitted to the tokens per round of the requests' steady windows (the
rounds the per-token statistic counts), not the pooled maximum-likelihood alpha of all rounds,
which predicts the crossover early. Measurements: docs/results/theory-agreement.md.

    python benchmarks/theory_agreement.py [--launcher auto|netns|loopback|sim] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from dsd.costs.compute_times import ComputeTimes  # noqa: E402
from orchestrator.analysis import points as analysis  # noqa: E402
from orchestrator.spec.experiment import experiment_from_dict  # noqa: E402
from orchestrator.report.analyze import analyze_sweep  # noqa: E402
from orchestrator.running.run import choose_launcher, run_experiment  # noqa: E402


PROFILE, GAMMA = "toy-edge-cloud", 4


def main() -> int:
    args = _parse_args()
    launcher = choose_launcher(args.launcher)
    out = Path(args.out or tempfile.mkdtemp(prefix="dsdbed-theory-"))
    run_experiment(_experiment(args, launcher), out, resume=bool(args.out) and (out / "sweep.json").exists())
    summary = analyze_sweep(out)
    table = _latency_table(out, summary)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    errors, errors_compute = _crossover_errors(summary)
    print("parameters (client view):", json.dumps(summary["params"], default=str))
    print(
        " ".join(
            _oos_keys(summary)
            + [
                f"max_latency_err_pct={table.err_pct.abs().max():.2f}",
                f"median_latency_err_pct={table.err_pct.abs().median():.2f}",
                f"max_crossover_err_pct={max(errors):.2f}",
                f"max_latency_err_pct_compute_only={table.err_compute_only_pct.abs().max():.2f}",
                f"median_latency_err_pct_compute_only={table.err_compute_only_pct.abs().median():.2f}",
                f"max_crossover_err_pct_compute_only={max(errors_compute):.2f}",
                *(f"overhead_{kind}_ms={value:.3f}" for kind, value in summary["harness_overhead_ms"].items()),
                f"alpha_measured={summary['alpha_measured']:.4f}",
                f"launcher={launcher}",
                f"alpha={args.alpha}",
                f"gamma={GAMMA}",
                f"profile={PROFILE}",
                f"repeats={args.repeats}",
                f"requests={args.requests}",
                f"acceptance={args.acceptance}",
                f"contended_points={summary['cpu']['points_contended']}/{summary['cpu']['points_recorded']}",
                f"load_avg_1m={os.getloadavg()[0]:.2f}",
                f"out={out}",
            ]
        )
    )
    return 0


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--out", default="")
    parser.add_argument("--requests", type=int, default=4, help="measured requests per point")
    parser.add_argument(
        "--acceptance",
        default="stratified",
        choices=("stratified", "iid"),
        help="stratified (default): every request realises alpha, so the intervals measure "
        "the testbed, not the luck of the draw; iid: independent acceptance per position",
    )
    return parser.parse_args()


def _experiment(args: argparse.Namespace, launcher: str):
    return experiment_from_dict(
        {
            "name": "theory-agreement",
            "launcher": launcher,
            "rtt_ms": [0, 4, 8, 12, 16, 24, 40],
            "gamma": [GAMMA],
            "requests": args.requests,
            "warmup_requests": 1,
            "max_new_tokens": 96,
            "prompt_tokens": 16,
            "repeats": args.repeats,
            "edges": 1,
            "profile": PROFILE,
            "backend": {"kind": "synthetic", "alpha": args.alpha, "acceptance": args.acceptance},
        }
    )


def _latency_table(out: Path, summary: dict) -> pd.DataFrame:
    """Per (mode, RTT): measured beside the in-sample, compute-only and out-of-sample predictions."""
    points = pd.read_csv(out / "points.csv")
    table = (
        points.groupby(["mode", "rtt_ms"])
        .agg(
            measured_ms=("per_token_ms_p50", "median"),
            predicted_ms=("per_token_ms_predicted", "first"),
            compute_only_ms=("per_token_ms_predicted_compute_only", "first"),
            rtt_probe_ms=("rtt_measured_ms", "median"),
            alpha=("alpha_measured", "median"),
        )
        .reset_index()
    )
    oos = pd.DataFrame(summary["latency_cells"])
    oos = oos[oos["clients"] == oos["clients"].min()][
        ["mode", "rtt_ms", "per_token_ms_predicted_oos", "err_oos_pct", "ci_low", "ci_high"]
    ]
    table = table.merge(
        oos.rename(columns={"per_token_ms_predicted_oos": "oos_predicted_ms"}), on=["mode", "rtt_ms"], how="left"
    )
    table["err_pct"] = 100 * (table.measured_ms / table.predicted_ms - 1)
    table["err_compute_only_pct"] = 100 * (table.measured_ms / table.compute_only_ms - 1)
    return table


def _crossover_errors(summary: dict) -> tuple[list[float], list[float]]:
    """Prints each crossover; returns its in-sample and compute-only errors (percent)."""
    compute_crossovers = analysis.predicted_crossovers(
        GAMMA, summary["alpha_measured"], ComputeTimes.from_dict(summary["params_compute"])
    )
    errors, errors_compute = [], []
    for name, c in summary["crossovers"].items():
        m, p, q = c["measured_rtt_ms"], c["predicted_rtt_ms"], compute_crossovers[name]["rtt_ms"]
        errors.append(_err_pct(m, p))
        errors_compute.append(_err_pct(m, q))
        print(
            f"{name}: measured {c['text']} (repeats {c['measured_rtt_ms_min']:.2f}..{c['measured_rtt_ms_max']:.2f}), "
            f"predicted before measuring {c['predicted_rtt_ms_oos']:.2f} ms (error {c['oos_err_pct']:.1f}%), "
            f"in-sample {p:.2f} ms (error {errors[-1]:.1f}%), compute only {q:.2f} ms (error {errors_compute[-1]:.1f}%)"
        )
    return errors, errors_compute


def _oos_keys(summary: dict) -> list[str]:
    """The out-of-sample headline: latency errors, crossover errors and the widest interval."""
    oos_summary = summary["out_of_sample"]
    located = [c for c in summary["crossovers"].values() if math.isfinite(c["measured_rtt_ms"])]
    widths = [c["ci_high"] - c["ci_low"] for c in located]
    # Near RTT 0 a relative error says little (0.02 vs -0.5 ms is "100%"): the absolute one too.
    oos_abs_ms = [
        abs(c["measured_rtt_ms"] - c["predicted_rtt_ms_oos"])
        for c in located
        if math.isfinite(c["predicted_rtt_ms_oos"])
    ]
    widths_pct = [
        100 * w / abs(c["measured_rtt_ms"]) if c["measured_rtt_ms"] else math.inf for w, c in zip(widths, located)
    ]
    return [
        f"oos_latency_err_p50_pct={oos_summary['latency_err_p50_pct']:.2f}",
        f"oos_latency_err_max_pct={oos_summary['latency_err_max_pct']:.2f}",
        f"oos_crossover_err_pct={oos_summary['crossover_err_max_pct']:.2f}",
        f"oos_crossover_err_ms={max(oos_abs_ms) if oos_abs_ms else math.nan:.2f}",
        f"crossover_ci_width_ms={max(widths) if widths else math.nan:.2f}",
        f"crossover_ci_width_pct={max(widths_pct) if widths_pct else math.nan:.1f}",
    ]


def _err_pct(measured: float, predicted: float) -> float:
    if math.isfinite(measured) and math.isfinite(predicted) and predicted:
        return 100 * abs(measured / predicted - 1)
    return 0.0 if measured == predicted else math.inf


if __name__ == "__main__":
    raise SystemExit(main())
