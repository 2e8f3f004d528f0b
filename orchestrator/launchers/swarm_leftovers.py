"""What a swarm stack leaves, found and removed by its labels (``com.docker.stack.namespace``,
``dsdbed.stack``): on the manager (services, secrets, containers, networks) and on each node's
engine, which removes its tasks after the manager removes the services. The launcher's close()
and `dsdbed cleanup` after a crash use it (the launcher: orchestrator/launchers/swarm.py)."""

from __future__ import annotations

import contextlib
import time

import docker

from orchestrator.launchers.swarm_config import OUR_LABEL, STACK_LABEL, SwarmError


def find_stack(stack: str, client, services: bool = True) -> list[str]:
    """What of a stack exists: services, containers, networks, secrets with its labels
    (services=False: containers and networks only, what a worker node's engine can list)."""
    found = []
    for label in (f"{STACK_LABEL}={stack}", f"{OUR_LABEL}={stack}"):
        if services:
            found += [f"service {s.name}" for s in client.services.list(filters={"label": label})]
            found += [f"secret {s.name}" for s in client.secrets.list(filters={"label": label})]
        found += [f"container {x.name}" for x in client.containers.list(all=True, filters={"label": label})]
        found += [f"network {n.name}" for n in client.networks.list(filters={"label": label})]
    return sorted(set(found))


def cleanup_stack(stack: str = "dsdbed", client=None, timeout_s: float = 60.0) -> list[str]:
    """Remove everything of a stack by label (idempotent); returns what it removed. Services and
    containers first: a network or secret in use cannot go until their tasks are gone."""
    own = client is None
    client = client or docker.from_env(timeout=120)
    removed = []
    try:
        for label in (f"{STACK_LABEL}={stack}", f"{OUR_LABEL}={stack}"):
            # Each may go meanwhile (`docker stack rm` removes a service's containers itself).
            for s in client.services.list(filters={"label": label}):
                with contextlib.suppress(docker.errors.NotFound):
                    s.remove()
                    removed.append(f"service {s.name}")
            for x in client.containers.list(all=True, filters={"label": label}):
                with contextlib.suppress(docker.errors.NotFound):
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


def wait_nodes_clean(stack: str, node_hosts, timeout_s: float = 60.0) -> list[str]:
    """On every node engine given that still answers (a lost one does not): wait until none of
    the stack's containers and networks is left (the nodes remove their tasks after the
    manager removes the services). Returns what is still there after timeout_s."""
    left: list[str] = []
    for url in node_hosts:
        try:
            node = docker.DockerClient(base_url=url, timeout=10)
        except docker.errors.DockerException:
            continue
        try:
            deadline_s = time.monotonic() + timeout_s
            while True:
                found = find_stack(stack, node, services=False)
                if not found or time.monotonic() > deadline_s:
                    left += [f"{url}: {x}" for x in found]
                    break
                time.sleep(1.0)
        except (docker.errors.DockerException, OSError):
            pass  # went away meanwhile: nothing of it left running
        finally:
            node.close()
    return [f"left on nodes: {left}"] if left else []
