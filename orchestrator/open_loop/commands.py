"""The dsdbed commands of an open-loop sweep (orchestrator/open_loop/sweep.py runs and analyses it):
``dsdbed sweep`` of an experiment with [load] (its plan, or the run and its figures) and
``dsdbed analyze`` of a serving folder (the figures again from what sweep.json recorded)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from orchestrator.spec.arrivals import RENAMED_KEYS, RENAMED_PROCESSES
from orchestrator.spec.experiment import Experiment
from orchestrator.open_loop.plan import check_serving, plan_serving
from orchestrator.running.run import choose_launcher
from orchestrator.open_loop.analyze import analyze_serving
from orchestrator.open_loop.sweep import run_serving


def run_serving_cli(experiment: Experiment, out: Path, resume: bool, dry_run: bool) -> int:
    """`dsdbed sweep` of an experiment with [load]: the plan, or the run and its figures."""
    if dry_run:
        check_serving(experiment, choose_launcher(experiment.launcher))  # refused before the plan prints
        plan = plan_serving(experiment)
        print(
            f"{len(plan)} points (+ up to {experiment.load.search_iterations} searched rates per mode"
            f"{' and RTT' if experiment.load.rtt_ms else ''}), "
            f"launcher {experiment.launcher}, into {out}:"
        )
        for point in plan:
            print(f"  {point.key}")
        return 0

    def on_point_done(point, done):
        print(
            f"{experiment.name}: {point.key}: {done['status']}{' ' + done['error'] if done['error'] else ''}",
            file=sys.stderr,
            flush=True,
        )

    run_serving(experiment, out, resume, on_point_done=on_point_done)
    summary = json.loads((Path(out) / "serving.json").read_text())
    for row in summary.get("rate_frontier", []):
        print(
            f"rtt {row['rtt_ms']:g} ms, {row['mode']}: largest rate at {experiment.slo.attainment:.0%} attainment "
            f"{row['max_rate_rps']:.3g} req/s [95% CI {row['ci_low_rps']:.3g} .. {row['ci_high_rps']:.3g}; grid "
            f"{row['met_rps']:.3g} .. {row['missed_rps']:.3g}], predicted {row['predicted_rps']}"
            f"{'  <- highest' if row['best'] else ''}"
        )
    for mode, row in summary["modes"].items():
        print(
            f"{mode}: largest rate at {experiment.slo.attainment:.0%} attainment {row.get('max_rate_rps')} req/s "
            f"[95% CI {row.get('max_rate_ci_low_rps')} .. {row.get('max_rate_ci_high_rps')}], "
            f"predicted for this run {row.get('predicted_max_rate_rps')}, "
            f"steady state {row.get('steady_max_rate_rps')}"
        )
    print(f"results: {out}/points.csv, {out}/requests.csv, {out}/serving.json, {out}/report.md")
    return 0


def is_serving_sweep(out: Path) -> bool:
    sidecar = Path(out) / "sweep.json"
    return sidecar.exists() and bool(json.loads(sidecar.read_text()).get("serving"))


def reanalyze_serving(out: Path) -> int:
    """`dsdbed analyze` of an open-loop sweep: points.csv, serving.json and the report again, from
    the experiment and compute times sweep.json recorded."""
    from dsd.costs.compute_times import ComputeTimes
    from orchestrator.spec.experiment import experiment_from_dict

    data = json.loads((Path(out) / "sweep.json").read_text())
    record = dict(data["experiment"])
    record.pop("hardware_profiles", None)
    experiment = experiment_from_dict(_experiment_table(record), source=str(Path(out) / "sweep.json"))
    analyze_serving(Path(out), experiment, ComputeTimes.from_dict(data["costs"]))
    print(f"results: {out}/points.csv, {out}/serving.json, {out}/report.md")
    return 0


def _experiment_table(record: dict) -> dict:
    """sweep.json's experiment record as an experiment file's tables (nested configs as tables,
    the [link] per-edge entries as lists of tables)."""
    table = {k: v for k, v in record.items() if v is not None}
    link = table.get("link")
    if isinstance(link, dict):
        link = {k: v for k, v in link.items() if k not in ("schedule",) and v not in ((), [], "")}
        if "edges" in link:
            link["edges"] = [dict(entry) for entry in link["edges"]]
        if link.get("schedule_order") == "path":
            link.pop("schedule_order")
        table["link"] = link
    if isinstance(table.get("load"), dict):
        table["load"] = recorded_load(table["load"])
    return table


def recorded_load(load: dict) -> dict:
    """A [load] record as sweep.json holds it; one written before the arrival process's key and its
    gamma value were renamed (orchestrator/spec/arrivals.py) reads as the same process."""
    load = {RENAMED_KEYS.get(k, k): v for k, v in load.items()}
    process = load.get("arrival_process")
    return {**load, "arrival_process": RENAMED_PROCESSES.get(process, process)} if process else load
