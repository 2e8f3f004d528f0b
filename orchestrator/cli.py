"""dsdbed: the command line of the testbed."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from orchestrator.analysis import paper
from orchestrator.spec.experiment import LAUNCHERS, load_experiment
from orchestrator.launchers.base import LauncherError
from orchestrator.launchers.leftovers import LeftoversFound
from orchestrator.records.sweep_folder import SweepExists
from orchestrator.spec.plan import plan_points
from orchestrator.spec.suite import SUITE_RECORD, is_suite_file, load_suite

REPO = Path(__file__).resolve().parents[1]


class _Parser(argparse.ArgumentParser):
    """Bad arguments get one line naming the problem (argparse's usage block buries it); no
    abbreviated options (`--resum` must not quietly mean --resume)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "build-pair":
        # REMAINDER does not take options before its first word: `build-pair --out X` would be
        # refused as unknown --out. Everything after the command is the build's.
        args.rest = unknown + args.rest
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return _dispatch(args)
    except (ValueError, FileNotFoundError, SweepExists, LeftoversFound, LauncherError) as error:
        if args.debug:
            raise
        print(f"dsdbed: error: {error_line(error)}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dsdbed", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error, not one line")
    # --debug also after the command (`dsdbed sweep X --debug`); SUPPRESS keeps the one before it.
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kwargs)

    sweep = add("sweep", help="run an experiment file's grid, or a suite file's experiments one after another")
    sweep.add_argument("experiment", type=Path)
    _sweep_options(sweep)

    crossover = add(
        "crossover",
        help="the main job: experiments/main.toml (the layer draft's and the feature "
        "draft's crossover sweeps, side by side)",
    )
    _sweep_options(crossover)

    analyze = add(
        "analyze",
        help="fit, crossovers and plots from a sweep folder (or a suite's: each sweep's, then the side-by-side files)",
    )
    analyze.add_argument("out", type=Path)

    report = add("report", help="one self-contained HTML (or Markdown) report of a sweep folder")
    report.add_argument("out", type=Path)
    report.add_argument("--format", choices=("html", "md"), default="html")

    build = add("build-pair", help="build the default offline model pair")
    build.add_argument("rest", nargs=argparse.REMAINDER)

    profile = add("measure-profile", help="measure a model pair's compute times here; prints a profiles.toml entry")
    profile.add_argument("--pair", default=str(REPO / "models" / "default-pair"))
    profile.add_argument("--name", default="cpu-default-pair")
    profile.add_argument("--threads", type=int, default=1)

    add(
        "cleanup",
        help="remove leftovers of crashed runs (namespaces, rules, qdiscs, daemons, "
        "service processes, containers, networks)",
    )
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "crossover":
        args.experiment = REPO / "experiments" / "main.toml"
        return _run_sweep(args)
    if args.command == "sweep":
        return _run_sweep(args)
    if args.command == "analyze":
        from orchestrator.open_loop.commands import is_serving_sweep, reanalyze_serving

        if is_serving_sweep(args.out):  # an open-loop sweep: orchestrator/open_loop/commands.py
            return reanalyze_serving(args.out)
        if (Path(args.out) / SUITE_RECORD).exists():
            return _analyze_suite(args.out)
        return _analyze(args.out)
    if args.command == "report":
        from orchestrator.report.html import write_report

        print(f"report: {write_report(args.out, args.format)}")
        return 0
    if args.command == "build-pair":
        from pairs import build

        return build.main(args.rest)
    if args.command == "measure-profile":
        from orchestrator.running.measure_profile import measure_profile_toml

        print(measure_profile_toml(args.pair, args.name, args.threads))
        return 0
    if args.command == "cleanup":
        from orchestrator.launchers import leftovers
        from netem.cleanup import live_runs

        removed = leftovers.clean()
        print("\n".join(removed) if removed else "nothing to clean up")
        for run in live_runs():
            print(f"left alone, still running: {run}")
        return 0
    return 0


def error_line(error: BaseException) -> str:
    """An error as one line: its first line, and how to see the rest (a compose failure appends
    the services' last log lines)."""
    first, *rest = str(error).strip().splitlines() or [type(error).__name__]
    return first + (f" ({len(rest)} more lines: rerun with --debug)" if rest else "")


def _sweep_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=False, help="result folder (default results/NAME)")
    parser.add_argument("--resume", action="store_true", help="continue a sweep in --out")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument("--launcher", choices=LAUNCHERS, help="run on this launcher instead of the file's")
    parser.add_argument(
        "--repeat-until-ci",
        type=int,
        metavar="POINTS",
        help="after the grid, spend up to POINTS extra points on repeats of the least certain "
        "crossover's cells (the file's adaptive_budget_points); with --resume, also on a "
        "finished sweep",
    )
    parser.add_argument(
        "--profiles",
        type=Path,
        metavar="FILE",
        help="hardware profiles in the format of dsd/costs/profiles.toml (every number with its source), "
        "usable by name beside the packaged ones and the file's [profiles.NAME]",
    )


def _run_sweep(args) -> int:
    if not Path(args.experiment).is_file():
        raise FileNotFoundError(f"experiment file {str(args.experiment)!r} does not exist or is not a file")
    if is_suite_file(args.experiment):
        return _sweep_suite(args)
    experiment = _experiment_with_overrides(args.experiment, args)
    out = args.out or REPO / "results" / experiment.name
    if experiment.load is not None:  # open-loop arrivals: orchestrator/open_loop/sweep.py
        from orchestrator.open_loop.commands import run_serving_cli

        return run_serving_cli(experiment, out, args.resume, args.dry_run)
    if args.dry_run:
        return _print_sweep_plan(experiment, out)
    from orchestrator.running.run import run_experiment  # torch: only a sweep that runs needs it

    run_experiment(experiment, out, resume=args.resume)
    return _analyze(out)


def _experiment_with_overrides(path: Path, args, suite: str = ""):
    """An experiment file with the command line's overrides. In a suite, a member on the sim
    launcher is emulated compute on virtual time (the main job's map of client counts no machine
    here holds): --launcher moves the measured members, not the emulated ones."""
    experiment = load_experiment(path, args.profiles)
    if args.launcher and suite and experiment.launcher == "sim" and args.launcher != "sim":
        print(
            f"suite {suite}: {experiment.name} stays on the sim launcher (emulated compute); "
            f"--launcher {args.launcher} applies to the others",
            file=sys.stderr,
        )
    elif args.launcher:
        experiment = dataclasses.replace(experiment, launcher=args.launcher)
    if args.repeat_until_ci is not None:
        experiment = dataclasses.replace(experiment, adaptive_budget_points=args.repeat_until_ci)
    return experiment


def _print_sweep_plan(experiment, out: Path) -> int:
    from orchestrator.spec.plan import is_calibration

    plan = plan_points(experiment)
    print(f"{len(plan)} points, launcher {experiment.launcher}, into {out}:")
    for point in plan:
        print(f"  {point.key}" + ("  (calibration: predicts the rest)" if is_calibration(point, experiment) else ""))
    return 0


def _sweep_suite(args) -> int:
    """A suite file: each experiment into OUT/<its name>, then OUT's side-by-side summary."""
    from orchestrator.running.run import run_experiment
    from orchestrator.running.suite import check_suite_out, run_suite

    suite = load_suite(args.experiment)
    experiments = [_experiment_with_overrides(path, args, suite=suite.name) for path in suite.experiments]
    for experiment in experiments:
        if experiment.load is not None:
            raise ValueError(
                f"suite {suite.name!r}: {experiment.name} has a [load] table; a suite runs "
                "closed-loop sweeps (run an open-loop experiment on its own)"
            )
    out = args.out or REPO / "results" / suite.name
    if args.dry_run:
        check_suite_out(out, suite, experiments, args.resume)
        for experiment in experiments:
            _print_sweep_plan(experiment, Path(out) / experiment.name)
        return 0

    def run_one(experiment, folder: Path) -> None:
        run_experiment(experiment, folder, resume=args.resume)
        _analyze(folder)

    _print_side_by_side(run_suite(suite, experiments, out, args.resume, run_one), out)
    return 0


def _analyze_suite(out: Path) -> int:
    from orchestrator.records.suite_folder import suite_members
    from orchestrator.report.side_by_side import write_side_by_side

    for member in suite_members(out)[1]:
        if (Path(out) / member["folder"] / "sweep.json").exists():
            _analyze(Path(out) / member["folder"])
    _print_side_by_side(write_side_by_side(out), out)
    return 0


def _print_side_by_side(result: dict, out: Path) -> None:
    print(f"suite {result['suite']}, side by side:")
    for run in result["runs"]:
        crossings = "; ".join(
            f"{name} {c.get('text') or _ms(c.get('measured_rtt_ms', math.nan))}"
            for name, c in run["crossovers"].items()
        )
        print(
            f"  {run['experiment']} ({run['pair']}, {run['draft']}): alpha {run['alpha_measured']:.3f}; "
            f"{crossings or 'no crossover'}"
        )
    print(f"results: {out}/summary.json, {out}/latency_vs_rtt.png; report: {out}/report.html")


def out_of_sample_line(oos: dict) -> str:
    """The CLI's line on the out-of-sample error ('' when there is no prediction at all)."""
    if not oos.get("available"):
        return ""
    if not oos.get("cells"):
        return (
            "out-of-sample per-token latency error: no cell to judge (every one-client point is a "
            "calibration point, and only one-client points are predicted)"
        )
    return (
        f"out-of-sample per-token latency error: p50 {oos['latency_err_p50_pct']:.2f}%, "
        f"max {oos['latency_err_max_pct']:.2f}% over {oos['cells']} cells (calibration points excluded); "
        f"the server's compute per pass moved p50 {oos.get('compute_drift_p50_pct', math.nan):.1f}%, "
        f"max {oos.get('compute_drift_max_pct', math.nan):.1f}% from the calibration"
    )


def _analyze(out: Path) -> int:
    from orchestrator.report.analyze import analyze_sweep

    summary = analyze_sweep(out)
    for group in summary["groups"]:
        label = ", ".join(f"{k}={group[k]}" for k in summary["group_keys"])
        for name, values in group["crossovers"].items():
            measured, predicted = values["measured_rtt_ms"], values["predicted_rtt_ms"]
            oos = values.get("predicted_rtt_ms_oos", math.nan)
            print(
                f"{name}{' (' + label + ')' if label else ''}: "
                f"measured {values.get('text') or _ms(measured)}, predicted before measuring {_ms(oos)}, "
                f"in-sample fit {_ms(predicted)}"
            )
    line = out_of_sample_line(summary.get("out_of_sample", {}))
    if line:
        print(line)
    for row in summary.get("capacity", []):
        print(
            f"capacity {row['mode']}/{row['reference']} at {row['rate_tok_s_per_client']:.1f} tok/s per client: "
            f"measured {row['ratio_measured']:.2f} [{paper.ratio_interval(row)}], "
            f"predicted {row['ratio_predicted']:.2f}"
        )
    for row in summary.get("gamma_opt", {}).get("rows", []):
        print(
            f"optimal gamma {row['mode']} at {row['rtt_ms']:g} ms: measured {row['gamma_best']} "
            f"(bootstrap set {row['gamma_set']}), closed form on the grid {row['gamma_best_predicted_grid_oos']:g} "
            f"({'in sample: calibration points' if row.get('predicted_from_calibration_points') else 'out of sample'}), "
            f"over 1..64 {row['gamma_model_oos']:g}; penalty {row['penalty_pct']:.1f}%"
        )
    files = ["points.csv", "summary.json", *(["gamma_opt.csv"] if summary.get("gamma_opt") else []), *summary["plots"]]
    print("results: " + ", ".join(f"{out}/{name}" for name in files))
    from orchestrator.report.html import write_report

    print(f"report: {write_report(out)}")  # rewritten, so it never shows an older analysis
    return 0


def _ms(value: float) -> str:
    return (
        f"{value:.1f} ms"
        if math.isfinite(value)
        else ("never wins" if value < 0 else "wins over the whole grid")
        if not math.isnan(value)
        else "not measured"
    )


if __name__ == "__main__":
    raise SystemExit(main())
