"""What a suite's result folder holds (orchestrator/spec/suite.py): its members as suite.json
records them, and the crossovers of a sweep in it, read without the analysis or the plots."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.spec.suite import SUITE_RECORD


def suite_members(out: Path) -> tuple[str, list[dict]]:
    """The suite's name and its members ({"name", "file", "folder"}) as suite.json records them."""
    record = json.loads((Path(out) / SUITE_RECORD).read_text())
    return record["suite"], record["experiments"]


def sweep_crossovers(folder: Path, pair: str | None = None) -> dict:
    """The crossovers (name -> summary row) of a sweep folder, or of a suite folder's sweep on the
    pair named ``pair`` (its folder's name; None: the first sweep's)."""
    summary = json.loads((Path(folder) / "summary.json").read_text())
    if "runs" not in summary:
        return summary.get("crossovers", {})
    runs = [r for r in summary["runs"] if pair is None or r["pair"] == pair]
    return runs[0]["crossovers"] if runs else {}
