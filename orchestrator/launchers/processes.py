"""Service processes: started in their own process group (optionally inside a network
namespace), polled until healthy or crashed, killed as a group on exit."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from dsd.backends.factory import BackendConfig
from dsd.profiles import HardwareProfile
from orchestrator import http_client

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_args(backend: BackendConfig, profile: HardwareProfile | None) -> list[str]:
    """The services' command-line flags for a backend config (services/compute.py)."""
    args = ["--backend", backend.kind]
    if backend.kind == "hf":
        if backend.target_path:
            args += ["--target-path", backend.target_path, "--draft-path", backend.draft_path]
        else:
            args += ["--pair-path", backend.pair_path]
        args += ["--dtype", backend.dtype]
    else:
        args += ["--alpha", str(backend.alpha), "--vocab-size", str(backend.vocab_size),
                 "--synthetic-seed", str(backend.seed), "--eos-prob", str(backend.eos_prob)]
    if profile is not None:
        values = {k: v for k, v in asdict(profile).items() if k != "sources"}
        args += ["--profile-json", json.dumps(values)]
    return args


def write_token_file(folder: Path) -> Path:
    """A fresh random token shared by one testbed's verifier and edges, readable by us alone."""
    path = Path(folder) / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)         # O_CREAT's mode applies only to a new file
        f.write(secrets.token_urlsafe(32))
    return path


class ServiceProcess:
    def __init__(self, name: str, argv: list[str], health_url: str, netns: str | None = None,
                 log_dir: Path | None = None) -> None:
        self.name = name
        self.health_url = health_url
        prefix = ["nsenter", f"--net={netns}", "--"] if netns else []
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="dsdbed-logs-"))
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(prefix + [sys.executable, "-m", *argv], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=REPO, env=env)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} while starting; "
                                   f"log: {self.log_path}\n{self.log_tail()}")
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
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout_s)
        self._log.close()
