"""Service processes: started in their own process group (optionally inside a network
namespace; services.processes), polled until healthy or crashed, killed as a group on exit,
restarted by a heal. Each dies with the orchestrator and carries SERVICE_MARK in its environment
so that `dsdbed cleanup` finds one that survived anyway.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from dsd.backends.factory import BackendConfig
from dsd.costs.profiles import HardwareProfile
from netem.owners import process_identity
from orchestrator.common import http_client
from services.processes import OWNER_MARK, REPO, SERVICE_MARK, free_port, kill_group, start_service

__all__ = [
    "OWNER_MARK",
    "REPO",
    "SERVICE_MARK",
    "ServiceProcess",
    "backend_args",
    "free_port",
    "heal_services",
    "process_identity",
    "write_token_file",
]


def backend_args(backend: BackendConfig, profile: HardwareProfile | None) -> list[str]:
    """The services' command-line flags for a backend config (services/compute.py): the config
    whole, made portable (a service need not see this host's files: containers, other hosts)."""
    args = ["--backend-json", backend.portable().to_json()]
    if profile is not None:
        values = {k: v for k, v in asdict(profile).items() if k != "sources"}
        args += ["--profile-json", json.dumps(values)]
    return args


def write_token_file(folder: Path) -> Path:
    """A fresh random token shared by one testbed's verifier and edges, readable by us alone."""
    path = Path(folder) / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode applies only to a new file
        f.write(secrets.token_urlsafe(32))
    return path


class ServiceProcess:
    def __init__(
        self, name: str, argv: list[str], health_url: str, netns: str | None = None, log_dir: Path | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.netns = netns
        self.health_url = health_url
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="dsdbed-logs-"))
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # a restart appends: the crash stays readable
        self.restarts = 0
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        # start and restart services from the thread that runs the sweep (start_service's NOTE)
        return start_service(self.argv, self.name, self._log, env={"PYTHONPATH": str(REPO)}, netns=self.netns)

    def healthy(self, timeout_s: float = 5.0) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            return http_client.request("GET", self.health_url, timeout_s=timeout_s)[0] == 200
        except OSError:
            return False

    def restart(self, ready_timeout_s: float) -> None:
        """Stop what is left of the process (its group) and start it again with the same argv."""
        self._kill_group()
        self._log.write(f"\n--- restarted by the orchestrator (restart {self.restarts + 1}) ---\n".encode())
        self._log.flush()
        self.restarts += 1
        self.proc = self._spawn()
        self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.proc.returncode} while starting; "
                    f"log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                if http_client.request("GET", self.health_url, timeout_s=1.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not healthy after {timeout_s:.0f} s; log: {self.log_path}\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        self._kill_group(timeout_s)
        self._log.close()

    def _kill_group(self, timeout_s: float = 5.0) -> None:
        kill_group(self.proc, timeout_s)


def heal_services(processes: list[ServiceProcess], ready_timeout_s: float) -> list[str]:
    """Restart every service that died or stopped answering /health; returns what was done."""
    healed = []
    for process in processes:
        if not process.healthy():
            code = process.proc.poll()
            process.restart(ready_timeout_s)
            healed.append(
                f"restarted {process.name} ({'exit code ' + str(code) if code is not None else 'not answering'})"
            )
    return healed
