"""The swarm launcher on a three-node swarm (orchestrator/launchers/swarm_local.py: each node a
Docker-in-Docker container with its own engine, the manager's API given to the launcher as a
real host's would be): a node without the image is named before anything deploys; the image is
copied to the nodes by ID; the verifier lands on the labelled node and the edges on the others,
each shaping its own link over the overlay; a node lost in the middle of a point is survived by a
retry on the nodes left, a resumed sweep redoes only the unfinished point, no row is lost or
doubled, and nothing of the stack is left on any node (Docker, root; about 4 minutes)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import docker as docker_sdk
import pandas as pd
import pytest

from dsd.costs.profiles import get_profile
from orchestrator.launchers import control_api
from orchestrator.launchers.swarm import SwarmConfig, SwarmError, SwarmTestbed, find_stack
from orchestrator.launchers.swarm_local import LocalSwarm, LocalSwarmConfig
from orchestrator.running.run import run_experiment
from orchestrator.spec.experiment import experiment_from_dict
from tests.swarm.conftest import REPO, docker

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]

NODES = ["dsdbed-node-0", "dsdbed-node-1", "dsdbed-node-2"]  # manager; verifier; lost mid-sweep
EDGES, CLIENTS, REQUESTS = 4, 4, 3


@pytest.fixture(scope="module")
def three_nodes(swarm_images):
    with LocalSwarm(LocalSwarmConfig(n_nodes=3)) as swarm:
        yield swarm
    assert docker("ps", "-aq", "--filter", "label=dsdbed.testbed=dsdbed-node") == ""
    assert docker("network", "ls", "-q", "--filter", "label=dsdbed.testbed") == ""


@pytest.fixture(scope="module")
def swarm_images(single_node_images):
    subprocess.run(["bash", str(REPO / "scripts/build_node_image.sh")], check=True, timeout=600)


def test_a_node_without_the_image_is_named_before_the_stack_deploys(three_nodes, tmp_path):
    config = SwarmConfig(
        n_edges=2, profile=get_profile("toy-edge-cloud"), docker_host=three_nodes.manager_url, work_dir=str(tmp_path)
    )
    with pytest.raises(SwarmError, match="is not on node") as caught:
        SwarmTestbed(config)
    assert all(node in str(caught.value) for node in NODES), caught.value
    assert find_stack("dsdbed", three_nodes.engines[0]) == []


def test_a_sweep_across_nodes_survives_a_lost_node_and_resumes_without_lost_or_doubled_rows(
    three_nodes, tmp_path, monkeypatch
):
    monkeypatch.setenv("DSD_SWARM_MANAGER", three_nodes.manager_url)
    monkeypatch.setenv("DSD_SWARM_NODES", " ".join(three_nodes.node_urls))
    lose_node_during_the_second_point(monkeypatch, three_nodes, node=2)
    experiment = experiment_from_dict(
        {
            "name": "swarm3",
            "launcher": "swarm",
            "modes": ["sync"],
            "rtt_ms": [20, 40],
            "gamma": [3],
            "clients": [CLIENTS],
            "edges": EDGES,
            "requests": REQUESTS,
            "warmup_requests": 1,
            "max_new_tokens": 48,
            "prompt_tokens": 8,
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic", "alpha": 0.7},
            "retries": 2,
            "retry_backoff_s": 1.0,
        }
    )
    out = tmp_path / "out"
    run_experiment(experiment, out, resume=False)

    sweep = json.loads((out / "sweep.json").read_text())["testbed"]
    assert sweep["verifier_node"] == "dsdbed-node-1" and sweep["image_id"].startswith("sha256:"), sweep
    links = pd.read_csv(out / "links.csv")
    assert len(links) == 2 * EDGES and links["shaper"].str.startswith("in-edge-").all(), links
    assert links["rtt_base_ms"].between(0.01, 5).all(), links["rtt_base_ms"]
    assert (links["rtt_measured_p50_ms"] - links["rtt_configured_ms"]).abs().lt(3).all(), links
    done = {d["key"]: d for d in map(json.loads, map(Path.read_text, sorted((out / "points").glob("*/done.json"))))}
    assert [d["status"] for d in done.values()] == ["ok", "ok"], done
    clean, faulted = sorted(done.values(), key=lambda d: len(d["attempts"]))
    assert len(clean["attempts"]) == 1 and faulted["attempts"][0]["status"] == "error", done
    assert any("nodes down: dsdbed-node-2" in h for h in faulted["attempts"][1]["healed"]), faulted
    # The first point ran on the manager and the worker; its retry, node 2 gone, on the manager.
    nodes = {key: set(pd.read_csv(out / "points" / key / "links.csv")["node"]) for key in done}
    assert nodes[clean["key"]] == {"dsdbed-node-0", "dsdbed-node-2"}, nodes
    assert nodes[faulted["key"]] == {"dsdbed-node-0"}, nodes
    assert_rows_exact(out)
    assert_nothing_of_the_stack_left(three_nodes, alive=[0, 1])

    # A sweep killed in its last point: the point's done.json never written. Resume redoes that
    # point only, and the rows are again exactly one set per point.
    last = sorted((out / "points").glob("*/done.json"))[-1]
    last.unlink()
    run_experiment(experiment, out, resume=True)
    assert_rows_exact(out)
    assert_nothing_of_the_stack_left(three_nodes, alive=[0, 1])


def lose_node_during_the_second_point(monkeypatch, swarm: LocalSwarm, node: int) -> None:
    """Kill a node's container 0.5 s into the second point's runs (they take a few seconds)."""
    original = control_api._run_clients
    calls = []

    def run_clients(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            threading.Timer(0.5, swarm.kill_node, args=(node,)).start()
        return original(*args, **kwargs)

    monkeypatch.setattr(control_api, "_run_clients", run_clients)


def assert_rows_exact(out) -> None:
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 2 * CLIENTS * REQUESTS, requests
    assert not requests.duplicated(subset=["rtt_ms", "client_id", "request_index"]).any(), requests


def assert_nothing_of_the_stack_left(swarm: LocalSwarm, alive: list[int]) -> None:
    for i in alive:
        engine = docker_sdk.DockerClient(base_url=swarm.url(i), timeout=30)
        try:
            assert find_stack("dsdbed", engine, services=i == 0) == [], swarm.config.node_name(i)
        finally:
            engine.close()
