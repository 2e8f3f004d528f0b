"""A compose project through Docker, apart from any one testbed: the engine's client, the
project's containers by their compose labels (edges in container-number order), the token a
container was started with, running `docker compose` as a child process, and removing what a
crashed run left (the launcher: orchestrator/launchers/compose.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess

import docker

from orchestrator.launchers.compose_config import REPO, ComposeError

log = logging.getLogger(__name__)

PROJECT_LABEL = "com.docker.compose.project"
NUMBER_LABEL = "com.docker.compose.container-number"


def docker_client():
    """The Docker SDK's client, or a ComposeError saying the engine does not answer."""
    try:
        return docker.from_env(timeout=60)
    except docker.errors.DockerException as exc:
        raise ComposeError(
            f"the Docker engine does not answer ({exc}); start it as root with `bash scripts/docker_setup.sh`"
        ) from exc


def project_labels(project: str) -> list[str]:
    """The labels of a compose project's service containers. The project label alone is not
    enough: `compose build` stamps it on the image, so a container merely run from the image
    (`docker run`, a build step FROM it) carries it too; only compose numbers its containers."""
    return [f"{PROJECT_LABEL}={project}", NUMBER_LABEL]


def project_is_up(project: str) -> bool:
    """Whether the compose project has any container (running or not)."""
    client = docker_client()
    try:
        return bool(client.containers.list(all=True, filters={"label": project_labels(project)}))
    finally:
        client.close()


def edges_in_order(containers) -> list:
    """Edge i is client i: compose's container numbers order them."""
    return sorted(containers, key=lambda x: int(x.labels.get(NUMBER_LABEL, "0")))


def cleanup_project(project: str = "dsdbed", client=None) -> list[str]:
    """Remove a project's containers and networks by their compose label (after a crash, or what
    `compose down` left); returns what it removed. Shaping leftovers: `netem.cleanup_leftovers`."""
    own_client = client is None
    client = client or docker.from_env(timeout=60)
    removed = []
    try:
        for container in client.containers.list(all=True, filters={"label": project_labels(project)}):
            container.remove(force=True)
            removed.append(f"container {container.name}")
        for network in client.networks.list(filters={"label": f"{PROJECT_LABEL}={project}"}):
            network.remove()
            removed.append(f"network {network.name}")
    finally:
        if own_client:
            client.close()
    return removed


def run_command(argv: list[str], env: dict[str, str], timeout_s: float, what: str) -> str:
    """Run a command in its own process group; kill the group at the timeout. Returns its output."""
    log.info("running %s", " ".join(argv))
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise ComposeError(f"{what} did not finish within {timeout_s} s: {out[-3000:]}") from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        raise ComposeError(f"{what} exited {proc.returncode}: {out[-3000:]}")
    return out


def container_token(container) -> str | None:
    """The DSD_TOKEN a service container was started with (what it requires), or None."""
    for item in container.attrs.get("Config", {}).get("Env") or []:
        name, _, value = item.partition("=")
        if name == "DSD_TOKEN":
            return value.strip() or None
    return None
