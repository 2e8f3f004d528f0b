"""A service process is a leftover only when the orchestrator that started it is gone: a live
sweep or test beside this one must not block it or be cleaned up by it."""

import os
import subprocess
import sys
import time

from orchestrator.launchers import leftovers
from orchestrator.launchers.processes import OWNER_MARK, SERVICE_MARK, process_identity


def _marked_sleeper(owner: str | None) -> subprocess.Popen:
    env = {**os.environ, SERVICE_MARK: "test-leftover-owner"}
    env.pop(OWNER_MARK, None)
    if owner is not None:
        env[OWNER_MARK] = owner
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until its environment is readable
        if os.path.exists(f"/proc/{proc.pid}/environ") and open(f"/proc/{proc.pid}/environ", "rb").read():
            break
        time.sleep(0.05)
    return proc


def _dead_identity() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(proc.pid)
    proc.wait()
    return identity or f"{proc.pid}:1"


def test_a_service_whose_orchestrator_lives_is_not_a_leftover_one_whose_orchestrator_died_is():
    live = _marked_sleeper(process_identity(os.getpid()))
    orphan = _marked_sleeper(_dead_identity())
    unowned = _marked_sleeper(None)
    try:
        found = leftovers.service_processes()
        assert live.pid not in found
        assert orphan.pid in found
        assert unowned.pid in found  # an older checkout's service: counted, to be safe
    finally:
        for proc in (live, orphan, unowned):
            proc.kill()
            proc.wait()


def test_process_identity_is_stable_for_a_live_process_and_none_for_a_missing_one():
    mine = process_identity(os.getpid())
    assert mine is not None and mine.startswith(f"{os.getpid()}:")
    assert process_identity(os.getpid()) == mine
    assert process_identity(2**22 + 7) is None  # above pid_max: no such process
