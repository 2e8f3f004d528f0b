"""Run a suite (orchestrator/spec/suite.py): every experiment into OUT/<its name>, each analyzed
as it ends, then the sweeps side by side in OUT (orchestrator/report/side_by_side.py)."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable

from orchestrator.common.files import write_json
from orchestrator.records.sweep_folder import SweepExists, check_out_dir
from orchestrator.report.side_by_side import write_side_by_side
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.suite import SUITE_RECORD, Suite


def suite_record(suite: Suite, experiments: list[Experiment]) -> dict:
    return {
        "suite": suite.name,
        "experiments": [
            {"name": e.name, "file": str(path), "folder": e.name} for e, path in zip(experiments, suite.experiments)
        ],
    }


def check_suite_out(out: Path, suite: Suite, experiments: list[Experiment], resume: bool) -> None:
    """Refuse, before anything runs, a suite whose sweeps cannot all go into OUT: two with one
    name, OUT holding another suite or a sweep, or (without --resume) this suite already."""
    names = [e.name for e in experiments]
    if len(set(names)) != len(names):
        raise ValueError(f"suite {suite.name!r}: its experiments' names {names} repeat; each names its folder")
    out = Path(out)
    if (out / "sweep.json").exists():
        raise SweepExists(f"{out} holds a sweep, not a suite; choose another --out")
    recorded = out / SUITE_RECORD
    if recorded.exists():
        if not resume:
            raise SweepExists(f"{out} already holds a suite; pass --resume to continue it or choose another --out")
        before = json.loads(recorded.read_text())
        if [m["name"] for m in before["experiments"]] != names:
            raise SweepExists(
                f"{out} holds the suite {before['suite']!r} of other experiments; resume needs the same suite file"
            )
    for experiment in experiments:
        check_out_dir(out / experiment.name, experiment, resume)


def run_suite(
    suite: Suite, experiments: list[Experiment], out: Path, resume: bool, run_one: Callable[[Experiment, Path], None]
) -> dict:
    """run_one(experiment, folder) runs and analyzes one sweep (the CLI's sweep command)."""
    out = Path(out)
    check_suite_out(out, suite, experiments, resume)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / SUITE_RECORD, suite_record(suite, experiments))
    for experiment in experiments:
        run_one(experiment, out / experiment.name)
    return write_side_by_side(out)
