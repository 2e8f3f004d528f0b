"""Adaptive DSD on the compose testbed: two edge containers on differently shaped links, each
edge's controller deciding for itself (tests/orchestrator/test_controller_modes.py has the same
check on loopback and netns)."""

from __future__ import annotations

import pytest

from netem.cleanup import find_leftovers
from tests.compose.host import project_containers
from tests.orchestrator.controller_runs import run_two_links

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]


def test_each_edge_container_adapts_to_its_own_link(docker_engine, tmp_path):
    assert project_containers() == [], "a dsdbed compose project is up already: `docker compose down` it first"
    run_two_links("compose", tmp_path / "compose")
    assert project_containers() == [] and find_leftovers() == []
