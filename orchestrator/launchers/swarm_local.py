"""A multi-node Docker Swarm on this one host, for the swarm launcher's tests and for trying it:
N nodes, each a privileged Docker-in-Docker container running its own dockerd (the image of
scripts/build_node_image.sh), joined to one swarm whose manager is node 0. The host's engine
only runs the node containers; it joins no swarm.

    with LocalSwarm(LocalSwarmConfig(n_nodes=3)) as swarm:
        swarm.manager_url          # tcp://10.233.0.2:2375, what the launcher is given
        swarm.node_urls            # every node's engine, for distributing the image
        swarm.kill_node(2)         # a node lost: its container killed

Declared (`plan`), realised, read back (every node ready in the manager's list), torn down in
`close`. The nodes sit on an internal bridge network of their own: they reach each other and the
host, nothing else (a node's engine that tried a registry would fail at once). Their engines
listen on that network without TLS, which is fine for containers on one host and nowhere else.
Every object carries the ``dsdbed.role`` / ``dsdbed.testbed`` labels, so `dsdbed cleanup`
(orchestrator/launchers/leftovers.py) removes what a crashed run left; the engines' storage is
each container's anonymous volume, removed with it.
"""

from __future__ import annotations

import ipaddress
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import docker

from dsd.checks import is_int, is_number

ENGINE_PORT = 2375
NODE_ROLE = "swarm-node"
NETWORK_ROLE = "swarm-nodes"


class LocalSwarmError(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalSwarmConfig:
    n_nodes: int = 3
    image: str = "dsdbed-node:latest"  # scripts/build_node_image.sh
    prefix: str = "dsdbed-node"
    subnet: str = "10.233.0.0/24"
    verifier_node: int = 1  # labelled dsdbed.role=verifier: a worker, so the manager takes edges
    heartbeat_s: float = 1.0  # the manager notices a lost node after a few of these
    up_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not (is_int(self.n_nodes) and 1 <= self.n_nodes <= 16):
            raise ValueError(f"n_nodes must be a whole number in [1, 16], got {self.n_nodes!r}")
        if not (is_int(self.verifier_node) and 0 <= self.verifier_node < self.n_nodes):
            raise ValueError(f"verifier_node must be in [0, {self.n_nodes - 1}], got {self.verifier_node!r}")
        ipaddress.IPv4Network(self.subnet)
        for name in ("heartbeat_s", "up_timeout_s"):
            if not (is_number(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a number > 0, got {getattr(self, name)!r}")

    def node_name(self, i: int) -> str:
        return f"{self.prefix}-{i}"

    def node_ip(self, i: int) -> str:
        return str(ipaddress.IPv4Network(self.subnet).network_address + 2 + i)


# Linux capability numbers, as /proc/PID/status counts them (CAP_CHOWN = 0, ...).
CAPABILITIES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
    "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO "
    "SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME "
    "SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG "
    "WAKE_ALARM BLOCK_SUSPEND AUDIT_READ"
).split()  # the ones Engine 20.10 knows


def capabilities(bounding_mask: int) -> list[str]:
    """The capability names in a bounding-set mask. Pure."""
    return [name for bit, name in enumerate(CAPABILITIES) if bounding_mask >> bit & 1]


def plan(config: LocalSwarmConfig, bounding_mask: int) -> list[dict]:
    """The node containers as the Docker SDK's create() arguments. Pure. What `--privileged` gives
    a nested engine, spelt out: every capability this host holds (`--privileged` asks for all, and
    fails where the host itself lacks one, as a host that is a container may), no seccomp, AppArmor
    profile, every device node makable; the entrypoint remounts /sys, /proc/sys and the cgroups rw."""
    return [
        {
            "image": config.image,
            "name": config.node_name(i),
            "hostname": config.node_name(i),
            "command": [f"--host=tcp://{config.node_ip(i)}:{ENGINE_PORT}"],
            "cap_add": capabilities(bounding_mask),
            "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
            "device_cgroup_rules": ["c *:* rmw", "b *:* rmw"],
            "labels": {"dsdbed.role": NODE_ROLE, "dsdbed.testbed": config.prefix},
        }
        for i in range(config.n_nodes)
    ]


def bounding_set() -> int:
    """This process's capability bounding set (the host's engine runs with no more)."""
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("CapBnd:")), 16)


class LocalSwarm:
    def __init__(self, config: LocalSwarmConfig) -> None:
        self.config = config
        self.host = docker.from_env(timeout=120)
        self.network = None
        self.containers: dict[int, object] = {}
        self.engines: dict[int, docker.DockerClient] = {}
        self.node_ids: dict[int, str] = {}
        try:
            self._bring_up()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def manager_url(self) -> str:
        return self.url(0)

    @property
    def node_urls(self) -> list[str]:
        return [self.url(i) for i in range(self.config.n_nodes)]

    def url(self, i: int) -> str:
        return f"tcp://{self.config.node_ip(i)}:{ENGINE_PORT}"

    def _bring_up(self) -> None:
        c = self.config
        if self.host.containers.list(all=True, filters={"label": f"dsdbed.testbed={c.prefix}"}):
            raise LocalSwarmError(f"containers labelled dsdbed.testbed={c.prefix} exist: `dsdbed cleanup` first")
        pool = docker.types.IPAMPool(subnet=c.subnet, gateway=str(ipaddress.IPv4Network(c.subnet).network_address + 1))
        self.network = self.host.networks.create(
            c.prefix,
            driver="bridge",
            internal=True,
            ipam=docker.types.IPAMConfig(pool_configs=[pool]),
            labels={"dsdbed.testbed": NETWORK_ROLE},
        )
        for i, args in enumerate(plan(c, bounding_set())):
            container = self.host.containers.create(**args)
            self.network.connect(container, ipv4_address=c.node_ip(i))
            self.host.api.disconnect_container_from_network(container.id, "bridge")
            container.start()
            self.containers[i] = container
        deadline_s = time.monotonic() + c.up_timeout_s
        for i in range(c.n_nodes):
            self.engines[i] = self._wait_engine(i, deadline_s)
        manager = self.engines[0]
        heartbeat_ns = int(c.heartbeat_s * 1e9)
        manager.swarm.init(
            advertise_addr=c.node_ip(0), listen_addr=f"{c.node_ip(0)}:2377", dispatcher_heartbeat_period=heartbeat_ns
        )
        token = manager.swarm.attrs["JoinTokens"]["Worker"]
        for i in range(1, c.n_nodes):
            self.engines[i].swarm.join(
                remote_addrs=[f"{c.node_ip(0)}:2377"],
                join_token=token,
                advertise_addr=c.node_ip(i),
                listen_addr=f"{c.node_ip(i)}:2377",
            )
        self.node_ids = {i: self.engines[i].info()["Swarm"]["NodeID"] for i in range(c.n_nodes)}
        self._wait_ready(deadline_s)
        node = manager.nodes.get(self.node_ids[c.verifier_node])
        spec = node.attrs["Spec"]
        spec["Labels"] = {**spec.get("Labels", {}), "dsdbed.role": "verifier"}
        node.update(spec)

    def _wait_engine(self, i: int, deadline_s: float) -> docker.DockerClient:
        while True:
            try:
                client = docker.DockerClient(base_url=self.url(i), timeout=120)  # asks the engine's version
                client.ping()
                return client
            except Exception as exc:  # noqa: BLE001 - an engine still starting refuses or resets
                self.containers[i].reload()
                if self.containers[i].status != "running":
                    logs = self.containers[i].logs(tail=10).decode(errors="replace")
                    raise LocalSwarmError(f"node {self.config.node_name(i)} exited: {logs}") from exc
                if time.monotonic() > deadline_s:
                    raise LocalSwarmError(f"the engine of {self.config.node_name(i)} did not answer: {exc}") from exc
            time.sleep(0.5)

    def _wait_ready(self, deadline_s: float) -> None:
        while True:
            states = {
                n.attrs["Description"]["Hostname"]: n.attrs["Status"]["State"] for n in self.engines[0].nodes.list()
            }
            if len(states) == self.config.n_nodes and set(states.values()) == {"ready"}:
                return
            if time.monotonic() > deadline_s:
                raise LocalSwarmError(f"swarm nodes not ready: {states}")
            time.sleep(0.5)

    def kill_node(self, i: int) -> None:
        """A node lost without warning: its container (engine, tasks and all) killed."""
        self.containers[i].kill()

    def close(self) -> None:
        """Remove the node containers (their volumes with them) and the network; idempotent."""
        for client in self.engines.values():
            client.close()
        self.engines = {}
        nodes = self.host.containers.list(all=True, filters={"label": f"dsdbed.testbed={self.config.prefix}"})
        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:  # each volume holds GBs
            list(pool.map(lambda container: container.remove(force=True, v=True), nodes))
        self.containers = {}
        for network in self.host.networks.list(names=[self.config.prefix]):
            if network.attrs.get("Labels", {}).get("dsdbed.testbed") == NETWORK_ROLE:
                network.remove()
        self.network = None
        self.host.close()
