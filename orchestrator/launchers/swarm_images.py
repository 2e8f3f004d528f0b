"""The testbed's image on every swarm node without a registry.

`distribute` copies the image from the engine that built it to every node engine that lacks it
(`docker save` streamed into `docker load`, the Docker API of each node: ``tcp://``, ``ssh://``
or ``unix://``) and reads the image ID back on each. `missing_on` asks the swarm itself which
nodes cannot run the image: a global probe service (``true``) of the image *by ID*, one task per
ready node; a node without that exact image rejects its task with "No such image". The stack
then names the image by ID too, so no node ever looks for it in a registry, and a node with a
stale image under the same tag cannot run the wrong one.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import docker

from dsd.checks import is_number

PROBE_SUFFIX = "imagecheck"


def image_id(client: docker.DockerClient, image: str) -> str:
    """The image's ID (``sha256:...``) on that engine; a clear error if it has none."""
    try:
        return client.images.get(image).id
    except docker.errors.ImageNotFound:
        raise RuntimeError(
            f"image {image} is not on {client.api.base_url}: scripts/build_images.sh, then "
            "scripts/build_shaper_image.sh"
        ) from None


def distribute(image: str, source: docker.DockerClient, node_urls: list[str]) -> list[str]:
    """Every node engine gets the image (by ID) if it lacks it, all nodes at once; returns one
    line per node."""
    wanted = image_id(source, image)
    with ThreadPoolExecutor(max_workers=max(1, len(node_urls)), thread_name_prefix="dsd-image") as pool:
        return list(pool.map(lambda url: _copy_to(image, wanted, source, url), node_urls))


def _copy_to(image: str, wanted: str, source: docker.DockerClient, url: str) -> str:
    try:
        node = docker.DockerClient(base_url=url, timeout=10)
        name = node.info()["Name"]
    except (docker.errors.DockerException, OSError) as exc:
        # A node that is down runs no task; missing_on checks every node that is ready.
        return f"{url}: does not answer, skipped ({type(exc).__name__})"
    node.api.timeout = 900
    try:
        if _has(node, wanted):
            return f"{name}: has {wanted[:19]}"
        t0_s = time.monotonic()
        node.api.load_image(source.api.get_image(image, chunk_size=1 << 20))
        if not _has(node, wanted):
            raise RuntimeError(f"node {name} ({url}): loaded {image}, but its ID is not {wanted}")
        return f"{name}: loaded {wanted[:19]} in {time.monotonic() - t0_s:.1f} s"
    finally:
        node.close()


def _has(client: docker.DockerClient, wanted_id: str) -> bool:
    try:
        return client.images.get(wanted_id).id == wanted_id
    except docker.errors.ImageNotFound:
        return False


def missing_on(
    manager: docker.DockerClient, image_ref: str, name: str, labels: dict[str, str], timeout_s: float = 60.0
) -> list[str]:
    """Hostnames of the ready nodes that cannot run ``image_ref`` (an ID), by a global probe
    service named ``name`` (removed again)."""
    if not (is_number(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a number > 0, got {timeout_s!r}")
    ready = {
        n.id: n.attrs["Description"]["Hostname"]
        for n in manager.nodes.list()
        if n.attrs["Status"]["State"] == "ready" and n.attrs["Spec"].get("Availability") == "active"
    }
    service = manager.services.create(
        image_ref,
        ["true"],
        name=name,
        labels=labels,
        mode="global",
        restart_policy=docker.types.RestartPolicy(condition="none"),
    )
    try:
        deadline_s = time.monotonic() + timeout_s
        while True:
            tasks = {t["NodeID"]: t for t in service.tasks() if t["NodeID"] in ready}
            final = {
                node: t
                for node, t in tasks.items()
                if t["Status"]["State"] in ("complete", "failed", "rejected", "shutdown")
            }
            if len(final) == len(ready):
                return sorted(
                    ready[node] for node, t in final.items() if "No such image" in (t["Status"].get("Err") or "")
                )
            if time.monotonic() > deadline_s:
                waiting = sorted(ready[node] for node in ready if node not in final)
                raise RuntimeError(f"the image check did not finish on {waiting} within {timeout_s:.0f} s")
            time.sleep(0.5)
    finally:
        service.remove()
