"""benchmarks/serving.py runs end to end on the sim and prints its figures (the network run is
the same sweep code on the services; tests/orchestrator/test_serving_network.py covers them)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_serving_benchmark_on_sim_prints_its_figures(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "benchmarks/serving.py", "--launcher", "sim", "--duration-s", "40",
                           "--ensemble-repeats", "4", "--out", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = dict(pair.partition("=")[::2] for pair in done.stdout.strip().splitlines()[-1].split())
    keys = ["edges", "max_rate_ar_rps", "max_rate_colocated_rps", "max_rate_dsd_rps", "dsd_over_colocated",
            "predicted_dsd_over_colocated", "rate_err_pct", "goodput_at_max_dsd", "attainment_err_pts",
            "steady_err_pct", "single_run_sd_pct", "load_avg_1m"]
    assert list(figures)[:1] == ["edges"] and all(k in figures for k in keys)
    assert int(figures["edges"]) >= 16
    rates = [float(figures[k]) for k in ("max_rate_ar_rps", "max_rate_colocated_rps", "max_rate_dsd_rps")]
    assert 0 < rates[0] < rates[1] < rates[2]           # DSD sustains the most, cloud AR the least
    assert float(figures["dsd_over_colocated"]) == pytest.approx(float(figures["predicted_dsd_over_colocated"]),
                                                                rel=0.15)
    assert 0 < float(figures["goodput_at_max_dsd"]) <= rates[2]
    # on the sim the measured figures are the ensemble's, the prediction the closed form's
    assert float(figures["rate_err_pct"]) == float(figures["steady_err_pct"])
    assert float(figures["attainment_err_pts"]) <= 2.0 + 1e-9    # the search stops within 2 points
