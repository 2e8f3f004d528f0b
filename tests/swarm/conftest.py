"""The images of the swarm tests, and a single-node swarm for them, left as it was found.

`docker swarm init --advertise-addr 127.0.0.1` if this engine is not in a swarm (and
`docker swarm leave --force` afterwards, removing the docker_gwbridge network the swarm made if
it was not there before); this node labelled dsdbed.role=verifier for the tests (the label
removed afterwards if we added it). The images come from scripts/build_images.sh and
scripts/build_shaper_image.sh (the app image built here if missing; the shaper image rebuilt on every
run, since it carries this checkout's code).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def docker(*args: str, check: bool = True, timeout_s: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def single_node_images():
    """The app image (built if missing) and the shaper image (built on every run, since it
    carries this checkout's code: an image left from an older checkout would run older services,
    e.g. an edge that did not know top_p; ~10 s cached)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (Docker)")
    try:
        docker("info", timeout_s=30)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no Docker engine: {exc}")
    if not docker("images", "-q", "dsdbed-app:latest"):
        subprocess.run(["bash", str(REPO / "scripts/build_images.sh")], check=True, timeout=1800)
    subprocess.run(["bash", str(REPO / "scripts/build_shaper_image.sh")], check=True, timeout=900)


@pytest.fixture(scope="session")
def single_node_swarm(single_node_images):
    info = json.loads(docker("info", "--format", "{{json .Swarm}}", timeout_s=30))
    gwbridge_before = docker("network", "ls", "-q", "--filter", "name=^docker_gwbridge$") != ""
    joined = info.get("LocalNodeState") != "active"
    if joined:
        docker("swarm", "init", "--advertise-addr", "127.0.0.1")
    node = docker("info", "--format", "{{.Swarm.NodeID}}")
    labels = json.loads(docker("node", "inspect", node, "--format", "{{json .Spec.Labels}}")) or {}
    labelled = labels.get("dsdbed.role") != "verifier"
    if labelled:
        docker("node", "update", "--label-add", "dsdbed.role=verifier", node)
    try:
        yield node
    finally:
        if labelled and not joined:
            docker("node", "update", "--label-rm", "dsdbed.role", node, check=False)
        if joined:
            docker("swarm", "leave", "--force", check=False)
            if not gwbridge_before:
                docker("network", "rm", "docker_gwbridge", check=False)
