"""Reaching into a network namespace: run a command there, or open a socket there.

A namespace is named by a path: ``/run/netns/NAME`` for one we created, ``/proc/PID/ns/net`` for
a container's. ``None`` means the namespace this process runs in (the host, for Docker).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import subprocess
import threading

NETNS_RUN_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def netns_path(name_or_path: str | None) -> str | None:
    if name_or_path is None or "/" in name_or_path:
        return name_or_path
    return f"{NETNS_RUN_DIR}/{name_or_path}"


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    """argv that runs `argv` inside `netns`.

    nsenter execs the command in place (no fork for --net alone), so the pid we get is the
    command's own. Only the network namespace changes: /sys still shows the host (add -m).
    """
    if netns is None:
        return list(argv)
    return ["nsenter", f"--net={netns_path(netns)}", "--", *argv]


def run(
    argv: list[str],
    netns: str | None = None,
    check: bool = True,
    timeout_s: float = 30.0,
    input_text: str | None = None,
) -> subprocess.CompletedProcess:
    proc = subprocess.run(in_netns(netns, argv), capture_output=True, text=True, timeout=timeout_s, input=input_text)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} (netns {netns}) exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def call_in_netns(netns: str | None, fn):
    """fn() run with this process's view switched to `netns`; returns its result.

    setns() moves only the calling thread, so a throwaway thread enters the namespace, calls fn
    and dies; the caller's thread never moves. What fn opens there (a socket, a /proc/sys/net
    file) stays in that namespace.
    """
    if netns is None:
        return fn()
    result: dict = {}

    def enter_and_call() -> None:
        try:
            fd = os.open(netns_path(netns), os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=enter_and_call, name="dsdbed-setns")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def socket_in_netns(
    netns: str | None, family: int = socket.AF_INET, kind: int = socket.SOCK_DGRAM, proto: int = 0
) -> socket.socket:
    """A socket that lives in `netns`, used from this process."""
    return call_in_netns(netns, lambda: socket.socket(family, kind, proto))


def write_sysctl(netns: str | None, key: str, value: str) -> None:
    """Set a net.* sysctl of `netns` (/proc/sys/net resolves through the opener's namespace)."""
    path = "/proc/sys/" + key.replace(".", "/")

    def write() -> None:
        with open(path, "w") as f:
            f.write(value)

    call_in_netns(netns, write)


def netns_inode(netns: str | None) -> int:
    return os.stat(netns_path(netns) or "/proc/self/ns/net").st_ino
