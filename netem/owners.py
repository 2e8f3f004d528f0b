"""Which process owns a run tag's kernel objects, so a live run's are never called leftovers.

A run tags what it creates (`netem.names`: namespaces ``dsdbed-<tag>-*``, chains ``DSDBED-<tag>``,
daemons ``--tag dsdbed-<tag>``). Whoever creates them first `claim`s the tag: a file
``<owners dir>/<tag>.owner`` holds the creator's identity, "pid:start time" (a pid alone may be
reused). `live_tags` are the tags whose owner still runs and is another process than the caller:
a second sweep or `dsdbed cleanup` must leave those alone. A tag without a file, or whose owner
is gone, is a dead run's, as before. The caller's own tags count as its own to clean (a test that
plays a crash in-process, or a run cleaning up after itself).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from netem import names

OWNER_SUFFIX = ".owner"
_claims: dict[str, int] = {}  # tag -> how many objects of this process hold the claim
_lock = threading.Lock()


def owners_dir() -> Path:
    """/run/dsdbed where we may write there (root: the same place /run/netns is), else a temp dir."""
    if os.access("/run", os.W_OK):
        return Path("/run") / names.PREFIX
    return Path(tempfile.gettempdir()) / f"{names.PREFIX}-owners"


def process_identity(pid: int) -> str | None:
    """ "pid:start time in clock ticks since boot" (/proc/PID/stat field 22); None if no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
    return f"{pid}:{int(fields[19])}"


def claim(tag: str) -> None:
    """Record this process as the owner of tag's objects (before the first one is created)."""
    names.check_tag(tag)
    with _lock:
        if _claims.get(tag, 0) == 0:
            folder = owners_dir()
            folder.mkdir(mode=0o755, exist_ok=True)
            (folder / f"{tag}{OWNER_SUFFIX}").write_text(process_identity(os.getpid()) or "")
        _claims[tag] = _claims.get(tag, 0) + 1


def release(tag: str) -> None:
    """Drop one claim; the file goes with the last (after the tag's objects are removed)."""
    with _lock:
        left = _claims.get(tag, 0) - 1
        if left > 0:
            _claims[tag] = left
            return
        _claims.pop(tag, None)
    (owners_dir() / f"{tag}{OWNER_SUFFIX}").unlink(missing_ok=True)


def live_tags() -> dict[str, int]:
    """{tag: owner pid} for every tag whose owner runs and is not this process."""
    live = {}
    for tag, identity in _owner_files().items():
        head = identity.split(":")[0]
        pid = int(head) if head.isdigit() else 0
        if pid and pid != os.getpid() and process_identity(pid) == identity:
            live[tag] = pid
    return live


def remove_dead_owner_files() -> list[str]:
    """The owner files of tags whose owner is gone (or is this process and no longer claims them)."""
    removed = []
    live = live_tags()
    for tag in _owner_files():
        if tag in live or tag in _claims:
            continue
        path = owners_dir() / f"{tag}{OWNER_SUFFIX}"
        path.unlink(missing_ok=True)
        removed.append(f"file {path}")
    return removed


def describe(tag: str, pid: int) -> str:
    """One line for a person: the tag and what its owner runs."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").replace("\0", " ").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        argv = "?"
    return f"run {tag} of process {pid} ({argv[:80]})"


def tag_of(kind: str, name: str) -> str | None:
    """The run tag in one of our objects' names: a namespace, a chain or a process marker."""
    if kind == "netns" and name.startswith(names.PREFIX + "-"):
        return name[len(names.PREFIX) + 1 :].split("-")[0]
    if kind == "chain" and name.startswith(names.CHAIN_PREFIX):
        return name[len(names.CHAIN_PREFIX) :].split("-")[0]
    if kind == "process" and name.startswith(names.PREFIX + "-"):
        return name[len(names.PREFIX) + 1 :]
    return None


def ifname_is_live(ifname: str, live: dict[str, int]) -> bool:
    """An interface name carries its tag after the 5-letter prefix (``dsdbi<tag>``, ``dsdbp<tag>a``)."""
    return any(tag in ifname[len(names.IFNAME_PREFIX) :] for tag in live)


def _owner_files() -> dict[str, str]:
    folder = owners_dir()
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.glob(f"*{OWNER_SUFFIX}"):
        try:
            found[path.name[: -len(OWNER_SUFFIX)]] = path.read_text().strip()
        except FileNotFoundError:
            continue  # its run ended while we looked
    return found
