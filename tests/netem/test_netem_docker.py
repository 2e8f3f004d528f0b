"""The container path: endpoints from Docker containers, rules in DOCKER-USER, the daemon in the host.

Needs a running Docker engine and a local image with `sleep` (DSDBED_TEST_IMAGE, default
dsdbed-base:bookworm); skipped otherwise. The containers sit on an internal network of their own,
so probe traffic stays between them.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from netem import names, rules
from netem.cleanup import our_processes
from netem.endpoints import Link, endpoint_from_container
from netem.shaper import Shaper, ShaperConfig
from netem.spec import LinkSpec

from .conftest import note_backend

pytestmark = [pytest.mark.root, pytest.mark.docker]

IMAGE = os.environ.get("DSDBED_TEST_IMAGE", "dsdbed-base:bookworm")


@pytest.fixture
def two_containers():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001 - no engine, no image: nothing to test here
        pytest.skip(f"Docker or image {IMAGE} not available: {exc}")
    tag = names.new_tag()
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="198.18.7.0/24")])
    network = client.networks.create(f"{names.PREFIX}-{tag}-net", driver="bridge", internal=True, ipam=ipam)
    containers = []
    try:
        for role in ("v", "e0"):
            containers.append(
                client.containers.run(
                    IMAGE,
                    ["sleep", "120"],
                    name=f"{names.PREFIX}-{tag}-{role}",
                    network=network.name,
                    detach=True,
                    init=True,
                )
            )
        yield containers
    finally:
        for container in containers:
            container.remove(force=True)
        network.remove()


def test_containers_are_shaped_through_their_host_side_veths(two_containers, record_property):
    verifier = endpoint_from_container(two_containers[0])
    edge = endpoint_from_container(two_containers[1])
    assert edge.netns == f"/proc/{two_containers[1].attrs['State']['Pid']}/ns/net"
    assert edge.bridge_netns is None and edge.bridge_port.startswith("veth")
    with Shaper(ShaperConfig(verify_count=100, verify_interval_s=0.01)) as shaper:
        record = shaper.apply([Link("e0", edge, verifier, LinkSpec(rtt_ms=30))])[0]
        note_backend(record_property, record.backend, record.backend_reason)
        if record.backend == "nfqueue":
            assert rules.parent_chain_for(None) == rules.DOCKER_USER
            assert shaper.rule_plans[0].parent_chain == rules.DOCKER_USER
        m = record.measured
        assert abs(m.rtt_err_p50_ms) < 1.0 and m.n_received == m.n_sent, m
    host_rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    assert names.CHAIN_PREFIX not in host_rules
    assert our_processes() == []
