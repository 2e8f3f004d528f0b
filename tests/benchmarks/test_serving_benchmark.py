"""benchmarks/serving.py runs end to end on the sim and prints its figures; its network procedure
(each mode from its predicted rate, realisations pooled per rate) ends within 2 points of the
level when the server is faster or slower than predicted (the network run is the same sweep code
on the services; tests/orchestrator/test_serving_network.py covers them)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import serving as bench
from orchestrator.open_loop import sweep as serving
from orchestrator.spec.experiment import load_experiment

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serving_benchmark_on_sim_prints_its_figures(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/serving.py",
            "--launcher",
            "sim",
            "--duration-s",
            "40",
            "--ensemble-repeats",
            "4",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = dict(pair.partition("=")[::2] for pair in done.stdout.strip().splitlines()[-1].split())
    keys = [
        "edges",
        "max_rate_ar_rps",
        "max_rate_colocated_rps",
        "max_rate_dsd_rps",
        "dsd_over_colocated",
        "predicted_dsd_over_colocated",
        "rate_err_pct",
        "goodput_at_max_dsd",
        "attainment_err_pts",
        "steady_err_pct",
        "single_run_sd_pct",
        "load_avg_1m",
    ]
    assert list(figures)[:1] == ["edges"] and all(k in figures for k in keys)
    assert int(figures["edges"]) >= 16
    rates = [float(figures[k]) for k in ("max_rate_ar_rps", "max_rate_colocated_rps", "max_rate_dsd_rps")]
    assert 0 < rates[0] < rates[1] < rates[2]  # DSD sustains the most, cloud AR the least
    assert float(figures["dsd_over_colocated"]) == pytest.approx(
        float(figures["predicted_dsd_over_colocated"]), rel=0.15
    )
    assert 0 < float(figures["goodput_at_max_dsd"]) <= rates[2]
    # on the sim the measured figures are the ensemble's, the prediction the closed form's
    assert float(figures["rate_err_pct"]) == float(figures["steady_err_pct"])
    assert float(figures["attainment_err_pts"]) <= 2.0 + 1e-9  # the search stops within 2 points


def test_realisations_are_pooled_until_a_rate_measures_about_the_requests_asked():
    assert bench.realisations(0.9, 100, 25) == 5  # cloud AR near its knee: ~23 requests per run
    assert bench.realisations(3.5, 100, 25) == 2
    assert bench.realisations(50.0, 100, 25) == 1
    assert bench.realisations(0.01, 100, 25) == bench.MAX_REALISATIONS
    assert bench.realisations(math.nan, 100, 25) == bench.MAX_REALISATIONS


@pytest.mark.parametrize("server_factor", [0.95, 1.0, 1.04])
def test_the_network_procedure_ends_within_two_points_when_the_server_is_off_its_prediction(
    tmp_path, monkeypatch, server_factor
):
    # the prediction on the profile's pass times; the "network" (the sim) serves with every
    # server pass server_factor times as long, as a real host may
    base = load_experiment(bench.EXPERIMENT)
    repeats = {"ar": 5, "colocated": 2, "sync": 2}
    exp = bench.with_load(base, "netns", 5, duration_s=30, warmup_s=5, search_iterations=bench.NET_SEARCH_STEPS)
    serving.write_prediction(tmp_path, exp, serving.serving_times(exp, tmp_path), "netns", repeats)
    true_times = serving.serving_times

    def off_times(experiment, out):
        t = true_times(experiment, out)
        names = ("t_draft_server_s", "t_ar_s", "t_prefill_per_token_s", "t_verify_base_s", "t_verify_per_position_s")
        return dataclasses.replace(t, **{n: getattr(t, n) * server_factor for n in names if getattr(t, n) is not None})

    monkeypatch.setattr(serving, "serving_times", off_times)
    rows = bench.network(base, "sim", tmp_path, 30, 5, repeats)
    assert json.loads((tmp_path / "serving.json").read_text())["prediction_made_before_points"]
    for mode, row in rows.items():
        assert row["repeats"] == repeats[mode]
        assert abs(row["attainment_at_max"] - base.slo.attainment) <= 0.02 + 1e-9, (mode, row)
        assert row["attainment_ci_low"] <= row["attainment_at_max"] <= row["attainment_ci_high"]
        assert abs(row["attainment_rate_rps"] - row["max_rate_rps"]) <= 0.03 * row["max_rate_rps"]
        assert abs(row["rate_err_pct"]) < 10
