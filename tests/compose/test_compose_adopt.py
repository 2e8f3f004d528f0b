"""A project that is already up is refused unless adopted; an adopted one is used as it is and
left up on close, with the cpusets it had before a sweep pinned it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from dsd.costs.profiles import get_profile
from orchestrator.common import cpus
from orchestrator.common.http_client import call
from orchestrator.launchers.compose import ComposeConfig, ComposeError, ComposeTestbed, cleanup_project

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]

PROJECT = "dsdbedadopt"
CONFIG = ComposeConfig(
    n_edges=1, profile=get_profile("toy-edge-cloud"), project=PROJECT, subnet="172.31.251.0/24", verify_count=0
)


@pytest.fixture
def running_project(docker_engine):
    owner = ComposeTestbed(CONFIG)  # brought up (and so owned) by another launcher
    try:
        yield owner
    finally:
        owner.close()
        cleanup_project(PROJECT)


def test_a_running_project_is_refused_unless_adopted_and_an_adopted_one_is_left_up(running_project):
    with pytest.raises(ComposeError, match="adopt=True"):
        ComposeTestbed(CONFIG)
    before = {c.name: c.attrs["HostConfig"].get("CpusetCpus") or "" for c in running_project.project_containers()}
    with ComposeTestbed(dataclasses.replace(CONFIG, adopt=True)) as adopted:
        assert not adopted.owned
        assert [e.name for e in adopted.edges] == [e.name for e in running_project.edges]
        assert json.loads(call("GET", adopted.edges[0].control_url + "/health"))["role"] == "edge"
        usable = cpus.usable_cpus()
        applied = cpus.pin_testbed(adopted, cpus.plan_cpus(usable, 1, "on"))
        assert applied[adopted.verifier_container.name] == usable[-1:]
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    for container in running_project.project_containers():
        container.reload()
        assert (container.attrs["HostConfig"].get("CpusetCpus") or "") in (before[container.name], online), (
            container.name
        )
        assert sorted(os.sched_getaffinity(container.attrs["State"]["Pid"])) == usable, container.name
    assert {c.status for c in running_project.project_containers()} == {"running"}
    assert json.loads(call("GET", running_project.edges[0].control_url + "/health"))["status"] == "ok"
