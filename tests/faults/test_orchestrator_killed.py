"""The orchestrator killed mid-point (SIGKILL of a `dsdbed sweep` process), then `dsdbed
cleanup` twice, then `dsdbed sweep --resume`: the resumed sweep has the same points and rows as an
uninterrupted one, none lost or duplicated, and nothing is left behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.launchers import leftovers
from orchestrator.spec.experiment import load_experiment
from orchestrator.spec.plan import plan_points
from tests.compose.conftest import docker_engine  # noqa: F401 - the fixture
from tests.faults.faults import assert_nothing_left, check_sweep, injected, survived, whole_trace_rows
from tests.checks import every

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = """name = "killed"
launcher = "{launcher}"
modes = ["ar", "sync"]
rtt_ms = [10, 20]
gamma = [3]
clients = [1]
edges = 1
requests = 2
warmup_requests = 0
max_new_tokens = 64
prompt_tokens = 8
retries = 1
retry_backoff_s = 0.5
profile = "toy-edge-cloud"
[backend]
kind = "synthetic"
alpha = 0.7
"""
ROUNDS_A_POINT = 2 * 64  # requests x max_new_tokens: an AR point's rounds in the edge trace


def dsdbed(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
        env=env,
    )


def kill_mid_point(args: list[str], out: Path, timeout_s: float = 300, traces: bool = True) -> str:
    """Start `dsdbed sweep`, SIGKILL it once one point is done and the next has rounds in its
    edge trace (traces=False: the edge traces live in containers; then 1.5 s into the next
    point, which shapes its links first); returns the key of the point it was killed in."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            points = out / "points"
            unfinished = [p.name for p in points.glob("*") if not (p / "done.json").exists()] if points.exists() else []
            finished = list(points.glob("*/done.json")) if points.exists() else []
            if finished and unfinished:
                key = unfinished[0]
                if not traces:
                    time.sleep(1.5)
                if not traces or [
                    t
                    for t in (out / "services").glob(f"edge*/*{key}*/rounds.csv")
                    if 3 < t.read_text().count("\n") < ROUNDS_A_POINT // 2
                ]:
                    os.kill(proc.pid, signal.SIGKILL)
                    injected()
                    proc.wait(timeout=30)
                    assert not (points / key / "done.json").exists(), (
                        f"the kill landed after point {key} was recorded: not mid-point"
                    )
                    return key
            time.sleep(0.05)
        raise AssertionError("no point reached mid-run in time")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def rows_by_key(out: Path) -> pd.DataFrame:
    requests = pd.read_csv(out / "requests.csv")
    return requests.set_index(["point", "client_id", "request_index"]).sort_index()


@pytest.mark.root
def test_killed_orchestrator_cleanup_twice_then_resume_equals_an_uninterrupted_sweep(tmp_path):
    experiment_file = tmp_path / "killed.toml"
    experiment_file.write_text(EXPERIMENT.format(launcher="netns"))
    experiment = load_experiment(experiment_file)
    full, out = tmp_path / "full", tmp_path / "out"
    assert leftovers.find() == [], "this test runs `dsdbed cleanup`: start it on a clean machine"

    result = dsdbed("sweep", str(experiment_file), "--out", str(full))
    assert result.returncode == 0, result.stderr[-3000:]

    killed_in = kill_mid_point(["sweep", str(experiment_file), "--out", str(out)], out)
    time.sleep(1.0)  # the parent-death signal reaches the services
    left = leftovers.find()
    print("left by the killed orchestrator:", left)
    assert any(item.startswith("netns dsdbed-") for item in left), left

    refused = dsdbed("sweep", str(experiment_file), "--out", str(out), "--resume")
    lines = [line for line in refused.stderr.splitlines() if line.strip() and "it/s" not in line]
    assert refused.returncode != 0 and "dsdbed cleanup" in lines[-1], refused.stderr[-2000:]

    first = dsdbed("cleanup")
    assert first.returncode == 0 and "netns dsdbed-" in first.stdout, first.stdout + first.stderr
    second = dsdbed("cleanup")
    assert second.returncode == 0 and second.stdout.strip() == "nothing to clean up", second.stdout
    assert_nothing_left()

    # The killed point's live edge trace: whole rows once a cut last line is dropped.
    killed_traces = list((out / "services").glob(f"edge*/*{killed_in}*/rounds.csv"))
    killed_run_ids = {t.parent.name for t in killed_traces}
    for path in killed_traces:
        n_rows, dropped = whole_trace_rows(path)
        print(f"killed run's trace {path.parent.name}: {n_rows} whole rows, {dropped} partial dropped")
        assert n_rows >= 3 and dropped <= 1

    resumed = dsdbed("sweep", str(experiment_file), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    plan_keys = {p.key for p in plan_points(experiment)}
    done_full, done_resumed = check_sweep(experiment, full), check_sweep(experiment, out)
    assert set(done_full) == set(done_resumed) == plan_keys
    assert every(d["status"] == "ok" for d in [*done_full.values(), *done_resumed.values()])
    a, b = rows_by_key(full), rows_by_key(out)
    assert list(a.index) == list(b.index) and not b.index.duplicated().any()
    assert (a["token_ids"] == b["token_ids"]).all()
    redone = b.loc[killed_in]
    assert not set(redone["run_id"]) & killed_run_ids, "the killed point was redone from scratch"
    assert_nothing_left()
    survived()


@pytest.mark.root
@pytest.mark.docker
def test_killed_compose_sweep_leaves_containers_network_and_rules_that_cleanup_removes_once(docker_engine, tmp_path):  # noqa: F811
    experiment_file = tmp_path / "killed.toml"
    experiment_file.write_text(EXPERIMENT.format(launcher="compose"))
    out = tmp_path / "out"
    assert leftovers.find() == [], "this test runs `dsdbed cleanup`: start it on a clean machine"
    kill_mid_point(["sweep", str(experiment_file), "--out", str(out)], out, traces=False)
    time.sleep(1.0)
    left = leftovers.find()
    print("left by the killed orchestrator:", left)
    kinds = {item.split()[0] for item in left}
    assert {"container", "network", "iptables"} <= kinds, left

    first = dsdbed("cleanup")
    assert first.returncode == 0 and "container dsdbed-" in first.stdout, first.stdout + first.stderr
    second = dsdbed("cleanup")
    assert second.returncode == 0 and second.stdout.strip() == "nothing to clean up", second.stdout
    assert_nothing_left()
    assert "DSDBED" not in subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout

    resumed = dsdbed("sweep", str(experiment_file), "--out", str(out), "--resume", timeout_s=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    done = check_sweep(load_experiment(experiment_file), out)
    assert every(d["status"] == "ok" for d in done.values())
    assert_nothing_left()
    survived()
