"""The house rules the field's own tools check (configured in pyproject.toml): ruff's lint rules
and its formatter's layout, import-linter's contracts for the layers and the core's and the
orchestrator's packages, and mypy's types on dsd and services. A failure prints the tool's own
report."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_tool(name: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    tool = BIN / name if (BIN / name).exists() else shutil.which(name)
    if tool is None:
        pytest.fail(f"{name} is not installed: scripts/setup.sh installs it with the test extra")
    return subprocess.run([str(tool), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_ruff_finds_nothing():
    done = run_tool("ruff", "check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_finds_nothing_to_change():
    done = run_tool("ruff", "format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_import_contracts_are_kept():
    done = run_tool("lint-imports")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout and "kept" in done.stdout


def test_mypy_finds_nothing():
    """[tool.mypy] names what it checks (dsd strictly, services). Without its cache (.mypy_cache)
    it reads torch's and transformers' annotations too: ~45 s of CPU, minutes on a busy host."""
    done = run_tool("mypy", timeout_s=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
