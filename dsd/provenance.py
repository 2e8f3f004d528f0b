"""Where a result came from: the git commit of the checkout this code runs from, and whether it
had uncommitted changes; both None outside a git checkout (an installed copy, a container)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The checkout's HEAD commit; None where unknown."""
    return _git("rev-parse", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether the checkout has uncommitted changes; None where unknown."""
    status = _git("status", "--porcelain")
    return None if status is None else bool(status)
