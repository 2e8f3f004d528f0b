"""Serving under load: the largest arrival rate each mode sustains at the SLO's attainment level,
measured on real packets against what was predicted for that run before it ran.

    python benchmarks/serving.py [--launcher auto|netns|compose|loopback|sim] [--duration-s 30]
                                 [--warmup-s 5] [--ensemble-repeats 16] [--requests-per-rate 100]
                                 [--out DIR]

experiments/serving.toml (synthetic backend, the Orin-edge / A100-target field profile, 16 edges
on RIPE Atlas country-pair links to a cloud in Germany, Poisson arrivals, SLO TTFT <= 1 s and
TPOT <= 60 ms at 90%), every run ``--duration-s`` of arrivals with the first ``--warmup-s`` left
out of the figures:

1. The ensemble, on the sim: ``--ensemble-repeats`` independent arrival realisations per rate,
   pooled, around the closed form's largest rate, then the rate search: the largest rate of the
   arrival *process* at this run length, with a 95% CI over realisations, beside the closed
   form's steady state (``steady_err_pct``); and how far one realisation's own largest rate
   scatters around it (``single_run_sd_pct``).
2. The run, on the network launcher (``--launcher``: netns, compose; auto is netns as root, else loopback). Each mode pools enough
   independent arrival realisations per rate to measure about ``--requests-per-rate`` requests
   there (from the ensemble's rate: one 30-s run of cloud AR near its knee measures ~25, and a
   busy period failing five moves its attainment 17 points). First the run's prediction, written
   to OUT/LAUNCHER/prediction.json before any of its points runs: the virtual-time model (the
   sim) on those same realisations, searched to 0.5%. Then each mode at its predicted rate over
   its realisations and up to four steps of the rate search (3% steps until the level is
   bracketed, then the interpolated crossing), which stops at a rate whose pooled attainment is
   within 2 points of the level. ``rate_err_pct`` compares this run with its own prediction; that
   prediction is the simulator (docs/serving.md says why a prediction of the process cannot be
   held to 10% on one run of 30 s).

With ``--launcher sim`` there is no network run: the measured figures are the ensemble's and the
prediction the closed form's.

Prints a table to stderr; the last stdout line is key=value pairs: edges, the launcher, its
largest rate per mode (max_rate_ar_rps, max_rate_colocated_rps, max_rate_dsd_rps; DSD is sync),
dsd_over_colocated beside predicted_dsd_over_colocated, rate_err_pct (the worst of the three
modes' measured-vs-predicted errors), goodput_at_max_dsd, attainment_at_max_dsd and
attainment_err_pts (the worst mode's distance in points between the attainment at the evaluated
rate nearest its largest rate and the level), per mode that attainment, its Wilson 95% CI and
the realisations pooled (attainment_*, attainment_ci_*, realisations_*), each mode's prediction
and the closed form's steady state, the ensemble's figures, steady_err_pct, single_run_sd_pct, queue_growing_at_max
(modes whose point nearest the largest rate was still building its queue, in at least half of
its repeats), the load average and the wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.open_loop.figures import per_repeat_max_rates  # noqa: E402
from orchestrator.open_loop.plan import PREDICTION, ServingPoint, serving_model  # noqa: E402
from orchestrator.open_loop.sweep import run_serving, serving_times, write_prediction  # noqa: E402
from orchestrator.running.run import choose_launcher  # noqa: E402
from orchestrator.spec.experiment import load_experiment  # noqa: E402

EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "serving.toml"
MODES = {"ar": "ar", "colocated": "colocated", "dsd": "sync"}
ENSEMBLE_GRID = (0.5, 0.65, 0.8, 0.9, 1.0, 1.1, 1.2, 1.35, 1.5, 1.7)  # x the closed form's rate
NET_SEARCH_STEPS = 4
NET_OPEN_STEP = 0.03  # the network search's step from the predicted rate until it brackets the level
MAX_REALISATIONS = 6


def with_load(experiment, launcher: str, repeats: int = 1, **load):
    return dataclasses.replace(
        experiment, launcher=launcher, repeats=repeats, load=dataclasses.replace(experiment.load, **load)
    )


def run(experiment, out: Path, label: str, plan=None, open_step: float = 1.0) -> dict:
    t0 = time.monotonic()
    run_serving(
        experiment,
        out,
        plan=plan,
        open_step=open_step,
        on_point_done=lambda p, d: print(f"  {label} {p.key}: {d['status']} {d['error']}", file=sys.stderr, flush=True),
    )
    print(f"{label}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return json.loads((out / "serving.json").read_text())["modes"]


def ensemble(base, out: Path, repeats: int, duration_s: float, warmup_s: float) -> dict:
    """The sim over ``repeats`` arrival realisations: per mode the pooled largest rate and its CI,
    and the spread of the realisations' own largest rates (relative SD)."""
    experiment = with_load(base, "sim", repeats, duration_s=duration_s, warmup_s=warmup_s, search_iterations=4)
    model = serving_model(experiment, serving_times(experiment, out))
    plan = [
        ServingPoint(mode, round(f * model.max_rate_rps(mode, experiment.slo), 4), base.gamma[0], r)
        for f in ENSEMBLE_GRID
        for mode in MODES.values()
        for r in range(repeats)
    ]
    modes = run(experiment, out, "ensemble", plan)
    points = pd.read_csv(out / "points.csv")
    for mode, row in modes.items():
        singles = per_repeat_max_rates(points[points["mode"] == mode], experiment.slo.attainment)
        singles = singles[np.isfinite(singles)]
        row["single_run_sd_pct"] = 100 * float(np.std(singles)) / row["max_rate_rps"] if len(singles) > 1 else math.nan
    return modes


def realisations(rate_rps: float, requests: int, measured_s: float) -> int:
    """Arrival realisations to pool per rate so that a rate near ``rate_rps`` measures about
    ``requests`` requests: one busy period then fails a few points' worth, not a sixth."""
    if not math.isfinite(rate_rps) or rate_rps <= 0:
        return MAX_REALISATIONS
    return int(min(max(math.ceil(requests / (rate_rps * measured_s)), 1), MAX_REALISATIONS))


def network(base, launcher: str, out: Path, duration_s: float, warmup_s: float, repeats: dict) -> dict:
    """The run on the network launcher, its prediction written first: each mode starts at its
    predicted rate and searches from there, every rate over the mode's ``repeats`` realisations."""
    experiment = with_load(
        base,
        launcher,
        max(repeats.values()),
        duration_s=duration_s,
        warmup_s=warmup_s,
        search_iterations=NET_SEARCH_STEPS,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_prediction(out, experiment, serving_times(experiment, out), launcher, repeats)
    predicted = json.loads((out / PREDICTION).read_text())["modes"]
    plan = [
        ServingPoint(mode, round(predicted[mode]["run_max_rate_rps"], 4), base.gamma[0], r)
        for mode in MODES.values()
        for r in range(repeats[mode])
    ]
    return run(experiment, out, launcher, plan, open_step=NET_OPEN_STEP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launcher", default="auto", choices=("auto", "netns", "compose", "loopback", "sim"))
    parser.add_argument("--duration-s", type=float, default=30.0, help="arrivals per point")
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--ensemble-repeats", type=int, default=16, help="arrival realisations per sim rate")
    parser.add_argument(
        "--requests-per-rate",
        type=int,
        default=100,
        help="the network run pools enough realisations per rate to measure about this many",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the sweep folders here")
    args = parser.parse_args()
    t0 = time.monotonic()
    base = load_experiment(EXPERIMENT)
    launcher = choose_launcher(args.launcher)
    work = args.out or Path(tempfile.mkdtemp(prefix="dsd-serving-"))
    many = ensemble(base, work / "ensemble", args.ensemble_repeats, args.duration_s, args.warmup_s)
    if launcher == "sim":
        rows = {
            name: {
                **many[mode],
                "predicted_max_rate_rps": many[mode]["steady_max_rate_rps"],
                "rate_err_pct": many[mode]["steady_err_pct"],
            }
            for name, mode in MODES.items()
        }
    else:
        repeats = {
            mode: realisations(many[mode]["max_rate_rps"], args.requests_per_rate, args.duration_s - args.warmup_s)
            for mode in MODES.values()
        }
        net = network(base, launcher, work / launcher, args.duration_s, args.warmup_s, repeats)
        rows = {name: net[mode] for name, mode in MODES.items()}
    print_table(rows, many)
    print(
        " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
            for k, v in figures(base, launcher, rows, many, time.monotonic() - t0).items()
        )
    )


def print_table(rows: dict, many: dict) -> None:
    for name, row in rows.items():
        e = many[MODES[name]]
        print(
            f"{name:10s} measured {row['max_rate_rps']:.3f} req/s [{row['max_rate_ci_low_rps']:.3f} .. "
            f"{row['max_rate_ci_high_rps']:.3f}]; attainment {row['attainment_at_max']:.3f} "
            f"[{row['attainment_ci_low']:.3f} .. {row['attainment_ci_high']:.3f}] over "
            f"{row['attainment_requests']} requests at {row['attainment_rate_rps']:.4g} req/s, "
            f"{row['repeats']} realisation(s); predicted "
            f"{row['predicted_max_rate_rps']:.3f}; ensemble {e['max_rate_rps']:.3f} [{e['max_rate_ci_low_rps']:.3f}"
            f" .. {e['max_rate_ci_high_rps']:.3f}], one run's SD {e['single_run_sd_pct']:.1f}%; closed form "
            f"{row['steady_max_rate_rps']:.3f}; goodput there {row['goodput_at_max_rps']:.3f}",
            file=sys.stderr,
        )


def figures(base, launcher: str, rows: dict, many: dict, wall_s: float) -> dict:
    level = base.slo.attainment
    measured = {name: row["max_rate_rps"] for name, row in rows.items()}
    predicted = {name: row["predicted_max_rate_rps"] for name, row in rows.items()}
    steady = {name: row["steady_max_rate_rps"] for name, row in rows.items()}
    return {
        "edges": base.edges,
        "launcher": launcher,
        "max_rate_ar_rps": measured["ar"],
        "max_rate_colocated_rps": measured["colocated"],
        "max_rate_dsd_rps": measured["dsd"],
        "dsd_over_colocated": measured["dsd"] / measured["colocated"],
        "predicted_dsd_over_colocated": predicted["dsd"] / predicted["colocated"],
        "rate_err_pct": max((row["rate_err_pct"] for row in rows.values()), key=abs),
        "goodput_at_max_dsd": rows["dsd"]["goodput_at_max_rps"],
        "attainment_at_max_dsd": rows["dsd"]["attainment_at_max"],
        "attainment_err_pts": 100 * max(abs(row["attainment_at_max"] - level) for row in rows.values()),
        **{f"attainment_{name}": rows[name]["attainment_at_max"] for name in MODES},
        **{
            f"attainment_ci_{name}": f"{rows[name]['attainment_ci_low']:.3f}..{rows[name]['attainment_ci_high']:.3f}"
            for name in MODES
        },
        **{f"realisations_{name}": rows[name]["repeats"] for name in MODES},
        **{f"predicted_{name}_rps": predicted[name] for name in MODES},
        **{
            f"ci_{name}_rps": f"{rows[name]['max_rate_ci_low_rps']:.3f}..{rows[name]['max_rate_ci_high_rps']:.3f}"
            for name in MODES
        },
        **{f"steady_{name}_rps": steady[name] for name in MODES},
        "steady_dsd_over_colocated": steady["dsd"] / steady["colocated"],
        **{f"ensemble_{name}_rps": many[mode]["max_rate_rps"] for name, mode in MODES.items()},
        "steady_err_pct": max((many[mode]["steady_err_pct"] for mode in MODES.values()), key=abs),
        "single_run_sd_pct": max(many[mode]["single_run_sd_pct"] for mode in MODES.values()),
        "queue_growing_at_max": sum((row.get("queue_growing_at_max") or 0) >= 0.5 for row in rows.values()),
        "load_avg_1m": os.getloadavg()[0],
        "wall_s": wall_s,
    }


if __name__ == "__main__":
    main()
