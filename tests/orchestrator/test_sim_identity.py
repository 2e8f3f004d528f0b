"""The shipped sim experiments write what they wrote at the reference commit
(tests/orchestrator/sim_reference.json, made by tests/orchestrator/sim_reference.py): every
column of every merged table, and each point's own tables. A change of what a sweep records
fails here; a column added since is not compared (the reference's columns are), nor are run ids
and the host's clock and load. The two largest experiments run a sample of their points."""

import functools
import json
from pathlib import Path

import pytest

from dsd.backends.factory import load_pair
from orchestrator import cli
from orchestrator.records.sweep_folder import record_point
from orchestrator.running.run import GroupTestbeds, group_times, point_settings
from orchestrator.spec.experiment import load_experiment
from orchestrator.spec.plan import plan_points, prompts_for_point
from orchestrator.spec.workload import experiment_prompts
from tests.orchestrator.sim_reference import POINT_TABLES, REFERENCE, experiment_digest, point_digest, read_columns

pytestmark = pytest.mark.slow
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
WHOLE = (
    "adaptive-sim",
    "crossover-synthetic",
    "geography",
    "measured-rural-n8-v10",
    "measured-urban-n78-v0",
    "serving",
)
SAMPLED = {"gamma-opt": 5, "acceptance-trace": 4}  # points run, spread over the plan


@functools.cache
def reference() -> dict:
    return json.loads(REFERENCE.read_text())["experiments"]


def differences(want: dict, got: dict) -> list[str]:
    """What of the reference's tables a run's tables do not reproduce, column by column."""
    found = []
    for table, ref in want["tables"].items():
        mine = got["tables"].get(table)
        if mine is None:
            found.append(f"{table}.csv missing")
            continue
        if mine["rows"] != ref["rows"]:
            found.append(f"{table}.csv: {mine['rows']} rows, not {ref['rows']}")
        found += [
            f"{table}.csv column {column}"
            for column, value in ref["columns"].items()
            if mine["columns"].get(column) != value
        ]
    return found


@pytest.mark.parametrize("name", WHOLE)
def test_a_shipped_sim_experiment_writes_the_reference_csvs(name, tmp_path):
    out = tmp_path / name
    assert cli.main(["sweep", str(EXPERIMENTS / f"{name}.toml"), "--out", str(out)]) == 0
    want, got = reference()[name], experiment_digest(out)
    assert want["tables"] and differences(want, got) == []
    assert sorted(got["points"]) == sorted(want["points"])


@pytest.mark.parametrize("name, n_points", SAMPLED.items())
def test_the_sampled_points_of_a_large_sim_experiment_write_the_reference_csvs(name, n_points, tmp_path):
    experiment = load_experiment(EXPERIMENTS / f"{name}.toml")
    plan = plan_points(experiment)
    chosen = plan[:: len(plan) // n_points][:n_points]
    want = reference()[name]
    load = functools.cache(load_pair)
    times = group_times(experiment, plan, load, tmp_path)
    pool, settings = experiment_prompts(experiment), point_settings(experiment)
    with GroupTestbeds("sim", experiment, tmp_path / "services", times, load) as testbeds:
        for point in chosen:
            record_point(
                tmp_path,
                point,
                lambda p: testbeds.for_point(p).run_point(p, prompts_for_point(pool, experiment, p), settings),
                experiment,
            )
    wrong = [
        (point.key, table)
        for point in chosen
        for table in POINT_TABLES
        if point_digest(read_columns(tmp_path / "points" / point.key / f"{table}.csv"), want["point_columns"][table])
        != want["points"][point.key][table]
    ]
    assert len(chosen) == n_points and wrong == []
