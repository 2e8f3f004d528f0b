"""The swarm launcher on a single-node swarm: a sweep runs end to end with every edge shaping its
own link in its container, and nothing of the stack is left afterwards (Docker, root)."""

import docker as docker_sdk
import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.launchers.swarm import SwarmConfig, find_stack, stack_file
from orchestrator.launchers.swarm_config import interpolate
from orchestrator.running.run import run_experiment

pytestmark = [pytest.mark.docker, pytest.mark.root]


def test_stack_file_places_the_verifier_by_label_and_gives_edges_the_token_and_caps():
    import yaml
    from dsd.costs.profiles import get_profile
    from orchestrator.launchers.compose import COMPOSE_FILE

    config = SwarmConfig(n_edges=5, profile=get_profile("toy-edge-cloud"))
    stack = stack_file(config, yaml.safe_load(COMPOSE_FILE.read_text()), "/tmp/t")
    verifier, edge = stack["services"]["verifier"], stack["services"]["edge"]
    assert verifier["deploy"]["placement"]["constraints"] == ["node.labels.dsdbed.role == verifier"]
    assert edge["deploy"]["replicas"] == 5 and edge["deploy"]["placement"]["preferences"] == [{"spread": "node.id"}]
    assert set(edge["cap_add"]) == {"NET_ADMIN", "NET_RAW", "SYS_NICE"} and "--shape-link" in edge["command"]
    backend = config.compose_config.container_backend.to_json()
    assert f"--backend-json={backend}" in verifier["command"] and f"--backend-json={backend}" in edge["command"]
    for s in (verifier, edge):
        assert s["command"][-2 - (s is edge) :][:2] == ["--token-file", "/run/secrets/dsdbed_token"]
        assert s["deploy"]["endpoint_mode"] == "dnsrr" and not any("${" in a for a in s["command"])
    assert stack["networks"]["testbed"]["attachable"] and stack["networks"]["testbed"]["driver"] == "overlay"
    assert stack["secrets"] == {"dsdbed_token": {"file": "/tmp/t"}}
    assert interpolate("${A:-x}/${B-y}/${C}", {"A": "", "B": ""}) == "x//"


def test_swarm_sweep_runs_end_to_end_and_leaves_nothing_behind(single_node_swarm, tmp_path):
    experiment = experiment_from_dict(
        {
            "name": "swarm",
            "launcher": "swarm",
            "modes": ["ar", "sync"],
            "rtt_ms": [20],
            "gamma": [3],
            "clients": [2],
            "edges": 2,
            "requests": 2,
            "warmup_requests": 1,
            "max_new_tokens": 24,
            "prompt_tokens": 8,
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic", "alpha": 0.7},
        }
    )
    run_experiment(experiment, tmp_path / "out", resume=False)
    links = pd.read_csv(tmp_path / "out" / "links.csv")
    assert len(links) == 2 * 2 and links["shaper"].str.startswith("in-edge-").all()
    assert (links["rtt_measured_p50_ms"] - links["rtt_configured_ms"]).abs().lt(3).all(), links
    requests = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert len(requests) == 2 * 2 * 2 and requests["rtt_probe_ms"].between(19.5, 45).all(), requests
    client = docker_sdk.from_env()
    try:
        assert find_stack("dsdbed", client) == []
    finally:
        client.close()


def test_dsdbed_cleanup_removes_what_a_crashed_swarm_sweep_left(single_node_swarm, tmp_path):
    """A testbed whose orchestrator died without close(): `dsdbed cleanup` (leftovers.clean) finds
    its stack by label and removes services, control container, network and secret."""
    from dsd.costs.profiles import get_profile
    from orchestrator.launchers import leftovers
    from orchestrator.launchers.swarm import SwarmTestbed

    testbed = SwarmTestbed(SwarmConfig(n_edges=1, profile=get_profile("toy-edge-cloud"), work_dir=str(tmp_path)))
    testbed.owned = False  # as if the orchestrator had been killed here
    testbed.close()
    found = leftovers.find()
    assert {
        "service dsdbed_edge",
        "service dsdbed_verifier",
        "container dsdbed-control",
        "network dsdbed_testbed",
        "secret dsdbed_dsdbed_token",
    } <= set(found), found
    removed = leftovers.clean()
    assert "secret dsdbed_dsdbed_token" in removed and "network dsdbed_testbed" in removed
    client = docker_sdk.from_env()
    try:
        assert find_stack("dsdbed", client) == []
    finally:
        client.close()
    assert leftovers.find() == [] or all("dsdbed_" not in x for x in leftovers.find())
