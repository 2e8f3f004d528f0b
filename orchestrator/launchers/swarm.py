"""The ``swarm`` launcher: the services of compose.yaml as a Docker Swarm stack, one verifier
placed on the node labelled ``dsdbed.role=verifier`` (the GPU host), N edges spread over the
nodes, every edge shaping its own link from inside its container (services/shaping_api.py).

    config = SwarmConfig(n_edges=8, profile=get_profile("toy-edge-cloud"))
    with SwarmTestbed(config) as testbed:           # stack deployed, every task healthy
        states = testbed.shape([20.0] * 8)           # PUT /link on every edge, verified by ICMP
        ...
    # stack, secret, network and the control container gone

Declared, realised, read back:

1. `stack_file` (pure) turns compose.yaml into a stack file: the same commands with the
   experiment's values filled in, the token as a swarm secret (``/run/secrets/dsdbed_token``,
   passed by --token-file), the edges with ``--shape-link`` and NET_ADMIN, NET_RAW, SYS_NICE,
   DNS round-robin endpoints (the verifier's name resolves to its task's address, which is what
   an edge's rules match; a virtual IP would be rewritten by IPVS after them), an attachable
   overlay network, no healthchecks (Docker's are execs; we poll /health), no restarts (a
   crashed service is a failed point, not a silent replacement).
   The image is named by its ID, read on the engine that built it: given the nodes' engines
   (``node_hosts``) it is first copied to those that lack it (swarm_images.py), and a node of
   the swarm without it is named before anything deploys; no node looks for it in a registry.
   With more than one node the edges keep off the verifier's node.
2. `docker stack deploy`, then a small control container on the overlay: the orchestrator, on a
   manager node (its engine local), reaches every task's control API with TCP sockets opened in
   that container's network namespace (``netns:`` URLs, orchestrator/common/http_client.py); off
   the manager (``docker_host`` a remote manager's API) through a CONNECT tunnel the container
   runs on a published port of the manager node (``tunnel:`` URLs, swarm_tunnel.py).
3. The tasks are read back (one verifier, N edges, running, each with its overlay address and
   node) and polled for /health until all answer.

Shaping: every edge is asked to shape its link (``PUT /link``) and verifies it itself (ICMP
against the base RTT it measured first); links.csv says ``in-edge-nfqueue`` (or kernel-netem
where the node has sch_netem), with the node each edge ran on and the base RTT its edge measured
to the verifier across the overlay before shaping. NOTE: Docker gives containers no real-time CPU budget, so the
edges' NFQUEUE daemons run at nice -20, not SCHED_FIFO: expect more delay error on a busy node.

Heal (before a retry): an edge or verifier that no longer answers (its node lost, its process
dead) is replaced: once the manager has seen its node go, the service is force-updated, which
starts all its tasks again on the nodes that are ready, and the testbed is read back.

Cleanup: `docker stack rm`, then everything that carries the stack's label
(``com.docker.stack.namespace``, ``dsdbed.stack``): services, the control container, networks,
secrets; `cleanup_stack` does the same after a crash.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import secrets
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker
import yaml

from orchestrator.common import http_client
from orchestrator.launchers.base import EdgeHandle, LinkState
from orchestrator.launchers.control_api import ControlApiTestbed
from orchestrator.launchers.compose_config import ComposeError
from orchestrator.launchers.compose_project import run_command
from orchestrator.launchers.external import shape_in_edge
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.launchers.swarm_images import PROBE_SUFFIX, distribute, image_id, missing_on
from orchestrator.links.keys import as_spec
from orchestrator.launchers.swarm_config import (
    EDGE_PORT,
    OUR_LABEL,
    ROLE_LABEL,
    VERIFIER_PORT,
    SwarmConfig,
    SwarmError,
    stack_file,
)
from orchestrator.launchers.swarm_leftovers import cleanup_stack, find_stack, wait_nodes_clean

log = logging.getLogger(__name__)


@dataclass
class SwarmLinkState(LinkState):
    """A row of links.csv from a swarm edge: where it ran and the overlay's own RTT under the shaping."""

    node: str = ""
    rtt_base_ms: float = math.nan  # edge -> verifier across the overlay, before shaping (ICMP median)


class SwarmTestbed(ControlApiTestbed):
    """A `Testbed` (base.py) made of a swarm stack."""

    def __init__(self, config: SwarmConfig | ServicesConfig) -> None:
        if isinstance(config, ServicesConfig):
            config = SwarmConfig.from_services(config)
        self.config = config
        self.verifier_url = f"ws://verifier:{VERIFIER_PORT}/ws"
        self.edges: list[EdgeHandle] = []
        self.shaper = "in-edge"
        self.shaper_reason = "each edge shapes its own link inside its container (PUT /link)"
        self.up_s = float("nan")
        self.owned = False
        self._token = secrets.token_urlsafe(32)
        self._work = Path(config.work_dir or f"/tmp/dsdbed-swarm-{os.getpid()}")
        self._client = (
            docker.DockerClient(base_url=config.docker_host, timeout=120)
            if config.docker_host
            else docker.from_env(timeout=120)
        )
        self._env = {**os.environ, **({"DOCKER_HOST": config.docker_host} if config.docker_host else {})}
        self._controller = None
        self._reach = ""  # how a task's address is reached: netns:PATH; or tunnel:HOST:PORT;
        self._verifier_http = ""
        self.image_ref = ""
        self.image_steps: list[str] = []
        self.nodes: dict[str, str] = {}  # node ID -> hostname
        self._edge_nodes: list[str] = []  # node ID of each edge
        self.verifier_node = ""
        self._shaped = False
        self._pool = ThreadPoolExecutor(max_workers=min(32, config.n_edges), thread_name_prefix="dsd-swarm")
        try:
            self._bring_up()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SwarmTestbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- up ---------------------------------------------------------------------------------

    def _bring_up(self) -> None:
        c = self.config
        info = self._client.info()
        if info.get("Swarm", {}).get("LocalNodeState") != "active" or not info["Swarm"].get("ControlAvailable"):
            raise SwarmError("this Docker engine is not a swarm manager: `docker swarm init` (or join as a manager)")
        nodes = self._client.nodes.list()
        if not [n for n in nodes if n.attrs["Spec"].get("Labels", {}).get(ROLE_LABEL) == "verifier"]:
            raise SwarmError(
                f"no node is labelled {ROLE_LABEL}=verifier: "
                f"`docker node update --label-add {ROLE_LABEL}=verifier NODE`"
            )
        left = find_stack(c.stack, self._client)
        if left:
            raise SwarmError(
                f"stack {c.stack!r} has leftovers {left}: remove them with `dsdbed cleanup` "
                f"or `docker stack rm {c.stack}`"
            )
        self.owned = True  # from here on close() removes what carries the stack's labels
        self._image_everywhere()
        self._work.mkdir(parents=True, exist_ok=True)
        token_file = self._work / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._token)
        compose = yaml.safe_load(Path(c.compose_file).read_text())
        stack_path = self._work / "stack.yml"
        stack = stack_file(c, compose, str(token_file), self.image_ref, edges_beside_verifier=len(nodes) == 1)
        stack_path.write_text(json.dumps(stack, indent=1))  # JSON is YAML
        t0_s = time.monotonic()
        # --resolve-image never: the image is named by ID, and there is no registry to ask.
        run_command(
            ["docker", "stack", "deploy", "--resolve-image", "never", "--compose-file", str(stack_path), c.stack],
            env=self._env,
            timeout_s=120,
            what="docker stack deploy",
        )
        self._start_controller()
        self._discover(deadline_s=t0_s + c.up_timeout_s)
        self.up_s = time.monotonic() - t0_s

    def _image_everywhere(self) -> None:
        """The image by ID, read where it was built (this machine's engine; else the manager's):
        copied to the nodes given that lack it, then every ready node checked."""
        c = self.config
        source = self._client
        if c.remote:
            local = None
            try:
                local = docker.from_env(timeout=600)
                local.images.get(c.image)
                source = local
            except (docker.errors.DockerException, OSError):
                if local is not None:  # not built here: the manager's
                    local.close()
        try:
            self.image_ref = image_id(source, c.image)
            if c.node_hosts:
                self.image_steps = distribute(c.image, source, list(c.node_hosts))
                log.info("image %s on the nodes: %s", c.image, "; ".join(self.image_steps))
        except RuntimeError as exc:
            raise SwarmError(str(exc)) from None
        finally:
            if source is not self._client:
                source.close()
        missing = missing_on(self._client, self.image_ref, f"{c.stack}_{PROBE_SUFFIX}", {OUR_LABEL: c.stack})
        if missing:
            raise SwarmError(
                f"image {c.image} ({self.image_ref[:19]}) is not on node(s) {', '.join(missing)}: give "
                "their Docker APIs (DSD_SWARM_NODES) to copy it there, or `docker save "
                f"{c.image} | docker -H NODE load` for each"
            )

    def _start_controller(self) -> None:
        """The container the orchestrator reaches the overlay through (module docstring, 2)."""
        c = self.config
        common = {
            "detach": True,
            "name": f"{c.stack}-control",
            "network": f"{c.stack}_testbed",
            "init": True,
            "labels": {OUR_LABEL: c.stack, ROLE_LABEL: "control"},
        }
        if c.remote:
            self._controller = self._client.containers.run(
                self.image_ref,
                [
                    "python3",
                    "-m",
                    "orchestrator.launchers.swarm_tunnel",
                    "--port",
                    str(c.tunnel_port),
                    "--allow",
                    c.subnet,
                ],
                ports={f"{c.tunnel_port}/tcp": c.tunnel_port},
                **common,
            )
            self._reach = f"tunnel:{urllib.parse.urlsplit(c.docker_host).hostname}:{c.tunnel_port};"
        else:
            self._controller = self._client.containers.run(self.image_ref, ["sleep", "infinity"], **common)
            self._controller.reload()
            self._reach = f"netns:/proc/{self._controller.attrs['State']['Pid']}/ns/net;"

    def _tasks(self, service: str) -> list[dict]:
        found = self._client.services.list(filters={"name": f"{self.config.stack}_{service}"})
        return [t for s in found for t in s.tasks()] if found else []

    def _discover(self, deadline_s: float) -> None:
        """Wait until one verifier and N edge tasks run and answer /health over the overlay.
        Only the tasks the swarm wants running count (an update's or a lost node's old ones do not)."""
        c = self.config
        while True:
            self.nodes = {n.id: n.attrs["Description"]["Hostname"] for n in self._client.nodes.list()}
            wanted = {s: [t for t in self._tasks(s) if t["DesiredState"] == "running"] for s in ("verifier", "edge")}
            current = wanted["verifier"] + wanted["edge"]
            verifier = [t for t in wanted["verifier"] if t["Status"]["State"] == "running"]
            edges = sorted(
                (t for t in wanted["edge"] if t["Status"]["State"] == "running"), key=lambda t: t.get("Slot", 0)
            )
            failed = [
                f"{t['ServiceID'][:8]}.{t.get('Slot', '')}@{self.nodes.get(t.get('NodeID'), '?')}: "
                f"{t['Status'].get('Err') or t['Status']['State']}"
                for t in current
                if t["Status"]["State"] in ("failed", "rejected", "complete")
            ]
            if failed:
                raise SwarmError(f"tasks did not start: {failed[:5]}")
            if len(verifier) == 1 and len(edges) == c.n_edges:
                self._verifier_http = self._url(verifier[0], VERIFIER_PORT)
                handles = [
                    EdgeHandle(
                        i,
                        self._url(t, EDGE_PORT),
                        f"edge.{t.get('Slot', i)}@{self.nodes.get(t['NodeID'], t['NodeID'][:12])}",
                        self._token,
                    )
                    for i, t in enumerate(edges)
                ]
                healthy = list(
                    self._pool.map(
                        lambda pair: _healthy(*pair),
                        [(self._verifier_http, "verifier"), *((h.control_url, "edge") for h in handles)],
                    )
                )
                if all(healthy):
                    self.edges = handles
                    self.verifier_node = self.nodes.get(verifier[0]["NodeID"], "")
                    self._edge_nodes = [t["NodeID"] for t in edges]
                    return
            if time.monotonic() > deadline_s:
                raise SwarmError(
                    f"stack not up after {c.up_timeout_s:.0f} s: {len(verifier)} verifier and "
                    f"{len(edges)} of {c.n_edges} edge tasks running"
                )
            time.sleep(1.0)

    def _url(self, task: dict, port: int) -> str:
        network = f"{self.config.stack}_testbed"
        for attachment in task.get("NetworksAttachments", []):
            if attachment["Network"]["Spec"]["Name"] == network:
                ip = attachment["Addresses"][0].split("/")[0]
                return f"{self._reach}http://{ip}:{port}"
        raise SwarmError(f"task {task['ID'][:12]} has no address on {network}")

    # ---- Testbed ----------------------------------------------------------------------------

    def shape(self, rtt_ms_per_edge: list) -> list[LinkState]:
        """One RTT (ms) or one LinkSpec per edge; each edge shapes and verifies its own link."""
        if len(rtt_ms_per_edge) > len(self.edges):
            raise ValueError(f"{len(rtt_ms_per_edge)} links for {len(self.edges)} edges")
        self._shaped = True
        # One edge per node at a time: an edge's verification probes share its node's CPUs with
        # the other edges there (24 edges verifying at once on a 2-core host measured 33 ms for 20).
        by_node: dict[str, list[int]] = {}
        for i, node in enumerate(self._edge_nodes[: len(rtt_ms_per_edge)]):
            by_node.setdefault(node, []).append(i)
        states: list = [None] * len(rtt_ms_per_edge)

        def shape_node(indices: list[int]) -> None:
            for i in indices:
                states[i] = self._shape_edge(self.edges[i], rtt_ms_per_edge[i])

        list(self._pool.map(shape_node, by_node.values()))
        return states

    def _shape_edge(self, edge: EdgeHandle, link) -> SwarmLinkState:
        c = self.config
        body = {
            "verifier_url": self.verifier_url,
            "backend": c.shaper_backend,
            "verify_count": c.verify_count,
            "tolerance_ms": c.verify_tolerance_ms,
        }
        state = shape_in_edge(edge, as_spec(link), body, self._token, 30.0)
        self.shaper = state.shaper
        record = json.loads(http_client.call("GET", edge.control_url + "/link", None, 10.0, self._token))["record"]
        base = (record or {}).get("base") or {}
        return SwarmLinkState(
            **dataclasses.asdict(state),
            node=self._edge_nodes_by_name().get(edge.name, ""),
            rtt_base_ms=base.get("rtt_p50_ms", math.nan),
        )

    def _edge_nodes_by_name(self) -> dict[str, str]:
        return {edge.name: self.nodes.get(node, node) for edge, node in zip(self.edges, self._edge_nodes)}

    def facts(self) -> dict:
        """sweep.json's record of the swarm: its nodes, the image by ID and how it got there."""
        return {
            "nodes": sorted(self.nodes.values()),
            "verifier_node": self.verifier_node,
            "edge_nodes": sorted(set(self._edge_nodes_by_name().values())),
            "image": self.config.image,
            "image_id": self.image_ref,
            "image_steps": self.image_steps,
            "manager": self.config.docker_host or "this machine's engine",
            "reached_by": "tunnel" if self.config.remote else "netns",
        }

    def app_delay_ms(self, client_id: int) -> float:
        return 0.0

    def check(self) -> None:
        if not self._shaped:
            return
        for edge in self.edges:
            failures = json.loads(http_client.call("GET", edge.control_url + "/link", None, 10.0, self._token))[
                "failures"
            ]
            if failures:
                raise RuntimeError(f"shaping in {edge.name} failed: {failures[0]}")

    def heal(self) -> list[str]:
        """Replace what stopped answering (module docstring, Heal); drop broken shaping (the next
        point re-applies it)."""
        lost = [
            role
            for role, answers in (
                ("verifier", _healthy(self._verifier_http, "verifier")),
                ("edge", all(self._pool.map(lambda e: _healthy(e.control_url, "edge"), self.edges))),
            )
            if not answers
        ]
        if lost:
            return self._replace(lost)
        healed = []
        for edge in self.edges:
            state = json.loads(http_client.call("GET", edge.control_url + "/link", None, 10.0, self._token))
            if state["failures"]:
                http_client.call("DELETE", edge.control_url + "/link", None, 10.0, self._token)
                healed.append(f"removed broken shaping in {edge.name}")
        return healed

    def _replace(self, services: list[str]) -> list[str]:
        """Force-update the services whose tasks stopped answering, once the manager sees why
        (their node down, or the task no longer running); then read the testbed back."""
        c = self.config
        deadline_s = time.monotonic() + c.heal_timeout_s
        while True:
            states = {n.id: n.attrs["Status"]["State"] for n in self._client.nodes.list()}
            gone = sorted({self.nodes.get(n, n) for n, state in states.items() if state != "ready"})
            if gone or time.monotonic() > deadline_s:
                break
            # A task the manager still calls running, on a node it still calls ready, that does
            # not answer: its node is probably going; wait for the manager to say so.
            running = [
                (t, s)
                for s in services
                for t in self._tasks(s)
                if t["DesiredState"] == "running" and t["Status"]["State"] == "running"
            ]
            answers = self._pool.map(lambda pair: _healthy(self._task_url(*pair), pair[1]), running)
            if all(answers):
                break
            time.sleep(1.0)
        done = [f"nodes down: {', '.join(gone)}"] if gone else []
        for name in services:
            self._client.services.get(f"{c.stack}_{name}").force_update()
            done.append(f"restarted every {name} task on the ready nodes")
        self._shaped = False
        self._discover(deadline_s=time.monotonic() + c.up_timeout_s)
        done.append(f"{len(self.edges)} edges on {', '.join(sorted(set(self._edge_nodes_by_name().values())))}")
        return done

    def _task_url(self, task: dict, service: str) -> str:
        try:
            return self._url(task, VERIFIER_PORT if service == "verifier" else EDGE_PORT)
        except SwarmError:
            return ""

    # ---- down -------------------------------------------------------------------------------

    def close(self) -> None:
        errors = []
        self._pool.shutdown()
        if self.owned:
            if self._controller is not None:  # it holds the network: out of the way first
                try:
                    self._controller.remove(force=True)
                except docker.errors.APIError as exc:
                    errors.append(f"control container: {exc.explanation}")
                self._controller = None
            try:
                run_command(
                    ["docker", "stack", "rm", self.config.stack], env=self._env, timeout_s=120, what="docker stack rm"
                )
            except ComposeError as exc:
                # Typically the network, still in use by tasks shutting down: removed below.
                log.info("docker stack rm left something: %s", exc)
            try:
                left = cleanup_stack(self.config.stack, self._client)
                if left:
                    log.info("removed by label after docker stack rm: %s", left)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"cleanup by label: {exc}")
            errors += wait_nodes_clean(self.config.stack, self.config.node_hosts)
            self.owned = False
        token_file = self._work / "token"
        token_file.unlink(missing_ok=True)
        self.edges = []
        self._client.close()
        if errors:
            raise SwarmError("teardown incomplete: " + "; ".join(errors))


def _healthy(url: str, role: str) -> bool:
    if not url:
        return False
    try:
        status, body = http_client.request("GET", url + "/health", timeout_s=3.0)
        answer = json.loads(body)
    except (OSError, ValueError):
        return False
    return status == 200 and answer.get("role") == role
