"""The ``compose`` launcher: the verifier and N edges as the containers of compose.yaml, each
edge's link shaped by netem/ on the container's host-side veth (Docker, root).

    config = ComposeConfig(n_edges=4, profile=get_profile("toy-edge-cloud"))   # synthetic backend
    with ComposeTestbed(config) as testbed:            # compose up -d --scale edge=4, all healthy
        states = testbed.shape([5, 10, 20, 40])        # one measured LinkState per edge
        ... POST testbed.edges[i].control_url + "/runs" {..., "verifier_url": testbed.verifier_url}
    # compose down; shaping rules and daemon gone

Declared, realised, read back: the config becomes the environment of `docker compose` (the
variables compose.yaml reads); `compose up -d` starts the project; the containers are found by
their compose labels through the Docker SDK, edges in container-number order (edge i is client
i); then every service is polled for /health at its IP on the testbed network until all answer
(the host reaches them through the bridge; no port is published), while a container that stops
is noticed. The edges reach the verifier by its service name.

A project that already has containers (`docker compose up -d --scale edge=4` by hand) is used
with ``adopt=True``, or ``adopt="auto"`` (what a sweep passes: use it if it is up, else bring one
up), and is then left up on close, unshaped. Before it is used it must match the config: the
backend config (field by field), the profile, threads, batching, and at least ``n_edges`` edges (the first ones by container number are used); a mismatch is one line
naming each setting, its running value and the wanted one, and the `docker compose up` that
fixes it. (The diffing: compose_adopt.py; the config: compose_config.py; the project's containers and
`docker compose` itself: compose_project.py.) Otherwise close() saves the services' logs (``log_dir``) and runs `compose down`, which
removes the containers and the network. The sweep's ``ServicesConfig`` is accepted too.

Shaping: a netem ``Shaper`` applies once, so each `shape` call closes the previous one and
applies a new one over endpoints resolved again (a restarted container has a new host-side veth).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
import urllib.request
from pathlib import Path

import docker

from netem import Link, LinkRecord, Shaper, ShaperConfig, endpoint_from_container
from netem.probe import choose_backend
from orchestrator.links import keys as link_keys
from orchestrator.links import rows as link_rows
from orchestrator.launchers.base import EdgeHandle, LinkState
from orchestrator.launchers.compose_adopt import (
    ADOPT_SETTINGS,
    COMPOSE_DEFAULTS,
    EDGE_SERVICE,  # noqa: F401
    VERIFIER_SERVICE,
    adopt_mismatches,
    fix_command,
)
from orchestrator.launchers.compose_config import (
    COMPOSE_FILE,
    MODELS_DIR,
    REPO,
    ComposeConfig,  # noqa: F401
    ComposeError,
)
from orchestrator.launchers.compose_project import (
    cleanup_project,
    container_token,
    docker_client,
    edges_in_order,
    project_is_up,
    project_labels,
    run_command,
)
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.launchers.control_api import ControlApiTestbed

__all__ = [
    "ADOPT_SETTINGS",
    "COMPOSE_DEFAULTS",
    "COMPOSE_FILE",
    "EDGE_SERVICE",
    "MODELS_DIR",
    "VERIFIER_SERVICE",
    "ComposeConfig",
    "ComposeError",
    "ComposeTestbed",
    "adopt_mismatches",
    "cleanup_project",
    "docker_client",
    "fix_command",
    "project_is_up",
    "project_labels",
]
log = logging.getLogger(__name__)

BUILD_SCRIPT = REPO / "scripts" / "build_images.sh"

VERIFIER_PORT, EDGE_PORT = 8700, 8701
NETWORK_KEY = "testbed"  # compose.yaml's network; docker: PROJECT_testbed
ROLE_LABEL = "dsdbed.role"  # compose.yaml: "verifier" or "edge"

_HEALTH_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.25


class ComposeTestbed(ControlApiTestbed):
    """A `Testbed` (orchestrator/launchers/base.py) made of compose.yaml's containers."""

    def __init__(self, config: ComposeConfig | ServicesConfig) -> None:
        """Bring the testbed up (or adopt it); on failure, take down whatever came up and raise."""
        if isinstance(config, ServicesConfig):
            config = ComposeConfig.from_services(config)
        self.config = config
        self.verifier_url = f"ws://{VERIFIER_SERVICE}:{VERIFIER_PORT}/ws"
        self.edges: list[EdgeHandle] = []
        self.shaper = "none"  # the netem backend; set on start and by shape()
        self.shaper_reason = ""
        self.link_records: list[LinkRecord] = []
        self.verifier_container = None
        self.edge_containers: list = []
        self.owned = False  # we ran `compose up`, so close() runs `compose down`
        self.up_s = float("nan")  # from `compose up` until every service answered /health
        self._shaper: Shaper | None = None
        self._cpusets_before: dict[str, str] = {}  # container -> its cpuset before pin_containers
        # The verifier and the edges share it through compose.yaml's DSD_TOKEN; an adopted project
        # keeps the one it was started with, which the edges' handles read from their containers.
        self._token = secrets.token_urlsafe(32)
        self._client = docker_client()
        try:
            self._bring_up()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ComposeTestbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _bring_up(self) -> None:
        c = self.config
        self.shaper, self.shaper_reason = choose_backend(c.shaper_backend)
        existing = self.project_containers()
        if existing and c.adopt is False:
            raise ComposeError(
                f"project {c.project!r} already has containers {sorted(x.name for x in existing)}: pass "
                f"adopt=True to use them, or remove them with `docker compose -p {c.project} down`"
            )
        if not existing and c.adopt is True:
            raise ComposeError(
                f"no compose project {c.project!r} is up to adopt; start it with `{fix_command(c, c.n_edges)}`"
            )
        if existing:
            log.info("using the running compose project %s (left up afterwards)", c.project)
            self._check_adoptable(existing)
            self._discover()
            self._wait_ready(deadline_s=time.monotonic() + c.up_timeout_s)
            return
        self._ensure_image()
        self.owned = True  # from here on, close() takes down whatever came up
        t0_s = time.monotonic()
        try:
            self.compose(
                "up",
                "--detach",
                "--no-build",
                "--pull",
                "never",
                "--remove-orphans",
                "--scale",
                f"{EDGE_SERVICE}={c.n_edges}",
                timeout_s=c.up_timeout_s,
            )
            self._discover()
            self._wait_ready(deadline_s=t0_s + c.up_timeout_s)
        except ComposeError as exc:
            raise ComposeError(f"{exc}\n--- the services' last log lines ---\n{self.logs_tail()}") from None
        self.up_s = time.monotonic() - t0_s

    def _check_adoptable(self, containers: list) -> None:
        """A project found up is used only if it runs what the config asks for: else one line
        naming every difference and the command that fixes it."""
        c = self.config
        verifiers = [x for x in containers if x.labels.get(ROLE_LABEL) == "verifier" and x.status == "running"]
        edges = edges_in_order(x for x in containers if x.labels.get(ROLE_LABEL) == "edge" and x.status == "running")
        mismatches = adopt_mismatches(c, verifiers[0] if verifiers else None, edges[: c.n_edges])
        problems = [text for _, text in mismatches]
        if len(verifiers) != 1:
            problems.insert(0, f"verifiers running {len(verifiers)}, wanted 1")
        if len(edges) < c.n_edges:
            problems.insert(0, f"edges running {len(edges)}, the experiment's {c.n_edges}")
        if problems:
            fix = fix_command(c, max(c.n_edges, len(edges)), also=[v for variables, _ in mismatches for v in variables])
            raise ComposeError(
                f"the running compose project {c.project!r} does not match the experiment: {'; '.join(problems)}; "
                f"fix: `{fix}`, or `docker compose -p {c.project} down` and the sweep brings up its own"
            )

    def _ensure_image(self) -> None:
        c = self.config
        present = bool(self._client.images.list(name=c.image))
        if c.build == "never" and not present:
            raise ComposeError(f"image {c.image} is missing and build='never': run scripts/build_images.sh")
        if c.build == "always" or not present:
            log.info("building %s with %s", c.image, BUILD_SCRIPT)
            run_command(
                ["bash", str(BUILD_SCRIPT)],
                env={**os.environ, "DSD_IMAGE": c.image},
                timeout_s=c.build_timeout_s,
                what="scripts/build_images.sh",
            )

    def _discover(self) -> None:
        c = self.config
        containers = self.project_containers()  # running or not: a dead one is named below
        verifiers = [x for x in containers if x.labels.get(ROLE_LABEL) == "verifier"]
        edges = edges_in_order(x for x in containers if x.labels.get(ROLE_LABEL) == "edge")
        if len(verifiers) != 1 or len(edges) < c.n_edges or (self.owned and len(edges) != c.n_edges):
            raise ComposeError(
                f"project {c.project!r} has {len(verifiers)} verifier(s) and {len(edges)} edge(s); "
                f"expected 1 and {c.n_edges}"
            )
        edges = edges[: c.n_edges]  # an adopted project may run more: the first ones are used
        stopped = sorted(x.name for x in [*verifiers, *edges] if x.status != "running")
        if stopped:
            raise ComposeError(f"containers stopped while starting: {stopped}")
        self.verifier_container, self.edge_containers = verifiers[0], edges
        self.edges = [
            EdgeHandle(
                client_id=i,
                control_url=f"http://{self.container_ip(x)}:{EDGE_PORT}",
                name=x.name,
                token=container_token(x),
            )
            for i, x in enumerate(edges)
        ]

    def _wait_ready(self, deadline_s: float) -> None:
        """Poll every service's /health from the host until each answers with its role; notice a
        container that stopped. Docker's own healthchecks are too dear for this: each is an exec
        costing ~0.1 s of CPU, and 17 containers checked every 2 s took about half of a
        2-core host (compose.yaml checks every 30 s instead)."""
        pending = {
            self.verifier_container.name: (
                f"http://{self.container_ip(self.verifier_container)}:{VERIFIER_PORT}",
                "verifier",
            )
        }
        pending.update({h.name: (h.control_url, "edge") for h in self.edges})
        next_crash_check_s = 0.0
        while True:
            for name, (url, role) in list(pending.items()):
                if _answers_health(url, role):
                    del pending[name]
            if not pending:
                return
            now_s = time.monotonic()
            if now_s >= next_crash_check_s:
                stopped = sorted(x.name for x in self._containers_in_use(reload=True) if x.status != "running")
                if stopped:
                    raise ComposeError(f"containers stopped while starting: {stopped}")
                next_crash_check_s = now_s + 2.0
            if now_s > deadline_s:
                raise ComposeError(f"not healthy within {self.config.up_timeout_s} s: {sorted(pending)}")
            time.sleep(_POLL_INTERVAL_S)

    # ---- what is running -------------------------------------------------------------------------

    def _containers_in_use(self, reload: bool = False) -> list:
        """The verifier and the edges this testbed drives (an adopted project may have more)."""
        containers = [x for x in [self.verifier_container, *self.edge_containers] if x is not None]
        for container in containers if reload else []:
            try:
                container.reload()
            except docker.errors.NotFound:
                raise ComposeError(f"container {container.name} was removed while in use") from None
        return containers

    def project_containers(self) -> list:
        return self._client.containers.list(all=True, filters={"label": project_labels(self.config.project)})

    def container_ip(self, container) -> str:
        networks = container.attrs["NetworkSettings"]["Networks"]
        name = f"{self.config.project}_{NETWORK_KEY}"
        if name not in networks or not networks[name]["IPAddress"]:
            raise ComposeError(f"{container.name} has no address on network {name} (it has {sorted(networks)})")
        return networks[name]["IPAddress"]

    def logs_tail(self, lines: int = 20) -> str:
        try:
            return self.compose("logs", "--no-color", "--timestamps", "--tail", str(lines), timeout_s=60)
        except ComposeError as exc:
            return f"(no logs: {exc})"

    def facts(self) -> dict:
        """For a sweep's sidecar: what ran, on which engine, shaped how."""
        version = self._client.version()
        image = self._client.images.get(self.config.image)
        return {
            "launcher": "compose",
            "project": self.config.project,
            "image": self.config.image,
            "image_id": image.id,
            "engine_version": version.get("Version"),
            "engine_api_version": version.get("ApiVersion"),
            "subnet": self.config.subnet,
            "adopted": not self.owned,
            "up_s": self.up_s,
            "shaper": self.shaper,
            "shaper_reason": self.shaper_reason,
            "verifier": self.verifier_container.name if self.verifier_container else None,
            "edges": [h.name for h in self.edges],
        }

    def pin_containers(self, sets: dict, everything: list[int]) -> dict:
        """Each container's cpuset (`docker update --cpuset-cpus`, the cgroup a container's every
        process lives in, kept across a restart): the verifier's set, edge i's ("edge{i}") set,
        every usable CPU for a role the plan has none for. Returns {container: the CPUs its main
        process may run on, read back from the kernel}."""
        applied = {}
        for role, container in [
            ("verifier", self.verifier_container),
            *((f"edge{h.client_id}", x) for h, x in zip(self.edges, self.edge_containers)),
        ]:
            if container is None:
                continue
            cpus = sets.get(role, everything)
            self._cpusets_before.setdefault(container.name, container.attrs["HostConfig"].get("CpusetCpus") or "")
            container.update(cpuset_cpus=",".join(str(c) for c in cpus))
            container.reload()
            pid = container.attrs["State"].get("Pid") or 0
            applied[container.name] = sorted(os.sched_getaffinity(pid)) if pid else []
        return applied

    # ---- links -----------------------------------------------------------------------------------

    def shape(self, rtt_ms_per_edge: list) -> list[LinkState]:
        """One RTT (ms) or one LinkSpec per edge."""
        if len(rtt_ms_per_edge) != len(self.edges):
            raise ValueError(
                f"rtt_ms_per_edge must have one RTT per edge ({len(self.edges)}), got {len(rtt_ms_per_edge)}"
            )
        specs = [link_keys.as_spec(link) for link in rtt_ms_per_edge]  # validates each value
        self._close_shaper()
        verifier = endpoint_from_container(self.verifier_container)
        edge_links = [
            Link(name=f"edge{h.client_id}", edge=endpoint_from_container(x), verifier=verifier, spec=spec)
            for h, x, spec in zip(self.edges, self.edge_containers, specs)
        ]
        shaper = Shaper(ShaperConfig(backend=self.config.shaper_backend, verify_count=self.config.verify_count))
        self.link_records = shaper.apply(edge_links)  # on failure it has removed what it made
        self._shaper = shaper
        self.shaper = self.link_records[0].backend
        self.shaper_reason = self.link_records[0].backend_reason
        return [link_rows.link_state(r) for r in self.link_records]

    def measure(self) -> list[LinkState]:
        """Measure the shaped links again now (echo probes from each edge), e.g. after a run."""
        if self._shaper is None:
            raise RuntimeError("no links are shaped: call shape() first")
        self.link_records = self._shaper.verify()
        return [link_rows.link_state(r) for r in self.link_records]

    def local_shaper(self) -> Shaper | None:
        return self._shaper

    @property
    def link_shaper(self):
        """The netem Shaper of the links shaped now (a link schedule changes them through it)."""
        if self._shaper is None:
            raise RuntimeError("no links are shaped: call shape() first")
        return self._shaper

    def check(self) -> None:
        """Raise if shaping stopped working (a dead NFQUEUE daemon drops every packet of its links)."""
        if self._shaper is not None:
            self._shaper.check()

    def heal(self) -> list[str]:
        """Before a retry: drop broken shaping (the next shape() resolves the veths again and
        re-applies it), restart every container that stopped or does not answer /health, then
        find the containers again (a restarted one may have a new address and veth)."""
        healed = []
        if self._shaper is not None and self._shaper.failures():
            healed.append(f"removed dead shaping ({self._shaper.failures()[0][:120]}); the next point re-applies it")
            self._close_shaper()
        urls = (
            {
                self.verifier_container.id: (
                    f"http://{self.container_ip(self.verifier_container)}:{VERIFIER_PORT}",
                    "verifier",
                )
            }
            if self.verifier_container
            else {}
        )
        urls.update({x.id: (h.control_url, "edge") for h, x in zip(self.edges, self.edge_containers)})
        for container in self._containers_in_use(reload=True):
            url, role = urls.get(container.id, ("", ""))
            if container.status == "running" and url and _answers_health(url, role):
                continue
            was = container.status
            container.restart(timeout=10)
            healed.append(f"restarted container {container.name} (was {was})")
        if healed:
            self._discover()
            self._wait_ready(deadline_s=time.monotonic() + self.config.up_timeout_s)
        return healed

    def app_delay_ms(self, client_id: int) -> float:
        if not 0 <= client_id < len(self.edges):
            raise ValueError(f"client_id must be in [0, {len(self.edges)}), got {client_id!r}")
        return 0.0  # the link itself is shaped

    # ---- teardown --------------------------------------------------------------------------------

    def _close_shaper(self) -> None:
        shaper, self._shaper = self._shaper, None
        if shaper is not None:
            shaper.close()

    def close(self) -> None:
        """Shaping first (rules, daemon), then the logs and `compose down` if we brought the
        project up; every step runs even if one before it failed."""
        errors: list[str] = []
        _step(errors, "shaper", self._close_shaper)
        if not self.owned:
            _step(errors, "restoring the cpusets", self._restore_cpusets)
        if self.owned:
            _step(errors, "saving the logs", self._save_logs)
            _step(
                errors,
                "compose down",
                self.compose,
                "down",
                "--remove-orphans",
                "--timeout",
                "10",
                timeout_s=self.config.down_timeout_s,
            )
            left = _step(errors, "cleanup by label", cleanup_project, self.config.project, self._client)
            if left:
                errors.append(f"compose down left {left}; removed them by label")
            self.owned = False
        self.edges, self.edge_containers, self.verifier_container = [], [], None
        self._client.close()
        if errors:
            raise ComposeError("teardown incomplete: " + "; ".join(errors))

    def _restore_cpusets(self) -> None:
        """An adopted project's containers get back the cpusets they had before pin_containers
        (an empty one meant every online CPU; this process's own mask may be pinned narrower)."""
        everything = Path("/sys/devices/system/cpu/online").read_text().strip()
        for container in [self.verifier_container, *self.edge_containers]:
            if container is not None and container.name in self._cpusets_before:
                container.update(cpuset_cpus=self._cpusets_before[container.name] or everything)
        self._cpusets_before = {}

    def _save_logs(self) -> None:
        if self.config.log_dir:
            path = Path(self.config.log_dir) / f"compose-{self.config.project}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.logs_tail(lines=100_000))

    # ---- docker compose --------------------------------------------------------------------------

    def compose(self, *args: str, timeout_s: float) -> str:
        c = self.config
        env = {**os.environ, **c.compose_env(), "DSD_TOKEN": self._token, "COMPOSE_BAKE": "false"}
        return run_command(
            ["docker", "compose", "--project-name", c.project, "--file", c.compose_file, *args],
            env=env,
            timeout_s=timeout_s,
            what=f"docker compose {args[0]}",
        )


def _step(errors: list[str], what: str, fn, *args, **kwargs):
    """One teardown step; a failure is noted and the next steps still run."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported together at the end
        errors.append(f"{what}: {exc}")
        return None


def _answers_health(url: str, role: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=_HEALTH_TIMEOUT_S) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return False
    return body.get("status") == "ok" and body.get("role") == role
