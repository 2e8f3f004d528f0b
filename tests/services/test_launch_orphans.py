"""A service started by services.launch does not outlive the process that started it: a pytest
or benchmark killed with SIGKILL (no finalizer runs) takes its verifier and edge with it, and
while they live they carry the marks `dsdbed cleanup` looks for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.launchers.processes import OWNER_MARK, SERVICE_MARK
from orchestrator.launchers.leftovers import _marks, service_processes
from services.launch import REPO

PARENT = textwrap.dedent("""
    import sys, tempfile, time
    from services.launch import launch
    from tests.services.harness import synthetic_args
    service = launch("services.verifier", synthetic_args(), tempfile.mkdtemp())
    print(service.process.pid, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _marks_once_set(pid: int, timeout_s: float = 15.0) -> dict:
    """The process's marks once its environment carries them: read right after the fork, a
    loaded machine may show the environment from before the exec (bounded wait, then as is)."""
    deadline = time.monotonic() + timeout_s
    marks = _marks(pid)
    while SERVICE_MARK not in marks and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
        marks = _marks(pid)
    return marks


@pytest.mark.skipif(not __import__("shutil").which("setpriv"), reason="setpriv (util-linux) is missing")
def test_a_service_dies_with_the_process_that_started_it():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        marks = _marks_once_set(child)
        assert marks.get(SERVICE_MARK, "").startswith("services.verifier-"), marks
        assert marks[OWNER_MARK].split(":")[0] == str(parent.pid)
        assert child not in service_processes()  # its owner lives: not a leftover
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the verifier outlived the killed process that started it"
    finally:
        parent.kill()
        parent.wait(timeout=10)
        try:
            os.killpg(child, signal.SIGKILL)
        except (NameError, ProcessLookupError):
            pass
