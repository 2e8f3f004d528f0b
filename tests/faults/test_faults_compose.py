"""The verifier and an edge killed mid-point on the compose testbed (Docker): the container is
restarted by the heal, the point retried, no row lost or duplicated, nothing left behind."""

import json
import time

import pytest

from dsd.costs.profiles import get_profile
from orchestrator.common.http_client import call
from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed
from tests.compose.conftest import docker_engine  # noqa: F401 - the fixture
from tests.faults.faults import FaultWhenMidRun, assert_nothing_left, check_sweep, small_experiment, survived, sweep_on

pytestmark = [pytest.mark.docker, pytest.mark.root]


def compose_testbed(tmp_path, experiment) -> ComposeTestbed:
    return ComposeTestbed(
        ComposeConfig(
            n_edges=experiment.edges,
            backend=experiment.backend,
            profile=get_profile(experiment.profile),
            project="dsdbedfault",
            subnet="172.31.253.0/24",
            build="missing",
            verify_count=50,
            log_dir=str(tmp_path / "services"),
        )
    )


def edge_running_for(testbed, seconds: float):
    """ready(): an edge has had a run going for `seconds` (its traces live in the container)."""
    since = []

    def ready() -> bool:
        try:
            runs = json.loads(call("GET", testbed.edges[0].control_url + "/health", timeout_s=2))["runs"]
        except (OSError, RuntimeError, KeyError, IndexError):
            return False
        if runs.get("running", 0) and not since:
            since.append(time.monotonic())
        return bool(since) and time.monotonic() - since[0] >= seconds

    return ready


@pytest.mark.parametrize("victim", ["verifier", "edge"])
def test_a_container_killed_mid_point_is_restarted_and_the_point_retried(docker_engine, tmp_path, victim):  # noqa: F811
    experiment = small_experiment()
    with compose_testbed(tmp_path, experiment) as testbed:
        target = testbed.verifier_container if victim == "verifier" else testbed.edge_containers[0]
        with FaultWhenMidRun(None, lambda: target.kill(), ready=edge_running_for(testbed, 0.5)) as fault:
            sweep_on(testbed, experiment, tmp_path / "out")
        assert fault.fired_at_s and fault.error is None
        (record,) = check_sweep(experiment, tmp_path / "out").values()
    assert record["status"] == "ok" and len(record["attempts"]) == 2, record
    assert any(f"restarted container {target.name}" in h for h in record["attempts"][1]["healed"]), record
    assert_nothing_left()
    survived()
