"""Snapshots of what the host holds, to show that a testbed leaves nothing behind."""

from __future__ import annotations

import os
import subprocess

import docker


def host_state() -> dict[str, set[str]]:
    """What a testbed could leave behind, each as a set of lines."""
    from netem.cleanup import our_processes

    def lines(argv: list[str]) -> set[str]:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return {line.strip() for line in out.stdout.splitlines() if line.strip()}

    links = {line.split(":")[1].strip().split("@")[0] for line in lines(["ip", "-o", "link", "show"])}
    compose_processes = {p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, b"docker-compose")}
    return {
        "containers (docker ps -a)": lines(["docker", "ps", "-a", "--format", "{{.Names}} {{.Image}}"]),
        "networks (docker network ls)": lines(["docker", "network", "ls", "--format", "{{.Name}}"]),
        "iptables -S": lines(["iptables", "-w", "-S"]),
        # Only the backend probe's namespace can come from us; netem's own tests, which may run
        # at the same time on a developer's machine, make others.
        "ip netns list": {n for n in lines(["ip", "netns", "list"]) if n.split()[0].endswith("-probe")},
        "interfaces (ip link)": links,
        # Ours are this process's children, or orphans; other test sessions on a developer's
        # machine run daemons of their own.
        "netem daemons": {str(pid) for pid in our_processes() if _ppid(pid) in (os.getpid(), 1)},
        "docker compose processes": compose_processes,
    }


def _cmdline_has(pid: str, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle in f.read()
    except OSError:
        return False


def new_since(before: dict[str, set[str]]) -> dict[str, set[str]]:
    after = host_state()
    return {key: after[key] - before[key] for key in before if after[key] - before[key]}


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


PROJECT_LABELS = ["com.docker.compose.project=dsdbed", "com.docker.compose.container-number"]


def project_containers() -> list[str]:
    client = docker.from_env()
    try:
        return [c.name for c in client.containers.list(all=True, filters={"label": PROJECT_LABELS})]
    finally:
        client.close()
