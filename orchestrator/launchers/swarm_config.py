"""The swarm launcher's configuration (orchestrator/launchers/swarm.py): where the swarm is (a
manager's Docker API, the nodes' APIs), what it runs (the services' settings, as compose has them),
and the stack file made from compose.yaml for ``docker stack deploy``; checked on construction."""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, field

from dsd.checks import is_int, is_number
from dsd.backends.factory import BackendConfig, SyntheticBackendConfig
from dsd.costs.profiles import HardwareProfile
from orchestrator.launchers.compose import COMPOSE_FILE, ComposeConfig
from orchestrator.launchers.services_config import ServicesConfig

STACK_LABEL = "com.docker.stack.namespace"
OUR_LABEL = "dsdbed.stack"
ROLE_LABEL = "dsdbed.role"
SECRET = "dsdbed_token"
SECRET_PATH = f"/run/secrets/{SECRET}"
VERIFIER_PORT, EDGE_PORT = 8700, 8701
TUNNEL_PORT = 8790  # published on the manager node when the orchestrator is off it
ENGINE_SCHEMES = ("unix", "tcp", "ssh")
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
    image: str = "dsdbed-shaper:latest"  # scripts/build_shaper_image.sh: iptables + NFQUEUE inside
    subnet: str = "10.231.0.0/22"
    shaper_backend: str = "auto"
    verify_count: int = 50
    verify_tolerance_ms: float = 2.0
    up_timeout_s: float = 900.0
    compose_file: str = str(COMPOSE_FILE)
    work_dir: str = ""
    docker_host: str = ""  # the manager's Docker API; "" = this machine's engine (DOCKER_HOST)
    node_hosts: tuple[str, ...] = ()  # the nodes' Docker APIs: the image is copied to those lacking it
    tunnel_port: int = TUNNEL_PORT
    heal_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        # The service values are validated as compose validates them (same variables).
        _ = self.compose_config
        for name, url in [("docker_host", self.docker_host)] * bool(self.docker_host) + [
            ("node_hosts", u) for u in self.node_hosts
        ]:
            if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ENGINE_SCHEMES:
                raise ValueError(
                    f"{name} must be Docker API URLs ({', '.join(s + '://' for s in ENGINE_SCHEMES)}), got {url!r}"
                )
        if not isinstance(self.node_hosts, tuple):
            raise ValueError(f"node_hosts must be a tuple of URLs, got {self.node_hosts!r}")
        if not (is_int(self.tunnel_port) and 1 <= self.tunnel_port <= 65535):
            raise ValueError(f"tunnel_port must be a port number, got {self.tunnel_port!r}")
        if not (is_number(self.heal_timeout_s) and self.heal_timeout_s > 0):
            raise ValueError(f"heal_timeout_s must be a number > 0, got {self.heal_timeout_s!r}")
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
        return ComposeConfig(
            n_edges=self.n_edges,
            backend=self.backend,
            profile=self.profile,
            threads=self.threads,
            max_batch=self.max_batch,
            batch_window_ms=self.batch_window_ms,
            image=self.image,
            subnet=self.subnet,
            shaper_backend=self.shaper_backend,
            build="never",
            compose_file=self.compose_file,
        )

    @property
    def remote(self) -> bool:
        """The manager's engine is not this machine's: its containers' namespaces are out of reach."""
        return bool(self.docker_host) and not self.docker_host.startswith("unix://")

    @classmethod
    def from_services(cls, services: ServicesConfig, **overrides) -> SwarmConfig:
        """A sweep's swarm: the services' settings, and where the swarm is from the environment,
        as Docker takes DOCKER_HOST: DSD_SWARM_MANAGER (the manager's API) and DSD_SWARM_NODES
        (the nodes' APIs, space-separated, for copying the image to them)."""
        if services.extra_verifier_args:
            raise ValueError(
                f"extra_verifier_args: the swarm launcher cannot pass them, got {services.extra_verifier_args!r}"
            )
        where = {
            "docker_host": os.environ.get("DSD_SWARM_MANAGER", ""),
            "node_hosts": tuple(os.environ.get("DSD_SWARM_NODES", "").split()),
        }
        return cls(
            **{
                "n_edges": services.n_edges,
                "backend": services.backend,
                "profile": services.profile,
                "max_batch": services.max_batch,
                "batch_window_ms": services.batch_window_ms,
                "work_dir": services.work_dir,
                **where,
                **overrides,
            }
        )


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


def stack_file(
    config: SwarmConfig, compose: dict, token_file: str, image_ref: str = "", edges_beside_verifier: bool = True
) -> dict:
    """compose.yaml (parsed) -> the stack file `docker stack deploy` reads. Pure. ``image_ref``:
    the image by ID (default: by name); ``edges_beside_verifier`` False keeps the edges off the
    verifier's node. An update (heal's force-update) replaces every task at once."""
    env = config.compose_config.compose_env()
    env.pop("DSD_TOKEN", None)
    labels = {OUR_LABEL: config.stack}

    def service(name: str, extra_args: list[str], deploy: dict, **more) -> dict:
        source = compose["services"][name]
        command = [a for a in interpolate(source["command"], env) if not a.endswith("=")]  # empty flags
        return {
            "image": image_ref or config.image,
            "command": command + ["--token-file", SECRET_PATH, *extra_args],
            "networks": ["testbed"],
            "secrets": [SECRET],
            "stop_grace_period": "5s",
            "labels": {ROLE_LABEL: name, **labels},
            "deploy": {
                "labels": {ROLE_LABEL: name, **labels},
                "restart_policy": {"condition": "none"},
                "endpoint_mode": "dnsrr",
                "update_config": {"parallelism": 0, "order": "stop-first", "failure_action": "continue"},
                **deploy,
            },
            **more,
        }

    edge_placement = {"preferences": [{"spread": "node.id"}]}
    if not edges_beside_verifier:
        edge_placement["constraints"] = [f"node.labels.{ROLE_LABEL} != verifier"]

    return {
        "version": "3.8",
        "services": {
            "verifier": service(
                "verifier", [], {"replicas": 1, "placement": {"constraints": [f"node.labels.{ROLE_LABEL} == verifier"]}}
            ),
            "edge": service(
                "edge",
                ["--shape-link"],
                {"replicas": config.n_edges, "placement": edge_placement},
                cap_add=list(EDGE_CAPS),
            ),
        },
        "networks": {
            "testbed": {
                "driver": "overlay",
                "attachable": True,
                "labels": labels,
                "ipam": {"config": [{"subnet": config.subnet}]},
            }
        },
        "secrets": {SECRET: {"file": token_file}},  # labelled by the stack (namespace)
    }
