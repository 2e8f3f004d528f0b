"""A helper process (the NFQUEUE daemon): own process group, readiness handshake that notices a
crash, and a stop that kills the whole group.

Protocol: the child reads its JSON config from stdin (one line), prints one line ``READY <json>``
once it serves, and on SIGTERM prints ``STATS <json>`` and exits 0. With ``keep_stdin`` the pipe
stays open and `send` writes further JSON lines (the NFQUEUE daemon's timed setting changes). Its stderr goes to a log file
(``/tmp/dsdbed-*.log``) so a crash can be reported without a pipe that might fill up; the file
is removed when the child is stopped, its tail kept for error messages.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from netem import nsutil
from netem.names import PREFIX

# The project root, so `python -m netem.X` works from any working directory.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class ChildError(RuntimeError):
    """The child did not start, or died."""


class Child:
    def __init__(self, proc: subprocess.Popen, name: str, log_path: str):
        self.proc = proc
        self.name = name
        self.log_path = log_path
        self.ready_info: dict = {}
        self.stats: dict | None = None
        self._final_log = ""

    @classmethod
    def start(
        cls,
        module: str,
        config: dict,
        *,
        tag: str,
        netns: str | None = None,
        ready_timeout_s: float = 10.0,
        keep_stdin: bool = False,
    ) -> Child:
        name = module.rsplit(".", 1)[-1]
        fd, log_path = tempfile.mkstemp(prefix=f"{PREFIX}-{name}-", suffix=".log")
        argv = nsutil.in_netns(netns, [sys.executable, "-m", module, "--tag", tag])
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (_PROJECT_ROOT, os.environ.get("PYTHONPATH")) if p)
        )
        with os.fdopen(fd, "w") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,  # own process group: our Ctrl-C does not reach it first
                cwd=_PROJECT_ROOT,
            )
        child = cls(proc, name, log_path)
        try:
            proc.stdin.write(json.dumps(dict(config, parent_pid=os.getpid())).encode() + b"\n")
            if keep_stdin:
                proc.stdin.flush()
            else:
                proc.stdin.close()
                proc.stdin = None  # communicate() would flush it later
            child._wait_ready(ready_timeout_s)
        except BaseException:
            child.stop()
            raise
        return child

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict) -> None:
        """One JSON line to a child started with keep_stdin (blocks while its pipe is full)."""
        if self.proc.stdin is None:
            raise ChildError(f"{self.name} was started without keep_stdin")
        self.check()
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait(timeout=5)
            self.check()
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, max_chars: int = 2000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-max_chars:]
        except FileNotFoundError:
            return self._final_log[-max_chars:]

    def check(self) -> None:
        if not self.alive():
            raise ChildError(
                f"{self.name} (pid {self.pid}) died with exit code {self.proc.returncode}: {self.log_tail()}"
            )

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if ready:
                line = self.proc.stdout.readline().decode(errors="replace")
                if line.startswith("READY"):
                    self.ready_info = json.loads(line[len("READY") :] or "{}")
                    return
                if line == "":  # EOF: the child is gone
                    self.proc.wait(timeout=5)
                    self.check()
            self.check()
        raise ChildError(f"{self.name} not ready after {timeout_s} s: {self.log_tail()}")

    def stop(self, timeout_s: float = 5.0) -> dict | None:
        """SIGTERM to the group, then SIGKILL; returns the child's final STATS if it printed any."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.stdin = None
        if self.alive():
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                out, _ = self.proc.communicate(timeout=timeout_s)
                self.stats = _parse_stats(out.decode(errors="replace"))
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout_s)
        else:
            # Dead already (or killed): a member of its group may still linger.
            _signal_group(self.proc.pid, signal.SIGKILL)
        if self.proc.stdout and not self.proc.stdout.closed:
            self.proc.stdout.close()
        # The log goes with the process; its tail stays readable for error messages.
        self._final_log = self.log_tail()
        Path(self.log_path).unlink(missing_ok=True)
        return self.stats


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child leads its own group (start_new_session)
    except ProcessLookupError:
        pass


def _parse_stats(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("STATS"):
            return json.loads(line[len("STATS") :])
    return None


# ---- child side -----------------------------------------------------------------------------


def child_preamble() -> dict:
    """Read the config; die with our parent (a crashed parent must not leave us holding packets).

    NOTE: PR_SET_PDEATHSIG fires when the parent *thread* exits: start children from a thread
    that lives as long as the shaping should (the main thread, normally).
    """
    import ctypes

    config = json.loads(_read_line(0))
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != config["parent_pid"]:  # the parent died before prctl took effect
        sys.exit("parent gone before start")
    return config


def _read_line(fd: int) -> bytes:
    """One line from a raw fd, byte by byte: a buffered reader could swallow the next lines,
    which the child reads from the same fd later (keep_stdin)."""
    out = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            return bytes(out)
        out += byte


def announce(kind: str, info: dict) -> None:
    sys.stdout.write(f"{kind} {json.dumps(info)}\n")
    sys.stdout.flush()
