"""Every measured country pair predicted from a sweep's fitted model, and the matrix drawn."""

import pandas as pd

from orchestrator.report import geo_matrix
from orchestrator.spec.experiment import experiment_from_dict, load_experiment
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import run_experiment


def test_geography_experiment_lists_the_sampled_pairs_mean_rtts():
    experiment = load_experiment("experiments/geography.toml")
    assert [round(r, 3) for r in experiment.rtt_ms] == [round(r, 3) for _, _, r in geo_matrix.sample_pairs()]


def test_matrix_predicts_every_pair_and_checks_the_measured_ones(tmp_path):
    experiment = experiment_from_dict(
        {
            "name": "geo",
            "launcher": "sim",
            "modes": ["ar", "colocated", "sync", "pipelined"],
            "rtt_ms": [4.943, 212.134],
            "gamma": [4],
            "requests": 2,
            "max_new_tokens": 32,
            "prompt_tokens": 8,
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic", "alpha": 0.8},
        }
    )
    run_experiment(experiment, tmp_path / "geo", resume=False)
    analyze_sweep(tmp_path / "geo")
    figures = geo_matrix.write(tmp_path / "geo", n_countries=10)
    pairs = pd.read_csv(tmp_path / "geo" / "geo_matrix.csv")
    assert len(pairs) == figures["pairs"] > 6000
    # Farther is never better for DSD; a 5 ms pair gains over cloud AR on this profile, IN-US does not.
    ordered = pairs.sort_values("rtt_ms")
    assert ordered["dsd_speedup_vs_ar"].is_monotonic_decreasing
    in_us = pairs[(pairs.country_a == "IN") & (pairs.country_b == "US")].iloc[0]
    assert in_us["dsd_speedup_vs_ar"] < 1 and 0 < figures["dsd_beats_ar_pct"] < 10
    check = pd.read_csv(tmp_path / "geo" / "geo_check.csv")
    assert set(check["pair"]) == {"CZ-CZ", "IN-US"} and check["err_pct"].abs().max() < 15
    assert (tmp_path / "geo" / "geo_matrix.png").stat().st_size > 20_000
