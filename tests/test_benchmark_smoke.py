"""The benchmarks run end to end and print their figures: each in its smallest configuration, as
a user would start it (a subprocess, the repository on the path). Benchmarks check the issues'
goals; one that stopped running after a refactor (repeatability.py did, for a removed keyword)
would otherwise go unnoticed until someone needs its figure. Where the smallest configuration is
deterministic (the sim launcher), its figures are checked too."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600


def _run(args: list[str], tmp_path: Path) -> dict:
    """Runs a benchmark; returns its last line's key=value figures (floats where they parse)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    figures = {}
    for pair in last.split():
        key, _, value = pair.partition("=")
        try:
            figures[key] = float(value)
        except ValueError:
            figures[key] = value
    return figures


@pytest.mark.slow
def test_theory_agreement_on_sim_meets_the_out_of_sample_goals(tmp_path):
    figures = _run(["benchmarks/theory_agreement.py", "--launcher", "sim", "--repeats", "2",
                    "--out", str(tmp_path / "sweep")], tmp_path)
    assert figures["launcher"] == "sim"
    # Virtual time: what is left is the closed form against the protocol (no harness, no load).
    assert figures["oos_latency_err_p50_pct"] <= 3 and figures["oos_latency_err_max_pct"] <= 8, figures
    assert figures["oos_crossover_err_pct"] <= 10, figures
    assert math.isfinite(figures["crossover_ci_width_ms"])


@pytest.mark.slow
@pytest.mark.model
def test_repeatability_prints_both_spreads(tmp_path):
    figures = _run(["benchmarks/repeatability.py", "--runs", "2", "--requests", "1", "--max-new-tokens", "8"],
                   tmp_path)
    assert figures["spread_pinned_pct"] >= 0 and figures["spread_unpinned_pct"] >= 0
    assert figures["median_pinned_ms"] > 0 and figures["runs"] == 2


@pytest.mark.slow
def test_paper_table_on_sim_measures_every_cell(tmp_path):
    figures = _run(["benchmarks/paper_table.py", "--launcher", "sim", "--out", str(tmp_path / "cells")], tmp_path)
    assert figures["cells"] == 12 and figures["cells_ok"] == 12, figures


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_link_schedule_follows_its_schedule(tmp_path):
    figures = _run(["benchmarks/link_schedule.py", "--probes", "50"], tmp_path)
    assert figures["backend"] in ("nfqueue", "kernel-netem") and "goals_met" in figures


@pytest.mark.parametrize("script", ["benchmarks/shaper_fidelity.py", "benchmarks/compose_scale.py"])
def test_dry_runs_print_their_plan(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, script, "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
