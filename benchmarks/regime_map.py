"""The RTT x clients map: where pipelined DSD stops matching co-located SD as N clients
share one verifier, measured against the queueing model's prediction written before the points
ran (dsd/analytic/queueing.py; orchestrator/analysis/frontier.py, summary.json's `frontier`).

    python benchmarks/regime_map.py [--launcher sim|netns] [--out DIR] [--clients 1,2,4,8,16,32]
        [--rtt-ms 0,1,2,...] [--requests 1] [--max-new-tokens 48] [--max-batch 1]
    python benchmarks/regime_map.py --sweep DIR [--sim-sweep DIR] [--real-sweep DIR]

--launcher sim (default) runs a reduced copy of experiments/regime-map-sim-serial.toml (its
profile, acceptance and gamma; the clients, RTT grid, request counts and the verifier's
max_batch of the flags, 1 = serial as the file) on virtual time, about a minute on 2 cores. --launcher netns (root) runs
experiments/regime-map-netns.toml on real packets and the same grid on the sim beside it. --sweep
reads a sweep folder instead (its launcher from sweep.json; --sim-sweep a sim folder of the same
grid to compare it with); --real-sweep reads experiments/regime-map-real.toml's folder.

Every figure is of the pair pipelined_vs_colocated:
    frontier_inside_share     client counts whose measured crossover lies strictly inside the grid
    frontier_ci_finite_share  client counts whose 95% interval is finite, does not span the grid and
                              is not degenerate (no resampled value differs: a point, not a spread)
    frontier_err_*_pct        |measured / predicted - 1| over the client counts predicted out of
                              sample (before their points ran) at >= 10 ms
    slope_*_ms_per_client     least-squares slope of RTT*(N) over the counts measured inside the grid
    sim_vs_net_err_max_pct    |netns / sim - 1| at shared counts with the sim's crossover >= 10 ms
    wan_crossover_ms          the largest crossover measured on the real pair, any N
    real_edge_draft_step_ratio_max  the pipelined edges' measured draft step at N over N = 1's,
                              the largest on the real pair (above 1.25 the edges slowed each other)
A figure that cannot be measured prints as nan, with the reason on stderr. Progress goes to
stderr; the last line is key=value.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.analysis.frontier import ERR_FLOOR_MS, OUT_OF_SAMPLE  # noqa: E402
from orchestrator.report.analyze import analyze_sweep  # noqa: E402
from orchestrator.running.run import run_experiment  # noqa: E402
from orchestrator.spec.experiment import Experiment, load_experiment  # noqa: E402
from orchestrator.spec.file_paths import REPO  # noqa: E402

PAIR = "pipelined_vs_colocated"
SIM_FILE = REPO / "experiments" / "regime-map-sim-serial.toml"
NETNS_FILE = REPO / "experiments" / "regime-map-netns.toml"
CLIENTS = (1, 2, 4, 8, 16, 32)
# Around the model's crossovers for those counts (about 1, 12, 34, 81, 175 and 365 ms), and past.
RTT_MS = (0, 1, 2, 5, 10, 20, 40, 60, 90, 130, 180, 250, 320, 450)


def frontier_of(folder: Path) -> tuple[str, list[dict], float]:
    """(launcher, the pair's frontier rows by client count, the grid's largest RTT) of a sweep
    folder, analysed if its summary is missing."""
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else analyze_sweep(folder)
    sweep = json.loads((folder / "sweep.json").read_text())
    rows = sorted(
        (r for r in summary.get("frontier", {}).get("rows", []) if r["pair"] == PAIR), key=lambda r: r["clients"]
    )
    return sweep.get("launcher", "?"), rows, max(sweep["experiment"]["rtt_ms"])


def frontier_figures(rows: list[dict], rtt_max_ms: float) -> dict:
    """The issue's figures of one sweep's frontier rows (one per client count)."""
    if not rows:
        return {}
    counts = [int(r["clients"]) for r in rows]
    inside = [r for r in rows if 0 < r["crossover_ms"] < rtt_max_ms]
    finite_ci = [
        r
        for r in rows
        if math.isfinite(r["ci_low_ms"])
        and math.isfinite(r["ci_high_ms"])
        and not r["ci_covers_grid"]
        and not r.get("ci_degenerate", False)
    ]
    errors = [
        err_pct(r["crossover_ms"], r["predicted_ms"])
        for r in rows
        if r["in_or_out_of_sample"] == OUT_OF_SAMPLE
        and math.isfinite(r["predicted_ms"])
        and r["predicted_ms"] >= ERR_FLOOR_MS
    ]
    sloped = [r for r in inside if math.isfinite(r["predicted_ms"])]
    return {
        "client_counts": ",".join(map(str, counts)),
        "clients_max": max(counts),
        "frontier_inside_share": len(inside) / len(rows),
        "frontier_ci_finite_share": len(finite_ci) / len(rows),
        "frontier_err_p50_pct": float(np.median(errors)) if errors else math.nan,
        "frontier_err_max_pct": max(errors) if errors else math.nan,
        "slope_ms_per_client": slope([r["clients"] for r in sloped], [r["crossover_ms"] for r in sloped]),
        "slope_predicted_ms_per_client": slope([r["clients"] for r in sloped], [r["predicted_ms"] for r in sloped]),
    }


def sim_vs_net_err_max_pct(net_rows: list[dict], sim_rows: list[dict]) -> float:
    sim = {r["clients"]: r["crossover_ms"] for r in sim_rows}
    errors = [
        err_pct(r["crossover_ms"], sim[r["clients"]])
        for r in net_rows
        if r["clients"] in sim and math.isfinite(sim[r["clients"]]) and sim[r["clients"]] >= ERR_FLOOR_MS
    ]
    return max(errors) if errors else math.nan


def real_figures(rows: list[dict]) -> dict:
    errors = [
        err_pct(r["crossover_ms"], r["predicted_ms"])
        for r in rows
        if r["in_or_out_of_sample"] == OUT_OF_SAMPLE
        and math.isfinite(r["predicted_ms"])
        and r["predicted_ms"] >= ERR_FLOOR_MS
    ]
    located = [r["crossover_ms"] for r in rows if math.isfinite(r["crossover_ms"])]
    ratios = [r["edge_draft_step_ratio"] for r in rows if math.isfinite(r.get("edge_draft_step_ratio", math.nan))]
    return {
        "real_clients_max": max(int(r["clients"]) for r in rows),
        "real_frontier_err_max_pct": max(errors) if errors else math.nan,
        "wan_crossover_ms": max(located) if located else math.nan,
        "real_edge_draft_step_ratio_max": max(ratios) if ratios else math.nan,
    }


def err_pct(measured_ms: float, predicted_ms: float) -> float:
    if math.isfinite(measured_ms) and math.isfinite(predicted_ms) and predicted_ms:
        return 100 * abs(measured_ms / predicted_ms - 1)
    return math.inf


def slope(x: list[float], y: list[float]) -> float:
    return float(np.polyfit(x, y, 1)[0]) if len(set(x)) >= 2 else math.nan


def reduced_sim(args: argparse.Namespace) -> Experiment:
    """The serial sim file with the flags' clients, RTT grid, request counts and max_batch."""
    return replace(
        load_experiment(SIM_FILE),
        name="regime-map-bench",
        clients=tuple(args.clients),
        rtt_ms=tuple(args.rtt_ms),
        requests=args.requests,
        warmup_requests=args.warmup_requests,
        max_new_tokens=args.max_new_tokens,
        max_batch=args.max_batch,
    )


def run(experiment: Experiment, out: Path) -> Path:
    print(f"running {experiment.name} on {experiment.launcher} into {out}", file=sys.stderr, flush=True)
    run_experiment(experiment, out, resume=(out / "sweep.json").exists())
    analyze_sweep(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    folder, sim_folder = _sweeps(args)
    figures = _unmeasured_figures()
    launcher, rows, rtt_max_ms = frontier_of(folder)
    figures["launcher"] = launcher
    if rows:
        figures |= frontier_figures(rows, rtt_max_ms)
        _print_rows(rows)
    else:
        _why(f"{folder}: no {PAIR} frontier rows (a sweep over two client counts or more, with both modes)")
    if launcher == "sim":
        sim_folder = folder
    if sim_folder is not None:
        _, sim_rows, _ = frontier_of(Path(sim_folder))
        if sim_rows:
            figures["sim_clients_max"] = max(int(r["clients"]) for r in sim_rows)
        if launcher != "sim" and rows and sim_rows:
            figures["sim_vs_net_err_max_pct"] = sim_vs_net_err_max_pct(rows, sim_rows)
    if launcher == "sim":
        _why(
            "sim_vs_net_err_max_pct: no network sweep (--launcher netns as root, or --sweep NETNS_DIR "
            "--sim-sweep SIM_DIR)"
        )
    elif sim_folder is None:
        _why("sim_vs_net_err_max_pct, sim_clients_max: no sim sweep of the same grid (--sim-sweep DIR)")
    if args.real_sweep is not None:
        _, real_rows, _ = frontier_of(args.real_sweep)
        if real_rows:
            _print_rows(real_rows)
            figures |= real_figures(real_rows)
        else:
            _why(f"real_*: {args.real_sweep} has no {PAIR} frontier rows")
    else:
        _why(
            "real_clients_max, real_frontier_err_max_pct, wan_crossover_ms, real_edge_draft_step_ratio_max: "
            "no real-pair sweep (run "
            "`dsdbed sweep experiments/regime-map-real.toml` as root, then --real-sweep results/regime-map-real)"
        )
    for key in [k for k, v in figures.items() if isinstance(v, float) and math.isnan(v)]:
        _why(f"{key}: nan (see above)")
    figures |= {"load_avg_1m": round(os.getloadavg()[0], 2), "out": folder}
    print(" ".join(f"{k}={_fmt(v)}" for k, v in figures.items()))
    return 0


def _sweeps(args) -> tuple[Path, Path | None]:
    """(the sweep to read, the sim sweep of the same grid or None): read, or run now."""
    out = Path(args.out or tempfile.mkdtemp(prefix="dsdbed-regime-map-"))
    if args.sweep is not None:
        return args.sweep, args.sim_sweep
    if args.launcher == "netns":
        if os.geteuid() != 0:
            raise SystemExit("--launcher netns needs root (network namespaces); or read a folder with --sweep")
        netns = load_experiment(NETNS_FILE)
        folder = run(netns, out / "netns")
        return folder, run(replace(netns, launcher="sim", name="regime-map-netns-sim"), out / "sim")
    folder = run(reduced_sim(args), out / "sim")
    return folder, folder


def _unmeasured_figures() -> dict:
    """Every figure main prints, nan (or "none") until measured."""
    nan = math.nan
    return {
        "launcher": "none",
        "client_counts": "none",
        "clients_max": nan,
        "frontier_inside_share": nan,
        "frontier_ci_finite_share": nan,
        "frontier_err_p50_pct": nan,
        "frontier_err_max_pct": nan,
        "slope_ms_per_client": nan,
        "slope_predicted_ms_per_client": nan,
        "sim_vs_net_err_max_pct": nan,
        "sim_clients_max": nan,
        "real_clients_max": nan,
        "real_frontier_err_max_pct": nan,
        "wan_crossover_ms": nan,
        "real_edge_draft_step_ratio_max": nan,
    }


def _print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"N={r['clients']:>4}  {PAIR} measured {r['crossover_ms']:8.2f} ms "
            f"[{r['ci_low_ms']:.2f} .. {r['ci_high_ms']:.2f}]{' (degenerate)' if r.get('ci_degenerate') else ''}"
            f"  predicted {r['predicted_ms']:8.2f} ms "
            f"({r['in_or_out_of_sample']})"
            f"{_edge_note(r.get('edge_draft_step_ratio', math.nan), r.get('edge_draft_inflated', False))}",
            file=sys.stderr,
        )


def _edge_note(ratio: float, inflated: bool) -> str:
    if not math.isfinite(ratio):
        return ""
    return f"  edge draft step x{ratio:.2f}" + (" (inflated: the edges slowed each other)" if inflated else "")


def _why(message: str) -> None:
    print(f"regime_map: {message}", file=sys.stderr)


def _fmt(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", default="sim", choices=["sim", "netns"])
    parser.add_argument("--out", default="", help="where the sweeps go (default: a temporary folder); resumes")
    parser.add_argument("--clients", type=_ints, default=list(CLIENTS), help="sim grid: client counts, 1,2,4")
    parser.add_argument("--rtt-ms", type=_floats, default=list(RTT_MS), help="sim grid: RTTs in ms, 0,5,20")
    parser.add_argument("--requests", type=int, default=1, help="sim grid: measured requests per client")
    parser.add_argument("--warmup-requests", type=int, default=1, help="sim grid: warm-up requests per client")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="sim grid: tokens per request")
    parser.add_argument("--max-batch", type=int, default=1, help="sim grid: sequences per pass (1 = serial)")
    parser.add_argument("--sweep", type=Path, help="read this sweep folder instead of running one")
    parser.add_argument("--sim-sweep", type=Path, help="with --sweep: a sim folder of the same grid")
    parser.add_argument("--real-sweep", type=Path, help="experiments/regime-map-real.toml's folder")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
