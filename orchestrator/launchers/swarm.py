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
2. `docker stack deploy`, then a small control container (``sleep``) on the overlay: the
   orchestrator, on a manager node, reaches every task's control API with TCP sockets opened in
   that container's network namespace (``netns:`` URLs, orchestrator/common/http_client.py), on the
   overlay itself, from any node of the swarm.
3. The tasks are read back (one verifier, N edges, running, each with its overlay address) and
   polled for /health until all answer.

Shaping: every edge is asked to shape its link (``PUT /link``) and verifies it itself (ICMP
against the base RTT it measured first); links.csv says ``in-edge-nfqueue`` (or kernel-netem
where the node has sch_netem). NOTE: Docker gives containers no real-time CPU budget, so the
edges' NFQUEUE daemons run at nice -20, not SCHED_FIFO: expect more delay error on a busy node.

Cleanup: `docker stack rm`, then everything that carries the stack's label
(``com.docker.stack.namespace``, ``dsdbed.stack``): services, the control container, networks,
secrets; `cleanup_stack` does the same after a crash.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import yaml

from dsd.checks import is_int, is_number
from dsd.backends.factory import BackendConfig, SyntheticBackendConfig
from dsd.profiles import HardwareProfile
from orchestrator.common import http_client
from orchestrator.launchers.base import EdgeHandle, LinkState
from orchestrator.launchers.control_api import ControlApiTestbed
from orchestrator.launchers.compose import COMPOSE_FILE, ComposeConfig, ComposeError, _run
from orchestrator.launchers.external import shape_in_edge
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.links.keys import as_spec

log = logging.getLogger(__name__)

STACK_LABEL = "com.docker.stack.namespace"
OUR_LABEL = "dsdbed.stack"
ROLE_LABEL = "dsdbed.role"
SECRET = "dsdbed_token"
SECRET_PATH = f"/run/secrets/{SECRET}"
VERIFIER_PORT, EDGE_PORT = 8700, 8701
EDGE_CAPS = ["NET_ADMIN", "NET_RAW", "SYS_NICE"]
_STACK_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}$")
_VAR_RE = re.compile(r"\$\{([A-Z0-9_]+)(:?-)?([^}]*)\}")


class SwarmError(RuntimeError):
    """docker swarm/stack failed, or the swarm is not what the launcher needs."""


@dataclass(frozen=True)
class SwarmConfig:
    n_edges: int
    backend: BackendConfig = field(default_factory=SyntheticBackendConfig)
    profile: HardwareProfile | None = None
    threads: int = 1
    max_batch: int = 1
    batch_window_ms: float = 0.0
    stack: str = "dsdbed"
    image: str = "dsdbed-shaper:latest"     # scripts/build_shaper_image.sh: iptables + NFQUEUE inside
    subnet: str = "10.231.0.0/22"
    shaper_backend: str = "auto"
    verify_count: int = 50
    verify_tolerance_ms: float = 2.0
    up_timeout_s: float = 900.0
    compose_file: str = str(COMPOSE_FILE)
    work_dir: str = ""

    def __post_init__(self) -> None:
        # The service values are validated as compose validates them (same variables).
        self.compose_config
        if not isinstance(self.stack, str) or not _STACK_RE.match(self.stack):
            raise ValueError(f"stack must be 1-31 lowercase letters, digits, '-' or '_', got {self.stack!r}")
        for name, low, high in (("verify_count", 0, 100_000),):
            value = getattr(self, name)
            if not (is_int(value) and low <= value <= high):
                raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
        value = self.verify_tolerance_ms
        if not (is_number(value) and value > 0):
            raise ValueError(f"verify_tolerance_ms must be a number > 0, got {value!r}")

    @property
    def compose_config(self) -> ComposeConfig:
        return ComposeConfig(n_edges=self.n_edges, backend=self.backend, profile=self.profile, threads=self.threads,
                             max_batch=self.max_batch, batch_window_ms=self.batch_window_ms, image=self.image,
                             subnet=self.subnet, shaper_backend=self.shaper_backend, build="never",
                             compose_file=self.compose_file)

    @classmethod
    def from_services(cls, services: ServicesConfig, **overrides) -> "SwarmConfig":
        if services.extra_verifier_args:
            raise ValueError(f"extra_verifier_args: the swarm launcher cannot pass them, got "
                             f"{services.extra_verifier_args!r}")
        return cls(**{"n_edges": services.n_edges, "backend": services.backend, "profile": services.profile,
                      "max_batch": services.max_batch, "batch_window_ms": services.batch_window_ms,
                      "work_dir": services.work_dir, **overrides})


def interpolate(value, env: dict[str, str]):
    """compose's ${NAME}, ${NAME:-default}, ${NAME-default} in every string of a structure."""
    if isinstance(value, str):
        def one(m: re.Match) -> str:
            name, op, default = m.group(1), m.group(2), m.group(3)
            if name in env and (env[name] != "" or op != ":-"):
                return env[name]
            return default if op else ""
        return _VAR_RE.sub(one, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def stack_file(config: SwarmConfig, compose: dict, token_file: str) -> dict:
    """compose.yaml (parsed) -> the stack file `docker stack deploy` reads. Pure."""
    env = config.compose_config.compose_env()
    env.pop("DSD_TOKEN", None)
    labels = {OUR_LABEL: config.stack}

    def service(name: str, extra_args: list[str], deploy: dict, **more) -> dict:
        source = compose["services"][name]
        command = [a for a in interpolate(source["command"], env) if not a.endswith("=")]   # empty flags
        return {"image": config.image, "command": command + ["--token-file", SECRET_PATH, *extra_args],
                "networks": ["testbed"], "secrets": [SECRET], "stop_grace_period": "5s",
                "labels": {ROLE_LABEL: name, **labels},
                "deploy": {"labels": {ROLE_LABEL: name, **labels}, "restart_policy": {"condition": "none"},
                           "endpoint_mode": "dnsrr", **deploy}, **more}

    return {
        "version": "3.8",
        "services": {
            "verifier": service("verifier", [], {"replicas": 1, "placement": {
                "constraints": [f"node.labels.{ROLE_LABEL} == verifier"]}}),
            "edge": service("edge", ["--shape-link"], {"replicas": config.n_edges, "placement": {
                "preferences": [{"spread": "node.id"}]}}, cap_add=list(EDGE_CAPS)),
        },
        "networks": {"testbed": {"driver": "overlay", "attachable": True, "labels": labels,
                                 "ipam": {"config": [{"subnet": config.subnet}]}}},
        "secrets": {SECRET: {"file": token_file}},          # labelled by the stack (namespace)
    }


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
        self._client = docker.from_env(timeout=120)
        self._controller = None
        self._verifier_http = ""
        self._shaped = False
        self._pool = ThreadPoolExecutor(max_workers=min(32, config.n_edges), thread_name_prefix="dsd-swarm")
        try:
            self._bring_up()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "SwarmTestbed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- up ---------------------------------------------------------------------------------

    def _bring_up(self) -> None:
        c = self.config
        info = self._client.info()
        if info.get("Swarm", {}).get("LocalNodeState") != "active" or not info["Swarm"].get("ControlAvailable"):
            raise SwarmError("this Docker engine is not a swarm manager: `docker swarm init` (or join as a manager)")
        if not [n for n in self._client.nodes.list() if n.attrs["Spec"].get("Labels", {}).get(ROLE_LABEL) == "verifier"]:
            raise SwarmError(f"no node is labelled {ROLE_LABEL}=verifier: "
                             f"`docker node update --label-add {ROLE_LABEL}=verifier NODE`")
        if not self._client.images.list(name=c.image):
            raise SwarmError(f"image {c.image} is missing: scripts/build_images.sh, then scripts/build_shaper_image.sh "
                             "(on every node, or push it to a registry the nodes share)")
        left = find_stack(c.stack, self._client)
        if left:
            raise SwarmError(f"stack {c.stack!r} has leftovers {left}: remove them with `dsdbed cleanup` "
                             f"or `docker stack rm {c.stack}`")
        self._work.mkdir(parents=True, exist_ok=True)
        token_file = self._work / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._token)
        compose = yaml.safe_load(Path(c.compose_file).read_text())
        stack_path = self._work / "stack.yml"
        stack_path.write_text(json.dumps(stack_file(c, compose, str(token_file)), indent=1))  # JSON is YAML
        t0_s = time.monotonic()
        self.owned = True
        _run(["docker", "stack", "deploy", "--compose-file", str(stack_path), c.stack], env=dict(os.environ),
             timeout_s=120, what="docker stack deploy")
        network = f"{c.stack}_testbed"
        self._controller = self._client.containers.run(
            c.image, ["sleep", "infinity"], detach=True, name=f"{c.stack}-control", network=network, init=True,
            labels={OUR_LABEL: c.stack, ROLE_LABEL: "control"})
        self._controller.reload()
        self._netns = f"/proc/{self._controller.attrs['State']['Pid']}/ns/net"
        self._discover(deadline_s=t0_s + c.up_timeout_s)
        self.up_s = time.monotonic() - t0_s

    def _tasks(self, service: str) -> list[dict]:
        found = self._client.services.list(filters={"name": f"{self.config.stack}_{service}"})
        return [t for s in found for t in s.tasks()] if found else []

    def _discover(self, deadline_s: float) -> None:
        """Wait until one verifier and N edge tasks run and answer /health over the overlay."""
        c = self.config
        while True:
            verifier = [t for t in self._tasks("verifier") if t["Status"]["State"] == "running"]
            edges = sorted((t for t in self._tasks("edge") if t["Status"]["State"] == "running"),
                           key=lambda t: t.get("Slot", 0))
            failed = [f"{t['ServiceID'][:8]}.{t.get('Slot', '')}: {t['Status'].get('Err') or t['Status']['State']}"
                      for t in self._tasks("verifier") + self._tasks("edge")
                      if t["Status"]["State"] in ("failed", "rejected", "shutdown", "complete")]
            if failed:
                raise SwarmError(f"tasks did not start: {failed[:5]}")
            if len(verifier) == 1 and len(edges) == c.n_edges:
                self._verifier_http = self._url(verifier[0], VERIFIER_PORT)
                handles = [EdgeHandle(i, self._url(t, EDGE_PORT), f"edge.{t.get('Slot', i)}@{t['NodeID'][:8]}",
                                      self._token) for i, t in enumerate(edges)]
                if all(_healthy(u, role) for u, role in [(self._verifier_http, "verifier"),
                                                         *((h.control_url, "edge") for h in handles)]):
                    self.edges = handles
                    return
            if time.monotonic() > deadline_s:
                raise SwarmError(f"stack not up after {c.up_timeout_s:.0f} s: {len(verifier)} verifier and "
                                 f"{len(edges)} of {c.n_edges} edge tasks running")
            time.sleep(1.0)

    def _url(self, task: dict, port: int) -> str:
        network = f"{self.config.stack}_testbed"
        for attachment in task.get("NetworksAttachments", []):
            if attachment["Network"]["Spec"]["Name"] == network:
                ip = attachment["Addresses"][0].split("/")[0]
                return f"netns:{self._netns};http://{ip}:{port}"
        raise SwarmError(f"task {task['ID'][:12]} has no address on {network}")

    # ---- Testbed ----------------------------------------------------------------------------

    def shape(self, rtt_ms_per_edge: list) -> list[LinkState]:
        """One RTT (ms) or one LinkSpec per edge; each edge shapes and verifies its own link."""
        if len(rtt_ms_per_edge) > len(self.edges):
            raise ValueError(f"{len(rtt_ms_per_edge)} links for {len(self.edges)} edges")
        self._shaped = True
        states = list(self._pool.map(lambda p: self._shape_edge(*p), zip(self.edges, rtt_ms_per_edge)))
        return states

    def _shape_edge(self, edge: EdgeHandle, link) -> LinkState:
        c = self.config
        body = {"verifier_url": self.verifier_url, "backend": c.shaper_backend, "verify_count": c.verify_count,
                "tolerance_ms": c.verify_tolerance_ms}
        state = shape_in_edge(edge, as_spec(link), body, self._token, 30.0)
        self.shaper = state.shaper
        return state

    def app_delay_ms(self, client_id: int) -> float:
        return 0.0

    def check(self) -> None:
        if not self._shaped:
            return
        for edge in self.edges:
            failures = json.loads(http_client.call("GET", edge.control_url + "/link", None, 10.0, self._token))["failures"]
            if failures:
                raise RuntimeError(f"shaping in {edge.name} failed: {failures[0]}")

    def heal(self) -> list[str]:
        """Drop broken shaping (the next point re-applies it); a dead task is not replaced (restart
        policy none), so it fails the retry with its name."""
        healed = []
        for edge in self.edges:
            state = json.loads(http_client.call("GET", edge.control_url + "/link", None, 10.0, self._token))
            if state["failures"]:
                http_client.call("DELETE", edge.control_url + "/link", None, 10.0, self._token)
                healed.append(f"removed broken shaping in {edge.name}")
        return healed

    # ---- down -------------------------------------------------------------------------------

    def close(self) -> None:
        errors = []
        self._pool.shutdown()
        if self.owned:
            if self._controller is not None:        # it holds the network: out of the way first
                try:
                    self._controller.remove(force=True)
                except docker.errors.APIError as exc:
                    errors.append(f"control container: {exc.explanation}")
                self._controller = None
            try:
                _run(["docker", "stack", "rm", self.config.stack], env=dict(os.environ), timeout_s=120,
                     what="docker stack rm")
            except ComposeError as exc:
                # Typically the network, still in use by tasks shutting down: removed below.
                log.info("docker stack rm left something: %s", exc)
            try:
                left = cleanup_stack(self.config.stack, self._client)
                if left:
                    log.info("removed by label after docker stack rm: %s", left)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"cleanup by label: {exc}")
            self.owned = False
        token_file = self._work / "token"
        token_file.unlink(missing_ok=True)
        self.edges = []
        self._client.close()
        if errors:
            raise SwarmError("teardown incomplete: " + "; ".join(errors))


def _healthy(url: str, role: str) -> bool:
    try:
        status, body = http_client.request("GET", url + "/health", timeout_s=3.0)
        answer = json.loads(body)
    except (OSError, ValueError):
        return False
    return status == 200 and answer.get("role") == role


def find_stack(stack: str, client) -> list[str]:
    """What of a stack exists: services, containers, networks, secrets with its labels."""
    found = []
    for label in (f"{STACK_LABEL}={stack}", f"{OUR_LABEL}={stack}"):
        found += [f"service {s.name}" for s in client.services.list(filters={"label": label})]
        found += [f"container {x.name}" for x in client.containers.list(all=True, filters={"label": label})]
        found += [f"network {n.name}" for n in client.networks.list(filters={"label": label})]
        found += [f"secret {s.name}" for s in client.secrets.list(filters={"label": label})]
    return sorted(set(found))


def cleanup_stack(stack: str = "dsdbed", client=None, timeout_s: float = 60.0) -> list[str]:
    """Remove everything of a stack by label (idempotent); returns what it removed. Services and
    containers first: a network or secret in use cannot go until their tasks are gone."""
    own = client is None
    client = client or docker.from_env(timeout=120)
    removed = []
    try:
        for label in (f"{STACK_LABEL}={stack}", f"{OUR_LABEL}={stack}"):
            for s in client.services.list(filters={"label": label}):
                s.remove()
                removed.append(f"service {s.name}")
            for x in client.containers.list(all=True, filters={"label": label}):
                x.remove(force=True)
                removed.append(f"container {x.name}")
        deadline_s = time.monotonic() + timeout_s
        while True:
            # Tasks leave their networks a moment after the services are removed.
            busy = []
            for label in (f"{STACK_LABEL}={stack}", f"{OUR_LABEL}={stack}"):
                for n in client.networks.list(filters={"label": label}):
                    try:
                        n.remove()
                        removed.append(f"network {n.name}")
                    except docker.errors.APIError as exc:
                        busy.append(f"network {n.name}: {exc.explanation}")
                for s in client.secrets.list(filters={"label": label}):
                    try:
                        s.remove()
                        removed.append(f"secret {s.name}")
                    except docker.errors.APIError as exc:
                        busy.append(f"secret {s.name}: {exc.explanation}")
            if not busy:
                return sorted(set(removed))
            if time.monotonic() > deadline_s:
                raise SwarmError(f"still in use after {timeout_s:.0f} s: {busy}")
            time.sleep(1.0)
    finally:
        if own:
            client.close()
