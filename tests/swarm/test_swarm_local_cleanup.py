"""`dsdbed cleanup` removes a local multi-node swarm (orchestrator/launchers/swarm_local.py)
that a crashed run left: the node containers, the volumes holding their engines' storage, and
their network (Docker, root). A module of its own: cleanup removes every node container of ours,
so no other swarm of the tests may be up beside it."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.launchers.swarm_local import LocalSwarm, LocalSwarmConfig
from tests.swarm.conftest import REPO, docker

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def node_image(single_node_images):
    subprocess.run(["bash", str(REPO / "scripts/build_node_image.sh")], check=True, timeout=600)


def test_dsdbed_cleanup_removes_a_local_swarm_left_behind(node_image):
    """Node containers (with their engines' volumes) and their network, as a crash leaves them."""
    from orchestrator.launchers import leftovers

    swarm = LocalSwarm(LocalSwarmConfig(n_nodes=1, verifier_node=0, prefix="dsdbed-crashed", subnet="10.233.1.0/24"))
    volume = swarm.containers[0].attrs["Mounts"][0]["Name"]
    swarm.host.close()  # as if the process had died here
    found = leftovers.find()
    assert {"container dsdbed-crashed-0", "network dsdbed-crashed"} <= set(found), found
    leftovers.clean()
    assert docker("ps", "-aq", "--filter", "label=dsdbed.testbed=dsdbed-crashed") == ""
    assert docker("network", "ls", "-q", "--filter", "label=dsdbed.testbed") == ""
    assert docker("volume", "ls", "-q", "--filter", f"name={volume}") == ""
