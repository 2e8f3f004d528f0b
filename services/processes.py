"""Starting a service as a child process, shared by services.launch (tests, benchmarks) and the
orchestrator's launchers: a free loopback port, and `python -m MODULE ...` in its own process
group (optionally inside a network namespace), killed as a group.

Each child dies with the thread that started it (a parent-death signal set by `setpriv`, kept
across the exec of nsenter and python), and carries SERVICE_MARK and OWNER_MARK in its
environment so that `dsdbed cleanup` finds one that survived its owner anyway.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

from netem.owners import process_identity

REPO = Path(__file__).resolve().parents[1]
SERVICE_MARK = "DSDBED_SERVICE"  # environment variable every service process carries
OWNER_MARK = "DSDBED_OWNER"  # and the process that started it: "pid:start time"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_service(
    argv: list[str], mark: str, log: IO[bytes], env: dict[str, str] | None = None, netns: str | None = None
) -> subprocess.Popen:
    """`python -m *argv` in its own process group, in ``netns`` if given, output to ``log``;
    ``mark``: its SERVICE_MARK; ``env``: added to this process's environment.
    NOTE: the parent-death signal fires when the *thread* that started the child exits: start
    and restart services from the thread that runs them."""
    prefix = ["setpriv", "--pdeathsig", "SIGTERM", "--"] if shutil.which("setpriv") else []
    if netns:
        prefix += ["nsenter", f"--net={netns}", "--"]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        **(env or {}),
        SERVICE_MARK: mark,
        OWNER_MARK: process_identity(os.getpid()) or "",
    }
    return subprocess.Popen(
        prefix + [sys.executable, "-m", *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=REPO,
        env=env,
    )


def kill_group(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``timeout_s``; waits for the child."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout_s)
