"""A service that dies while starting is reported with its log lines, and the half-started
testbed is taken down completely."""

from __future__ import annotations

import pytest

from dsd.costs.profiles import get_profile
from orchestrator.launchers.compose import COMPOSE_FILE, ComposeConfig, ComposeError, ComposeTestbed
from tests.compose.host import host_state, new_since

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]


def test_an_edge_that_dies_while_starting_is_reported_and_nothing_is_left(docker_engine, tmp_path):
    text = COMPOSE_FILE.read_text()
    broken = text.replace("      - services.edge\n", "      - services.no_such_module\n")  # exits at once
    assert broken != text
    (tmp_path / "compose.yaml").write_text(broken)
    before = host_state()
    config = ComposeConfig(
        n_edges=2,
        profile=get_profile("toy-edge-cloud"),
        project="dsdbedfail",
        subnet="172.31.252.0/24",
        compose_file=str(tmp_path / "compose.yaml"),
        build="missing",
    )
    with pytest.raises(ComposeError, match="stopped while starting") as failure:
        ComposeTestbed(config)
    assert "No module named services.no_such_module" in str(failure.value)
    assert new_since(before) == {}
