"""A launcher that fails reaches the user as one line through the CLI's error path, never a
traceback; `--debug` keeps the traceback. No Docker and no root needed: a loopback service that
exits while starting, and the compose launcher with no Docker engine to talk to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsd.backends.factory import SyntheticBackendConfig
from dsd.costs.profiles import get_profile
from orchestrator.cli import error_line
from orchestrator.launchers.base import LauncherError
from orchestrator.launchers.loopback import LoopbackTestbed
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.running.run import launcher_errors

REPO = Path(__file__).resolve().parents[2]


def test_a_loopback_service_that_exits_while_starting_is_one_launcher_error(tmp_path):
    config = ServicesConfig(
        SyntheticBackendConfig(),
        get_profile("toy-edge-cloud"),
        work_dir=str(tmp_path),
        extra_verifier_args=("--no-such-flag",),
    )
    with pytest.raises(LauncherError) as info:
        with launcher_errors("loopback", "to start"):
            LoopbackTestbed(config)
    assert "the loopback launcher failed to start: RuntimeError: verifier exited with code 2" in str(info.value)
    line = error_line(info.value)
    assert "\n" not in line and line.endswith("more lines: rerun with --debug)")  # the log tail is left out
    assert isinstance(info.value.__cause__, RuntimeError)  # and kept for --debug


def test_bad_config_passes_through_as_itself():
    with pytest.raises(ValueError, match="n_edges"):
        with launcher_errors("loopback", "to start"):
            ServicesConfig(SyntheticBackendConfig(), n_edges=0)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "DOCKER_HOST": "unix:///nonexistent/docker.sock",
    }
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


def test_a_compose_sweep_without_a_docker_engine_gets_one_line(tmp_path):
    out = tmp_path / "out"
    result = run_cli("sweep", "experiments/compose-quick.toml", "--out", str(out))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("dsdbed: error: the Docker engine does not answer") and "docker_setup.sh" in lines[0]
    assert "Traceback" not in result.stderr and not out.exists()

    debug = run_cli("sweep", "experiments/compose-quick.toml", "--out", str(out), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "ComposeError" in debug.stderr
