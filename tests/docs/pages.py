"""Helpers for the docs tests: where the docs are, building the site, reading the key and column
tables of a page, and a small sim sweep to check pages against real outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_HEADING = re.compile(r"^(#{2,3}) (.*)$")
_ROW_NAMES = re.compile(r"`([^`]+)`")


def build_site(site_dir: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the project's site into site_dir (a warning fails it)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def documented_names(page: str) -> dict[str, set[str]]:
    """Section heading -> the names a page documents there: every backticked name in the first
    column of the section's tables (`a`, `b` in one cell documents both)."""
    sections: dict[str, set[str]] = {}
    current = ""
    for line in (DOCS / page).read_text().splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = heading.group(2).strip()
            sections.setdefault(current, set())
            continue
        if line.startswith("|") and not re.match(r"^\|[\s:|-]+\|?$", line):
            first = line.split("|")[1]
            sections.setdefault(current, set()).update(_ROW_NAMES.findall(first))
    return sections


def section(sections: dict[str, set[str]], marker: str) -> set[str]:
    """The names of the one section whose heading contains marker."""
    found = [names for heading, names in sections.items() if marker in heading]
    assert len(found) == 1, f"expected one section heading containing {marker!r}, found {len(found)}"
    return found[0]


def section_text(page: str, marker: str) -> str:
    """The text of the one section of a page whose heading contains marker, up to the next heading."""
    lines = (DOCS / page).read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if _HEADING.match(line) and marker in line]
    assert len(starts) == 1, f"expected one section heading containing {marker!r}, found {len(starts)}"
    end = next((i for i in range(starts[0] + 1, len(lines)) if _HEADING.match(lines[i])), len(lines))
    return "\n".join(lines[starts[0] : end])


def small_sim_sweep(out: Path) -> Path:
    """A few seconds of the crossover grid on the synthetic backend and the sim launcher, analysed
    and reported: every output file a sweep writes on sim, report.html included."""
    from orchestrator.spec.experiment import experiment_from_dict
    from orchestrator.report.html import write_report
    from orchestrator.running.run import run_experiment

    experiment = experiment_from_dict(
        {
            "name": "docs-check",
            "launcher": "sim",
            "profile": "toy-edge-cloud",
            "rtt_ms": [0, 10, 20],
            "gamma": [4],
            "requests": 2,
            "max_new_tokens": 40,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "alpha": 0.8},
        }
    )
    run_experiment(experiment, out, resume=False)
    write_report(out, "html")
    return out
