"""Sweeps: a plan of points, a deterministic folder per point, resume from what is on disk.

    OUT/sweep.json               the experiment, versions, git commit, host, launcher
    OUT/points/<key>/rounds.csv  one row per round      (written whole, then renamed)
    OUT/points/<key>/requests.csv one row per request
    OUT/points/<key>/links.csv   each edge's link, configured vs measured (network launchers)
    OUT/points/<key>/done.json   status ok|error, error text, timings; its presence = finished
    OUT/rounds.csv, requests.csv, links.csv, points.csv   merged when the sweep ends

A failed point records its error and the sweep goes on. An existing sweep folder is never
overwritten: pass resume=True to continue it, which skips finished points.
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from orchestrator.experiment import Experiment


@dataclass(frozen=True)
class Point:
    mode: str
    rtt_ms: float
    gamma: int
    clients: int
    repeat: int
    # Set only when the experiment sweeps them: the keys (folders) of experiments that do not
    # stay what they were, so their sweep folders still resume.
    alpha: float | None = None
    profile: str | None = None

    @property
    def key(self) -> str:
        group = f"_{self.group}" if self.group else ""
        return f"{self.mode}_rtt{self.rtt_ms:g}ms_g{self.gamma}_c{self.clients}{group}_r{self.repeat}"

    @property
    def group(self) -> str:
        """The (profile, alpha) group as a name, "" when the sweep varies neither."""
        return "_".join(([f"a{self.alpha:g}"] if self.alpha is not None else []) +
                        ([f"p{self.profile}"] if self.profile is not None else []))

    def columns(self) -> dict:
        """The point's fields as trace columns, without the dimensions the sweep does not vary."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def plan_points(experiment: Experiment) -> list[Point]:
    points = []
    profiles, alphas = experiment.profiles(), experiment.alphas()
    vary_profile, vary_alpha = len(profiles) > 1, len(alphas) > 1
    # (profile, alpha) groups outermost: on a network launcher each group needs its own services,
    # so a group's points run together on one testbed, then the next group's.
    # Repeats next: a slow drift of the machine then touches every repeat differently instead of
    # biasing one RTT; modes innermost, so modes compared at one RTT run together.
    for profile, alpha in itertools.product(profiles, alphas):
        group = {"alpha": alpha if vary_alpha else None, "profile": profile if vary_profile else None}
        for repeat, rtt_ms, gamma, clients, mode in itertools.product(
                range(experiment.repeats), experiment.rtt_ms, experiment.gamma, experiment.clients,
                experiment.modes):
            if mode == "ar" and gamma != experiment.gamma[0]:
                continue                       # AR does not depend on gamma: run it once
            points.append(Point(mode, float(rtt_ms), gamma, clients, repeat, **group))
    return points


def group_experiment(experiment: Experiment, point: Point) -> Experiment:
    """The single-profile, single-alpha experiment that runs this point."""
    return experiment.for_group(point.profile if point.profile is not None else experiment.profiles()[0],
                                point.alpha if point.alpha is not None else experiment.alphas()[0])


class SweepExists(Exception):
    pass


def prepare_out_dir(out_dir: Path, experiment: Experiment, resume: bool, facts: dict) -> None:
    sidecar = out_dir / "sweep.json"
    if sidecar.exists():
        if not resume:
            raise SweepExists(f"{out_dir} already holds a sweep; pass --resume to continue it "
                              "or choose another --out")
        recorded = json.loads(sidecar.read_text())["experiment"]
        if recorded != experiment_record(experiment):
            raise SweepExists(f"{out_dir} holds a sweep of a different experiment; "
                              "resume needs the same experiment file")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(sidecar, json.dumps({"experiment": experiment_record(experiment), **facts}, indent=2))


def run_sweep(experiment: Experiment, out_dir: Path, run_point, facts: dict, resume: bool = False,
              progress=None) -> pd.DataFrame:
    """run_point(point) -> (rounds rows, request rows[, link rows]); returns the done.json table."""
    out_dir = Path(out_dir)
    prepare_out_dir(out_dir, experiment, resume, facts)
    plan = plan_points(experiment)
    for index, point in enumerate(plan):
        folder = out_dir / "points" / point.key
        if (folder / "done.json").exists():
            if progress:
                progress(index + 1, len(plan), point, "skipped (done)")
            continue
        folder.mkdir(parents=True, exist_ok=True)
        started = time.time()
        try:
            round_rows, request_rows, *rest = run_point(point)
            link_rows = [asdict(link) if not isinstance(link, dict) else link for link in (rest[0] if rest else [])]
            status, error = "ok", ""
        except Exception as exc:          # a failed point is data; the sweep goes on
            round_rows, request_rows, link_rows = [], [], []
            status, error = "error", f"{type(exc).__name__}: {exc}"
        _write_csv(folder / "rounds.csv", round_rows, point)
        _write_csv(folder / "requests.csv", request_rows, point)
        _write_csv(folder / "links.csv", link_rows, point)
        done = {**point.columns(), "key": point.key, "status": status, "error": error,
                "wall_s": time.time() - started}
        _write_atomic(folder / "done.json", json.dumps(done))
        if progress:
            progress(index + 1, len(plan), point, status if not error else f"error: {error}")
    return merge(out_dir)


def merge(out_dir: Path) -> pd.DataFrame:
    """Concatenate every finished point's CSVs into OUT/rounds.csv and OUT/requests.csv."""
    done_rows, tables = [], {"rounds": [], "requests": [], "links": []}
    for done_path in sorted((out_dir / "points").glob("*/done.json")):
        done_rows.append(json.loads(done_path.read_text()))
        for name in tables:
            path = done_path.parent / f"{name}.csv"
            if path.exists() and path.stat().st_size > 0:
                tables[name].append(pd.read_csv(path))
    for name, frames in tables.items():
        merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        _write_atomic(out_dir / f"{name}.csv", merged.to_csv(index=False))
    return pd.DataFrame(done_rows)


def _write_csv(path: Path, rows: list[dict], point: Point) -> None:
    frame = pd.DataFrame(rows)
    if not frame.empty:
        for column, value in reversed(list(point.columns().items())):
            if column not in frame:
                frame.insert(0, column, value)
        frame.insert(0, "point", point.key)
    _write_atomic(path, frame.to_csv(index=False) if not frame.empty else "")


def _write_atomic(path: Path, text: str) -> None:
    """Write then rename, so a crash never leaves a half-written file under the real name."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def experiment_record(experiment: Experiment) -> dict:
    """The experiment as sweep.json records it. A key added later is left out while it has its
    default, so folders written before it existed still resume."""
    record = _jsonable(asdict(experiment))
    if not experiment.alpha:
        del record["alpha"]
    return record


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def host_facts() -> dict:
    """What a reader needs to trust the numbers: versions, commit, machine."""
    import torch
    import transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {
        "git_commit": commit, "git_dirty": dirty,
        "python": sys.version.split()[0], "torch": torch.__version__,
        "transformers": transformers.__version__, "platform": platform.platform(),
        "cpus": os.cpu_count(), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
