"""The sweep folder: a deterministic folder per point of the plan (orchestrator/spec/plan.py),
resume from what is on disk.

    OUT/sweep.json               the experiment, versions, git commit, host, launcher
    OUT/points/<key>/rounds.csv  one row per round      (written whole, then renamed)
    OUT/points/<key>/requests.csv one row per request
    OUT/points/<key>/links.csv   each edge's link, configured vs measured (network launchers)
    OUT/points/<key>/done.json   status ok|error, error text, attempts, timings; its presence = finished
    OUT/rounds.csv, requests.csv, links.csv, points.csv   merged when the sweep ends

A failed point is retried (experiment.retries, after heal() repaired the testbed); if every
attempt fails it records its error and the sweep goes on. done.json lists every attempt and its
error; the CSVs hold the rows of the attempt that succeeded, never a mix. An existing sweep folder
is never overwritten: pass resume=True to continue it, which skips finished points and redoes a
folder without done.json from scratch.
"""

from __future__ import annotations

import json
import time
from dataclasses import MISSING, asdict, fields
from pathlib import Path

import pandas as pd

from dsd.backends.factory import BACKEND_CONFIGS
from orchestrator.common import cpus
from orchestrator.common.csv_rows import read_whole_rows
from orchestrator.common.files import jsonable, write_atomic, write_json
from orchestrator.links import keys as link_keys
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.plan import Point, calibration_unit, is_calibration, plan_points


class SweepExists(Exception):
    pass


def check_out_dir(out_dir: Path, experiment: Experiment, resume: bool) -> bool:
    """Whether out_dir holds this experiment's sweep to continue; raise SweepExists if it holds
    one that must not be touched. Only reads: called before anything starts."""
    sidecar = Path(out_dir) / "sweep.json"
    if not sidecar.exists():
        if Path(out_dir).exists() and not Path(out_dir).is_dir():
            raise SweepExists(f"--out {out_dir} is a file, not a folder")
        return False
    if not resume:
        raise SweepExists(f"{out_dir} already holds a sweep; pass --resume to continue it or choose another --out")
    recorded = json.loads(sidecar.read_text())["experiment"]
    if _planned_part(_current_backend_keys(recorded)) != _planned_part(experiment_record(experiment)):
        raise SweepExists(f"{out_dir} holds a sweep of a different experiment; resume needs the same experiment file")
    return True


def _planned_part(record: dict) -> dict:
    """What fixes the planned points: a resumed sweep may spend another budget on repeats until
    CI, which only adds points after the plan."""
    return {
        k: v
        for k, v in record.items()
        if k not in ("adaptive_budget_points", "adaptive_ci_target_pct", "adaptive_crossovers")
    }


def prepare_out_dir(out_dir: Path, experiment: Experiment, resume: bool, facts: dict) -> None:
    if check_out_dir(out_dir, experiment, resume):
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "sweep.json", {"experiment": experiment_record(experiment), **facts})


def add_facts(out_dir: Path, facts: dict) -> None:
    """Add facts known only once the run has started (e.g. the testbed's) to sweep.json."""
    path = Path(out_dir) / "sweep.json"
    write_json(path, {**json.loads(path.read_text()), **facts})


def point_done(out_dir: Path, point: Point) -> bool:
    """The point's folder holds a finished result (its done.json is written last)."""
    return (Path(out_dir) / "points" / point.key / "done.json").exists()


def run_sweep(
    experiment: Experiment,
    out_dir: Path,
    run_point,
    facts: dict,
    resume: bool = False,
    progress=None,
    heal=None,
    predict=None,
) -> pd.DataFrame:
    """run_point(point) -> (rounds rows, request rows[, link rows[, facts dict]]); returns the
    done.json table. heal() -> list of what it repaired, called before each retry.
    predict(unit's points) is called once per calibration unit (calibration_unit), after its
    calibration points and before any other of its points runs (also on resume: it keeps what
    it wrote)."""
    out_dir = Path(out_dir)
    prepare_out_dir(out_dir, experiment, resume, facts)
    plan = plan_points(experiment)
    predicted_units = set()
    for index, point in enumerate(plan):
        unit = calibration_unit(point, experiment)
        if predict is not None and unit not in predicted_units and not is_calibration(point, experiment):
            predict([p for p in plan if calibration_unit(p, experiment) == unit])
            predicted_units.add(unit)
        if point_done(out_dir, point):
            if progress:
                progress(index + 1, len(plan), point, "skipped (done)")
            continue
        done = record_point(out_dir, point, run_point, experiment, heal)
        if progress:
            progress(index + 1, len(plan), point, done["status"] if not done["error"] else f"error: {done['error']}")
    return merge(out_dir)


def record_point(out_dir: Path, point: Point, run_point, experiment: Experiment, heal=None) -> dict:
    """Run one point (with retries) into its folder; done.json last. Returns its done record."""
    folder = out_dir / "points" / point.key
    clear_unfinished(folder)
    before = cpus.CpuSample.now()
    done = run_point_with_retries(point, run_point, experiment.retries, experiment.retry_backoff_s, heal)
    done["cpu"] = cpus.conditions(before, cpus.CpuSample.now())  # contention while it ran
    result = done.pop("result")
    _write_csv(folder / "rounds.csv", result[0], point)
    _write_csv(folder / "requests.csv", result[1], point)
    _write_csv(folder / "links.csv", result[2], point)
    write_json(folder / "done.json", {**point.columns(), "key": point.key, **done}, indent=None)
    return done


def run_point_with_retries(point: Point, run_point, retries: int, backoff_s: float, heal=None) -> dict:
    """Run a point up to 1 + retries times; keep only the rows of the attempt that succeeded, so
    a result never mixes attempts. Returns the done.json fields and the rows under "result"."""
    started = time.time()
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)) + f".{int(started % 1 * 1e6):06d}Z"
    attempts = []
    result, extra = ([], [], []), {}
    for attempt in range(1, retries + 2):
        record = {"attempt": attempt, "healed": []}
        if attempt > 1:
            time.sleep(backoff_s * (attempt - 1))
            if heal is not None:
                try:
                    record["healed"] = heal()
                except Exception as exc:  # a testbed that cannot heal fails this attempt too
                    attempts.append(
                        {
                            **record,
                            "status": "error",
                            "wall_s": 0.0,
                            "error": f"healing failed: {type(exc).__name__}: {exc}",
                        }
                    )
                    continue
        t0 = time.time()
        try:
            rounds, requests, *rest = run_point(point)
            links = [asdict(link) if not isinstance(link, dict) else link for link in (rest[0] if rest else [])]
            extra = rest[1] if len(rest) > 1 else {}
            attempts.append({**record, "status": "ok", "error": "", "wall_s": time.time() - t0})
            result = (rounds, requests, links)
            break
        except Exception as exc:  # a failed point is data; the sweep goes on
            attempts.append(
                {**record, "status": "error", "error": f"{type(exc).__name__}: {exc}", "wall_s": time.time() - t0}
            )
            extra = {}
    last = attempts[-1]
    healed_after = []
    if last["status"] != "ok" and heal is not None:  # leave a working testbed to the next point
        try:
            healed_after = heal()
        except Exception as exc:  # noqa: BLE001 - the next point's attempts will say more
            healed_after = [f"healing failed: {type(exc).__name__}: {exc}"]
    return {
        "status": last["status"],
        "error": last["error"],
        "attempts": attempts,
        "healed_after": healed_after,
        "wall_s": time.time() - started,
        "started_s": started,
        "started_utc": started_utc,
        "finished_s": time.time(),
        **extra,
        "result": result,
    }


def clear_unfinished(folder: Path) -> None:
    """A point folder without done.json is redone from scratch: whatever a killed attempt left
    there (CSVs, .tmp files) goes first, so nothing of it can reach the merged tables."""
    if folder.exists():
        for path in folder.iterdir():
            if path.is_file():
                path.unlink()
    folder.mkdir(parents=True, exist_ok=True)


def merge(out_dir: Path) -> pd.DataFrame:
    """Concatenate every finished point's CSVs into OUT/rounds.csv and OUT/requests.csv."""
    done_rows, tables = [], {"rounds": [], "requests": [], "links": []}
    for done_path in sorted((out_dir / "points").glob("*/done.json")):
        done_rows.append(json.loads(done_path.read_text()))
        for name in tables:
            path = done_path.parent / f"{name}.csv"
            if path.exists() and path.stat().st_size > 0:
                frame, dropped = read_whole_rows(path.read_bytes())
                if dropped:  # written atomically, so this means damage on disk
                    raise ValueError(f"{path}: {dropped} partial row(s); delete its done.json and resume")
                tables[name].append(frame)
    for name, frames in tables.items():
        merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        write_atomic(out_dir / f"{name}.csv", merged.to_csv(index=False))
    return pd.DataFrame(done_rows)


def _write_csv(path: Path, rows: list[dict], point: Point) -> None:
    frame = pd.DataFrame(rows)
    if not frame.empty:
        for column, value in reversed(list(point.columns().items())):
            if column not in frame:
                frame.insert(0, column, value)
        frame.insert(0, "point", point.key)
    write_atomic(path, frame.to_csv(index=False) if not frame.empty else "")


def experiment_record(experiment: Experiment) -> dict:
    """The experiment as sweep.json records it. A key added later is left out while it has its
    default, so folders written before it existed still resume."""
    record = jsonable(asdict(experiment))
    record["backend"] = jsonable(experiment.backend.to_dict())  # kind and its own fields
    defaults = {f.name: f.default if f.default_factory is MISSING else f.default_factory() for f in fields(Experiment)}
    for key in (
        "alpha",
        "retries",
        "retry_backoff_s",
        *link_keys.LINK_KEYS,
        "delay_down_ms",
        "link",
        "cpu_pinning",
        "adaptive_budget_points",
        "adaptive_ci_target_pct",
        "adaptive_crossovers",
        "sampling",
        "workload",
        "hardware_profiles",
        "external",
        "controller",
        "gamma_max",
        "controller_modes",
        "load",
        "slo",
    ):
        if getattr(experiment, key) == defaults[key]:
            del record[key]
    if isinstance(record.get("link"), dict) and record["link"].get("schedule_order") == "path":
        del record["link"]["schedule_order"]  # likewise, in [link]
    for key in ("acceptance_trace", "acceptance_rounds"):  # likewise, in [backend]
        if not record["backend"].get(key, "x"):
            del record["backend"][key]
    return record


def _current_backend_keys(record: dict) -> dict:
    """An older record lists every kind's backend fields (one flat config then): keep the kind's own."""
    backend = record.get("backend")
    if not isinstance(backend, dict) or backend.get("kind") not in BACKEND_CONFIGS:
        return record
    own = {f.name for f in fields(BACKEND_CONFIGS[backend["kind"]])} | {"kind"}
    return {**record, "backend": {k: v for k, v in backend.items() if k in own}}
