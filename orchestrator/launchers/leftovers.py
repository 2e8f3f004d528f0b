"""Leftovers of a dead run, found by our prefix or label: shaping (netem: daemons, iptables
chains, qdiscs, namespaces, interfaces), service processes (their SERVICE_MARK environment
variable) and compose containers and networks (compose.yaml's dsdbed.* labels), the swarm
launcher's stacks (dsdbed.stack) and the nodes of a swarm on this host (swarm_local.py: its node
containers, with the volumes holding their engines' storage, and their network).

`find()` only looks (a sweep on a network launcher refuses to start over leftovers);
`clean()` removes them and is idempotent: a second call returns [].
"""

from __future__ import annotations

import os

from netem.cleanup import stop_processes
from orchestrator.launchers.processes import OWNER_MARK, SERVICE_MARK, process_identity

CONTAINER_LABEL = "dsdbed.role"  # compose.yaml labels every service with it
NETWORK_LABEL = "dsdbed.testbed"


class LeftoversFound(RuntimeError):
    pass


class AnotherRunLive(LeftoversFound):
    """Another process's network run is going on: not leftovers, and not to be cleaned up."""


def find(docker: bool = True, services: bool = True) -> list[str]:
    from netem.cleanup import find_leftovers

    found = [f"service process {pid}" for pid in service_processes()] if services else []
    found += find_leftovers()
    if docker:
        found += [f"{kind} {name}" for kind, name, _ in _docker_objects()]
        found += _swarm_stacks(remove=False)
    return found


def refuse_if_any(services: bool = True) -> None:
    """Before a sweep on a network launcher: leftovers of a dead run (a daemon, rules, a
    namespace, a service) would distort or block it. Containers are the compose launcher's to
    judge (it uses a matching project that is up, and refuses one that does not match), so they
    are not counted here; nor, with services=False (compose), service processes on the host,
    which containers do not meet. Services of a live orchestrator (a sweep or test running
    beside this one) are never leftovers (``service_processes``); nor are the namespaces, rules
    and daemons of another live run (``netem.owners``), but two network runs at once would
    distort each other's timing, so this one waits for that one instead of starting beside it."""
    from netem.cleanup import live_runs

    others = live_runs()
    if others:
        raise AnotherRunLive(
            f"another network run is going on: {'; '.join(others)}; wait for it to end "
            "(two at once would distort each other's timing). `dsdbed cleanup` leaves a live "
            "run alone; stop its process to end it"
        )
    found = find(docker=False, services=services)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise LeftoversFound(f"leftovers of a dead run: {shown}; remove them with `dsdbed cleanup`")


def clean() -> list[str]:
    from netem import cleanup_leftovers

    removed = _stop_service_processes()
    removed += cleanup_leftovers()
    removed += _swarm_stacks(remove=True)  # services first: their containers would stay
    for kind, name, obj in _docker_objects():
        obj.remove(**({"force": True, "v": True} if kind == "container" else {}))  # v: a swarm node's engine storage
        removed.append(f"{kind} {name}")
    return removed


def service_processes() -> list[int]:
    """Pids of processes carrying our service mark (started by orchestrator.launchers.processes)
    whose orchestrator is gone: a service of a run that is still alive (a sweep or a test beside
    this one) is not a leftover. A service without an owner mark (an older checkout's) counts."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        marks = _marks(int(entry))
        if SERVICE_MARK in marks and not (
            marks.get(OWNER_MARK) and process_identity(int(marks[OWNER_MARK].split(":")[0])) == marks[OWNER_MARK]
        ):
            pids.append(int(entry))
    return pids


def _marks(pid: int) -> dict[str, str]:
    """Our marks in a process's environment ({} if it has none or is gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    marks = {}
    for var in variables:
        name, _, value = var.partition(b"=")
        if name.decode(errors="replace") in (SERVICE_MARK, OWNER_MARK):
            marks[name.decode()] = value.decode(errors="replace")
    return marks


def _stop_service_processes() -> list[str]:
    pids = service_processes()
    stop_processes(pids, grace_s=5.0)
    return [f"service process {pid}" for pid in pids]


def _docker_objects() -> list[tuple[str, str, object]]:
    """(kind, name, object) of our containers, then our networks; [] where Docker is absent."""
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception:  # noqa: BLE001 - no engine here: nothing of ours can be in it
        return []
    containers = client.containers.list(all=True, filters={"label": CONTAINER_LABEL})
    networks = client.networks.list(filters={"label": NETWORK_LABEL})
    return [("container", c.name, c) for c in containers] + [("network", n.name, n) for n in networks]


def _swarm_stacks(remove: bool) -> list[str]:
    """What the swarm launcher left (stacks carrying its dsdbed.stack label), removed if asked;
    [] where Docker is absent or the engine is no swarm manager. The manager is the one a sweep
    is given (DSD_SWARM_MANAGER, docs/launchers.md), else this machine's engine."""
    try:
        import docker

        from orchestrator.launchers.swarm_config import OUR_LABEL
        from orchestrator.launchers.swarm_leftovers import cleanup_stack, find_stack

        manager = os.environ.get("DSD_SWARM_MANAGER", "")
        client = docker.DockerClient(base_url=manager, timeout=30) if manager else docker.from_env(timeout=30)
        if not client.info().get("Swarm", {}).get("ControlAvailable"):
            return []
    except Exception:  # noqa: BLE001 - no engine or no swarm here: nothing of ours in it
        return []
    try:
        stacks = {
            obj.attrs.get("Spec", obj.attrs).get("Labels", {}).get(OUR_LABEL)
            for obj in client.services.list(filters={"label": OUR_LABEL})
            + client.networks.list(filters={"label": OUR_LABEL})
        }
        stacks |= {c.labels.get(OUR_LABEL) for c in client.containers.list(all=True, filters={"label": OUR_LABEL})}
        stacks.discard(None)
        return [
            item
            for stack in sorted(stacks)
            for item in (cleanup_stack(stack, client) if remove else find_stack(stack, client))
        ]
    finally:
        client.close()
