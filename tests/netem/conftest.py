"""Fixtures for the netem tests: root checks, one shared test network, the backend on record."""
from __future__ import annotations

import os

import pytest

BACKENDS_SEEN: dict[str, str] = {}


HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(items):
    # A root test without root is skipped here, not failed; CI runs as root.
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root (network namespaces, iptables, tc)")
        for item in items:
            if "root" in item.keywords and str(item.path).startswith(HERE):
                item.add_marker(skip)


def note_backend(record_property, backend: str, reason: str) -> None:
    """Print and record which backend shaped the links of a test (its junit property too)."""
    record_property("netem_backend", backend)
    BACKENDS_SEEN[backend] = reason
    print(f"netem backend: {backend} ({reason})")


def pytest_terminal_summary(terminalreporter):
    for backend, reason in BACKENDS_SEEN.items():
        terminalreporter.write_line(f"netem backend used: {backend} ({reason})")
