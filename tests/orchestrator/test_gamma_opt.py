"""The optimal gamma against the RTT (orchestrator/analysis/gamma_opt.py): the argmin and its bootstrap
shares on frames with a known answer, and a sim sweep against the closed form."""

import json

import numpy as np
import pandas as pd
import pytest

from dsd.analytic import latency_model as lm
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis import gamma_opt
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.report.html import write_report
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import run_experiment

KEYS = ["mode", "rtt_ms", "gamma"]


def test_argmin_table_picks_the_least_latency_per_rtt_and_the_smaller_gamma_on_a_tie():
    cells = pd.DataFrame(
        [
            ("sync", 0.0, 1, 9.0),
            ("sync", 0.0, 2, 7.0),
            ("sync", 0.0, 4, 8.0),
            ("sync", 50.0, 1, 60.0),
            ("sync", 50.0, 2, 30.0),
            ("sync", 50.0, 4, 30.0),
            ("sync", 90.0, 2, np.nan),
            ("sync", 90.0, 4, 50.0),
        ],
        columns=KEYS + ["per_token_ms"],
    )
    table = gamma_opt.argmin_table(cells, ["mode", "rtt_ms"])
    assert table["gamma_best"].tolist() == [2, 2, 4]
    assert table["per_token_ms_best"].tolist() == [7.0, 30.0, 50.0]


def test_replicate_shares_count_the_argmin_per_replicate_and_keep_gammas_above_the_share_floor():
    n = 1000
    # gamma 2 wins in 900 replicates, 4 in 80, 8 in 20 (2%: below the 2.5% floor)
    g2 = np.full(n, 10.0)
    g4 = np.where(np.arange(n) < 80, 9.0, 11.0)
    g8 = np.where((np.arange(n) >= 80) & (np.arange(n) < 100), 8.0, 12.0)
    replicates = {
        ("sync", 20.0, 2): g2,
        ("sync", 20.0, 4): g4,
        ("sync", 20.0, 8): g8,
        ("sync", 40.0, 2): g2 + 5,
        ("sync", 40.0, 4): g2 - 1,
        ("sync", 40.0, 8): g2 + 1,
    }
    shares = gamma_opt.replicate_shares(replicates, KEYS, ["mode", "rtt_ms"]).set_index("rtt_ms")
    assert shares.loc[20.0, "gamma_shares"] == "2:0.900 4:0.080 8:0.020"
    assert shares.loc[20.0, "gamma_set"] == "2 4"
    assert (shares.loc[20.0, "gamma_set_low"], shares.loc[20.0, "gamma_set_high"]) == (2, 4)
    assert shares.loc[40.0, "gamma_shares"] == "4:1.000" and shares.loc[40.0, "gamma_set"] == "4"


def test_model_argmin_is_the_closed_forms_minimum_over_1_to_64():
    alpha, t_draft_s, t_verify_s, rtt_s = 0.8, 0.004, 0.010, 0.080
    gamma, seconds = gamma_opt.model_argmin(lambda g: lm.per_token_sync_dsd_s(alpha, g, t_draft_s, t_verify_s, rtt_s))
    values = {g: lm.per_token_sync_dsd_s(alpha, g, t_draft_s, t_verify_s, rtt_s) for g in range(1, 65)}
    assert seconds == min(values.values()) and values[gamma] == seconds
    assert gamma == 8


SWEEP = {
    "name": "gopt",
    "launcher": "sim",
    "profile": "toy-edge-cloud",
    "modes": ["sync"],
    "rtt_ms": [0, 10, 40, 150],
    "gamma": [1, 2, 4, 8, 12],
    "requests": 16,
    "max_new_tokens": 128,
    "prompt_tokens": 8,
    "backend": {"kind": "synthetic", "alpha": 0.8},
}


@pytest.fixture(scope="module")
def sim_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("gopt") / "s"
    run_experiment(experiment_from_dict(SWEEP), out, resume=False)
    analyze_sweep(out)
    write_report(out)
    return out


def test_sim_sweep_measured_optimal_gamma_grows_with_rtt_and_matches_the_closed_forms_grid_argmin(sim_sweep):
    table = pd.read_csv(sim_sweep / "gamma_opt.csv").sort_values("rtt_ms")
    assert table["rtt_ms"].tolist() == [0, 10, 40, 150] and set(table["mode"]) == {"sync"}
    best = table["gamma_best"].tolist()
    assert best == sorted(best) and best[-1] > best[0]  # grows with the RTT
    grid = [1, 2, 4, 8, 12]
    steps = [
        abs(grid.index(int(m)) - grid.index(int(p)))
        for m, p in zip(table["gamma_best"], table["gamma_best_predicted_grid_oos"])
    ]
    assert max(steps) <= 1 and sum(s == 0 for s in steps) >= 3
    # the predicted choice costs nothing where it is the measured one, and is in the bootstrap set
    assert (table.loc[[s == 0 for s in steps], "penalty_ms"] == 0).all()
    assert table["predicted_in_set"].all()
    # the unrestricted optimum grows too, and the grid's choice is its neighbour on the grid
    assert table["gamma_model_oos"].is_monotonic_increasing
    summary = json.loads((sim_sweep / "summary.json").read_text())
    assert summary["gamma_opt"]["file"] == "gamma_opt.csv" and len(summary["gamma_opt"]["rows"]) == 4
    assert "gamma_opt.png" in summary["plots"] and (sim_sweep / "gamma_opt.png").stat().st_size > 0
    assert "Optimal gamma" in (sim_sweep / "report.html").read_text()


def test_a_sweep_with_one_gamma_writes_no_gamma_opt_files(tmp_path):
    out = tmp_path / "s"
    run_experiment(
        experiment_from_dict({**SWEEP, "gamma": [4], "rtt_ms": [0, 10], "requests": 3, "max_new_tokens": 32}),
        out,
        resume=False,
    )
    analyze_sweep(out)
    assert (out / "summary.json").exists()
    assert not (out / "gamma_opt.csv").exists() and not (out / "gamma_opt.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert "gamma_opt" not in summary and "gamma_opt.png" not in summary["plots"]


def test_the_unrestricted_argmin_uses_one_verify_line_not_a_fitted_table_beside_an_assumed_line():
    # fitted t_verify 11 ms at the swept gammas (client view: overhead), the profile's line says 10 ms
    fitted = ComputeTimes(
        t_draft_edge_s=0.004,
        t_draft_server_s=0.002,
        t_ar_s=0.010,
        t_verify_base_s=0.010,
        t_verify_per_position_s=0.0,
        t_verify_by_gamma_s={1: 0.011, 2: 0.011, 4: 0.011, 8: 0.011},
    )
    times = gamma_opt.times_for_any_gamma(fitted)
    assert times.t_verify_s(3) == pytest.approx(0.011) and times.t_verify_s(4) == pytest.approx(0.011)
    gamma, ms = gamma_opt.model_gamma_s("sync", 80.0, 0.8, fitted)
    assert gamma == gamma_opt.model_argmin(lambda g: lm.per_token_sync_dsd_s(0.8, g, 0.004, 0.011, 0.080))[0]
