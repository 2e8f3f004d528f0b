"""The compose workflow of docs/launchers.md, as a user types it: build the image, `docker compose up -d
--scale edge=4 --wait`, `dsdbed sweep experiments/compose-quick.toml` (no extra flag: the sweep
uses the running project), look at the results, `docker compose down`. Also: a project started
with another profile than the experiment's gets one line naming the difference and the fix, and
the compose file's orchestrator service runs a sweep by itself, results on the host.

DSD_HEALTH_INTERVAL=2s (docs/launchers.md: optional) makes `up --wait` quick; nothing else differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import docker
import pandas as pd
import pytest

from netem.cleanup import find_leftovers
from netem.probe import BACKENDS
from tests.compose.host import PROJECT_LABELS, project_containers

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = "experiments/compose-quick.toml"
ENV = {**os.environ, "DSD_HEALTH_INTERVAL": "2s", "COMPOSE_BAKE": "false"}
UP_TIMEOUT_S = 600
SWEEP_TIMEOUT_S = 900


def compose(*args: str, env: dict | None = None, timeout_s: float = UP_TIMEOUT_S) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["docker", "compose", *args],
        cwd=REPO,
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, f"docker compose {' '.join(args)}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


def dsdbed(*args: str) -> subprocess.CompletedProcess:
    env = {**ENV, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=SWEEP_TIMEOUT_S,
    )


def running() -> dict[str, str]:
    """name -> id of the project's running containers."""
    client = docker.from_env()
    try:
        return {c.name: c.id for c in client.containers.list(filters={"label": PROJECT_LABELS})}
    finally:
        client.close()


@pytest.fixture(scope="module")
def image(docker_engine):
    """The workflow's first step (seconds when the image is up to date)."""
    assert project_containers() == [], "a dsdbed compose project is up already: `docker compose down` it first"
    build = subprocess.run(["bash", "scripts/build_images.sh"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr[-3000:]


@pytest.fixture
def down_afterwards(image):
    yield
    compose("--profile", "sweep", "down", "--remove-orphans", "--timeout", "10")
    assert project_containers() == []


def test_up_sweep_look_down(down_afterwards, tmp_path):
    compose("up", "-d", "--scale", "edge=4", "--wait")
    before = running()
    assert len(before) == 5
    out = tmp_path / "compose-quick"
    result = dsdbed("sweep", EXPERIMENT, "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]

    points = pd.read_csv(out / "points.csv")
    assert len(points) == 4
    assert points["shaper"].isin(BACKENDS).all(), points["shaper"].tolist()  # every row: a real link shaper
    assert (points["per_token_ms_p50"] > 0).all()
    assert (out / "report.html").is_file()
    facts = json.loads((out / "sweep.json").read_text())
    assert facts["launcher"] == "compose" and facts["testbed"]["adopted"] is True

    assert running() == before  # left up as found: the same containers, still running
    assert find_leftovers() == []  # and unshaped: no rules, daemons or qdiscs of ours


def test_a_project_with_another_profile_gets_one_line_naming_it_and_the_fix(down_afterwards, tmp_path):
    compose("up", "-d", "--scale", "edge=4", env={"DSD_PROFILE": "cpu2-default-pair"})
    out = tmp_path / "out"
    result = dsdbed("sweep", EXPERIMENT, "--out", str(out))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and not out.exists()
    assert "profile: running 'cpu2-default-pair' (dsdbed-verifier-1), the experiment's 'toy-edge-cloud'" in lines[0]
    assert "fix: `DSD_PROFILE=toy-edge-cloud docker compose up -d --scale edge=4 --wait`" in lines[0]

    debug = dsdbed("--debug", "sweep", EXPERIMENT, "--out", str(out))
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ComposeError" in debug.stderr
    assert len(running()) == 5  # refused, and the project left alone


def test_the_orchestrator_service_runs_a_sweep_with_results_on_the_host(down_afterwards, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    result = compose(
        "--profile",
        "sweep",
        "up",
        "--scale",
        "edge=4",
        "--exit-code-from",
        "orchestrator",
        env={"DSD_EXPERIMENT": "compose-quick", "DSD_RESULTS_DIR": str(results)},
        timeout_s=UP_TIMEOUT_S + SWEEP_TIMEOUT_S,
    )
    [folder] = list(results.glob("compose-quick-*"))
    points = pd.read_csv(folder / "points.csv")
    assert len(points) == 4 and points["shaper"].isin(BACKENDS).all(), points["shaper"].tolist()
    logs = compose("--profile", "sweep", "logs", "--no-color", "orchestrator").stdout
    assert "point 4/4" in logs, result.stdout[-3000:]
    assert find_leftovers() == []
