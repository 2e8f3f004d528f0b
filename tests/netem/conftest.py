"""Fixtures for the netem tests: one shared test network, the backend on record."""

from __future__ import annotations

BACKENDS_SEEN: dict[str, str] = {}


def note_backend(record_property, backend: str, reason: str) -> None:
    """Print and record which backend shaped the links of a test (its junit property too)."""
    record_property("netem_backend", backend)
    BACKENDS_SEEN[backend] = reason
    print(f"netem backend: {backend} ({reason})")


def pytest_terminal_summary(terminalreporter):
    for backend, reason in BACKENDS_SEEN.items():
        terminalreporter.write_line(f"netem backend used: {backend} ({reason})")
