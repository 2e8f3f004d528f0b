"""Measured per-token latency and crossovers vs the closed form, on the synthetic backend.

The synthetic backend emulates a fixed hardware profile, so the closed form's inputs are known
exactly (alpha as configured; t_draft, t_verify, t_ar from the profile); what remains is the
testbed: the network, the services, the scheduler, the timers. A small grid of RTT x mode with
repeats runs on the best launcher available, then prints a table and, last, key=value pairs
including max_latency_err_pct= and max_crossover_err_pct=.

    python benchmarks/theory_agreement.py [--launcher auto|netns|loopback|sim] [--repeats 3]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from dsd.profiles import get_profile  # noqa: E402
from orchestrator import analysis  # noqa: E402
from orchestrator.experiment import experiment_from_dict  # noqa: E402
from orchestrator.run import choose_launcher, run_experiment  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    launcher = choose_launcher(args.launcher)
    profile_name, gamma = "toy-edge-cloud", 4
    profile = get_profile(profile_name)
    experiment = experiment_from_dict({
        "name": "theory-agreement", "launcher": launcher, "rtt_ms": [0, 4, 8, 12, 16, 24, 40],
        "gamma": [gamma], "requests": 4, "warmup_requests": 1, "max_new_tokens": 96, "prompt_tokens": 16,
        "repeats": args.repeats, "edges": 1, "profile": profile_name,
        "backend": {"kind": "synthetic", "alpha": args.alpha}})
    out = Path(args.out or tempfile.mkdtemp(prefix="dsdbed-theory-"))
    run_experiment(experiment, out, resume=bool(args.out) and (out / "sweep.json").exists())
    requests = pd.read_csv(out / "requests.csv")
    rounds = pd.read_csv(out / "rounds.csv")
    params = {"t_draft_edge_s": profile.t_draft_edge_s, "t_draft_server_s": profile.t_draft_server_s,
              "t_ar_s": profile.t_ar_s, "t_verify_s": {gamma: profile.t_verify_s(gamma)}}
    points = analysis.add_predictions(analysis.point_table(requests, rounds), args.alpha, params)
    table = (points.groupby(["mode", "rtt_ms"])
             .agg(measured_ms=("per_token_ms_p50", "median"), predicted_ms=("per_token_ms_predicted", "first"),
                  rtt_measured_ms=("rtt_measured_ms", "median"), alpha=("alpha_measured", "median"))
             .reset_index())
    table["err_pct"] = 100 * (table.measured_ms / table.predicted_ms - 1)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    measured = analysis.measured_crossovers(points, gamma)
    predicted = analysis.predicted_crossovers(gamma, args.alpha, params)
    crossover_errors = []
    for name in analysis.CROSSOVERS:
        m, p = measured.get(name, {}).get("rtt_ms", math.nan), predicted[name]["rtt_ms"]
        err = 100 * abs(m / p - 1) if math.isfinite(m) and math.isfinite(p) and p else (0.0 if m == p else math.inf)
        crossover_errors.append(err)
        print(f"{name}: measured {m:.2f} ms (repeats {measured.get(name, {}).get('rtt_ms_min', math.nan):.2f}"
              f"..{measured.get(name, {}).get('rtt_ms_max', math.nan):.2f}), predicted {p:.2f} ms, error {err:.1f}%")
    load_1m = os.getloadavg()[0]
    print(" ".join([
        f"max_latency_err_pct={table.err_pct.abs().max():.2f}",
        f"median_latency_err_pct={table.err_pct.abs().median():.2f}",
        f"max_crossover_err_pct={max(crossover_errors):.2f}",
        f"launcher={launcher}", f"alpha={args.alpha}", f"gamma={gamma}", f"profile={profile_name}",
        f"repeats={args.repeats}", f"load_avg_1m={load_1m:.2f}", f"out={out}",
    ]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
