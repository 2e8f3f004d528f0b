"""Fixtures for the compose tests: a Docker engine, started if it is installed but not running.

These tests skip only where Docker is absent: no Docker engine installed (no `dockerd`), or one
that cannot start. Where `dockerd` is installed, the engine and the compose plugin are brought up
by scripts/docker_setup.sh (root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP_TIMEOUT_S = 600


def _answers(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine and `docker compose` that answer, or a skip saying why there is none."""
    if _answers(["docker", "info"]) and _answers(["docker", "compose", "version"]):
        return
    if shutil.which("dockerd") is None:
        pytest.skip("Docker is absent (no dockerd); scripts/docker_setup.sh installs it")
    if os.geteuid() != 0:
        pytest.skip("the Docker engine is installed but not running, and starting it needs root")
    setup = subprocess.run(
        ["bash", str(REPO / "scripts" / "docker_setup.sh")], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S
    )
    if setup.returncode != 0:
        pytest.skip(f"the Docker engine cannot start here: {setup.stderr[-2000:]}")
