"""Shared by the fault tests: a small sweep on the synthetic backend, a trigger that fires a
fault once the first attempt is mid-run, and the checks every fault test makes."""

from __future__ import annotations

import functools
import json
import threading
import time
from pathlib import Path

import pandas as pd

from dsd.backends.factory import load_pair
from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from orchestrator.launchers import leftovers
from orchestrator.common.csv_rows import read_whole_rows
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.launchers.base import PointSettings
from orchestrator.launchers.control_api import run_point_on_edges
from orchestrator.records.sweep_folder import run_sweep
from orchestrator.spec.plan import plan_points
from orchestrator.spec.workload import make_prompts

# Figures for the closing note, printed at the end of the session (conftest.py).
TALLY = {
    "faults_injected": 0,
    "faults_survived": 0,
    "bad_inputs_tried": 0,
    "rows_expected": 0,
    "rows_lost": 0,
    "rows_duplicated": 0,
    "leftovers_after": 0,
    "fault_tests": 0,
}

BASELINE: list[str] = []  # leftovers found before the current test (conftest.py)

SMALL = {
    "name": "fault",
    "modes": ["sync"],
    "rtt_ms": [20],
    "gamma": [3],
    "clients": [1],
    "edges": 1,
    "requests": 3,
    "warmup_requests": 0,
    "max_new_tokens": 48,
    "prompt_tokens": 8,
    "retries": 1,
    "retry_backoff_s": 0.5,
    "profile": "toy-edge-cloud",
    "backend": {"kind": "synthetic", "alpha": 0.7},
}


def small_experiment(**overrides):
    return experiment_from_dict({**SMALL, **overrides})


def sweep_on(testbed, experiment, out: Path):
    """The sweep exactly as `dsdbed sweep` runs it on a network testbed (orchestrator/running/run.py)."""
    prompts = make_prompts(
        experiment.backend, experiment.warmup_requests + experiment.requests, experiment.prompt_tokens, experiment.seed
    )
    settings = PointSettings(
        warmup=experiment.warmup_requests,
        max_new_tokens=experiment.max_new_tokens,
        max_in_flight=experiment.max_in_flight,
        run_prefix="fault",
    )
    run_point = functools.partial(
        run_point_on_edges, testbed=testbed, prompts=prompts, settings=settings, timeout_s=240.0
    )
    return run_sweep(experiment, out, run_point, {"launcher": "test"}, heal=testbed.heal)


class FaultWhenMidRun:
    """Fire `fault()` once, when some edge trace under `work_dir` has at least `min_rounds` rows
    (the first attempt is then mid-run), or when `ready()` says so; bounded by `timeout_s`."""

    def __init__(self, work_dir: Path | None, fault, min_rounds: int = 5, timeout_s: float = 120.0, ready=None) -> None:
        self.fault, self.min_rounds, self.timeout_s = fault, min_rounds, timeout_s
        self.ready = ready or functools.partial(has_rounds, Path(work_dir), min_rounds)
        self.fired_at_s: float | None = None
        self.result = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="fault", daemon=True)

    def __enter__(self) -> FaultWhenMidRun:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._thread.join(timeout=self.timeout_s + 30)

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.ready():
                self.fired_at_s = time.time()
                TALLY["faults_injected"] += 1
                try:
                    self.result = self.fault()
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    self.error = exc
                return
            time.sleep(0.02)


def injected(n: int = 1) -> None:
    """Count a fault injected other than by FaultWhenMidRun (a lossy link, a killed orchestrator)."""
    TALLY["faults_injected"] += n


def survived(n: int = 1) -> None:
    """Count faults survived: called at the end of a test, after every check passed."""
    TALLY["faults_survived"] += n


def has_rounds(work_dir: Path, min_rounds: int) -> bool:
    return any(path.read_text().count("\n") - 1 >= min_rounds for path in work_dir.glob("edge*/*/rounds.csv"))


def greedy_tokens(experiment) -> dict[int, list[int]]:
    _draft, target = load_pair(experiment.backend)
    prompts = make_prompts(
        experiment.backend, experiment.warmup_requests + experiment.requests, experiment.prompt_tokens, experiment.seed
    )
    stop = StopRule(experiment.max_new_tokens, target.eos_token_id)
    return {
        i: generate_ar(target, prompts[experiment.warmup_requests + i], stop, seq_id=str(i)).tokens
        for i in range(experiment.requests)
    }


def check_sweep(experiment, out: Path) -> dict:
    """The sweep completed; no row lost or duplicated; every ok point's rows come from one
    attempt and are the target's greedy tokens. Returns the done.json of each point by key."""
    plan = plan_points(experiment)
    done = {p.key: json.loads((out / "points" / p.key / "done.json").read_text()) for p in plan}
    requests = pd.read_csv(out / "requests.csv") if (out / "requests.csv").stat().st_size else pd.DataFrame()
    rounds = pd.read_csv(out / "rounds.csv") if (out / "rounds.csv").stat().st_size else pd.DataFrame()
    expected = greedy_tokens(experiment)
    for point in plan:
        record = done[point.key]
        mine = requests[requests.point == point.key] if len(requests) else requests
        if record["status"] != "ok":
            assert len(mine) == 0, "an error point keeps no rows of a failed attempt"
            continue
        assert record["partial_rows_dropped"] == 0
        expected_rows = point.clients * experiment.requests
        TALLY["rows_expected"] += expected_rows
        TALLY["rows_lost"] += max(0, expected_rows - len(mine.drop_duplicates(["client_id", "request_index"])))
        TALLY["rows_duplicated"] += int(mine.duplicated(["client_id", "request_index"]).sum())
        assert len(mine) == expected_rows  # none lost
        assert not mine.duplicated(["client_id", "request_index"]).any()  # none twice
        assert mine.groupby("client_id")["run_id"].nunique().eq(1).all()  # one attempt
        its_rounds = rounds[rounds.point == point.key]
        assert not its_rounds.duplicated(["run_id", "request_index", "round_index"]).any()
        assert set(its_rounds.run_id) == set(mine.run_id)
        per_request = its_rounds.groupby(["run_id", "request_index"]).size()
        for row in mine.itertuples():  # every round of every request is there
            assert per_request[(row.run_id, row.request_index)] == row.rounds, row
            assert [int(t) for t in str(row.token_ids).split()] == expected[row.request_index]
    return done


def assert_nothing_left() -> None:
    assert [item for item in leftovers.find() if item not in BASELINE] == []


def whole_trace_rows(path: Path) -> tuple[int, int]:
    """(whole rows, partial rows dropped) of an edge's live trace on disk."""
    frame, dropped = read_whole_rows(path.read_bytes())
    return len(frame), dropped


def netns_testbed(tmp_path, experiment, **kwargs):
    """A netns testbed (not started) for one small experiment's services."""
    from dsd.costs.profiles import get_profile
    from orchestrator.launchers.netns import NetnsTestbed
    from orchestrator.launchers.services_config import ServicesConfig

    config = ServicesConfig(
        experiment.backend,
        get_profile(experiment.profile),
        n_edges=experiment.edges,
        work_dir=str(tmp_path / "services"),
    )
    return NetnsTestbed(config, **kwargs)
