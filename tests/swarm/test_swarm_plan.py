"""The multi-node swarm's plans and its tunnel, without Docker: where the stack puts the edges,
what the node containers are given, and the CONNECT tunnel the orchestrator reaches the overlay
through (over loopback)."""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import socket
import threading

import pytest
import yaml

from dsd.costs.profiles import get_profile
from orchestrator.common import http_client
from orchestrator.launchers.compose import COMPOSE_FILE
from orchestrator.launchers.swarm import SwarmConfig, stack_file
from orchestrator.launchers.swarm_local import LocalSwarmConfig, capabilities, plan
from orchestrator.launchers.swarm_tunnel import serve


def test_on_several_nodes_the_edges_keep_off_the_verifiers_node_and_the_image_is_named_by_id():
    config = SwarmConfig(n_edges=3, profile=get_profile("toy-edge-cloud"))
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    alone = stack_file(config, compose, "/tmp/t")
    spread = stack_file(config, compose, "/tmp/t", image_ref="sha256:" + "a" * 64, edges_beside_verifier=False)
    assert "constraints" not in alone["services"]["edge"]["deploy"]["placement"]
    assert spread["services"]["edge"]["deploy"]["placement"]["constraints"] == ["node.labels.dsdbed.role != verifier"]
    assert {s["image"] for s in spread["services"].values()} == {"sha256:" + "a" * 64}
    assert alone["services"]["edge"]["image"] == "dsdbed-shaper:latest"
    assert spread["services"]["edge"]["deploy"]["update_config"]["parallelism"] == 0  # heal: all at once


def test_swarm_config_names_a_bad_engine_url():
    profile = get_profile("toy-edge-cloud")
    with pytest.raises(ValueError, match="docker_host"):
        SwarmConfig(n_edges=1, profile=profile, docker_host="10.0.0.1:2375")
    with pytest.raises(ValueError, match="node_hosts"):
        SwarmConfig(n_edges=1, profile=profile, node_hosts=("http://x",))
    assert SwarmConfig(n_edges=1, profile=profile, docker_host="tcp://10.233.0.2:2375").remote
    assert not SwarmConfig(n_edges=1, profile=profile, docker_host="unix:///var/run/docker.sock").remote


def test_local_swarm_nodes_get_the_hosts_capabilities_on_their_own_network():
    config = LocalSwarmConfig(n_nodes=3)
    nodes = plan(config, bounding_mask=(1 << 41) - 1 - (1 << 24))  # all but SYS_RESOURCE
    assert [n["name"] for n in nodes] == ["dsdbed-node-0", "dsdbed-node-1", "dsdbed-node-2"]
    assert "SYS_RESOURCE" not in nodes[0]["cap_add"] and {"SYS_ADMIN", "NET_ADMIN"} <= set(nodes[0]["cap_add"])
    assert nodes[2]["command"] == ["--host=tcp://10.233.0.4:2375"]
    assert all(n["labels"]["dsdbed.role"] == "swarm-node" for n in nodes)
    assert capabilities(0b101) == ["CHOWN", "DAC_READ_SEARCH"]
    with pytest.raises(ValueError, match="verifier_node"):
        LocalSwarmConfig(n_nodes=2, verifier_node=2)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tunnel_carries_requests_to_the_overlay_and_refuses_other_addresses():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = _free_port()
    loop = asyncio.new_event_loop()
    task = loop.create_task(serve(port, ipaddress.IPv4Network("127.0.0.0/8")))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        url = f"tunnel:127.0.0.1:{port};http://127.0.0.1:{server.server_address[1]}/health"
        for _ in range(50):  # the tunnel's listener comes up on its thread
            try:
                status, body = http_client.request("GET", url, timeout_s=5.0)
                break
            except ConnectionRefusedError:
                threading.Event().wait(0.1)
        assert (status, body) == (200, b"hello /health")
        with pytest.raises(OSError, match="403"):  # outside --allow: not even tried
            http_client.request("GET", f"tunnel:127.0.0.1:{port};http://10.1.2.3:8701/health", timeout_s=5.0)
    finally:
        loop.call_soon_threadsafe(task.cancel)
        server.shutdown()
