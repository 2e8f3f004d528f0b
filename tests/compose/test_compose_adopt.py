"""A project that is already up is refused unless adopted; an adopted one is used as it is and
left up on close."""
from __future__ import annotations

import dataclasses
import json

import pytest

from dsd.profiles import get_profile
from orchestrator.http_client import call
from orchestrator.launchers.compose import ComposeConfig, ComposeError, ComposeTestbed, cleanup_project

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]

PROJECT = "dsdbedadopt"
CONFIG = ComposeConfig(n_edges=1, profile=get_profile("toy-edge-cloud"), project=PROJECT, subnet="172.31.251.0/24",
                       verify_count=0)


@pytest.fixture
def running_project(docker_engine):
    owner = ComposeTestbed(CONFIG)          # brought up (and so owned) by another launcher
    try:
        yield owner
    finally:
        owner.close()
        cleanup_project(PROJECT)


def test_a_running_project_is_refused_unless_adopted_and_an_adopted_one_is_left_up(running_project):
    with pytest.raises(ComposeError, match="adopt=True"):
        ComposeTestbed(CONFIG)
    with ComposeTestbed(dataclasses.replace(CONFIG, adopt=True)) as adopted:
        assert not adopted.owned
        assert [e.name for e in adopted.edges] == [e.name for e in running_project.edges]
        assert json.loads(call("GET", adopted.edges[0].control_url + "/health"))["role"] == "edge"
    assert {c.status for c in running_project.project_containers()} == {"running"}
    assert json.loads(call("GET", running_project.edges[0].control_url + "/health"))["status"] == "ok"
