"""The calibration's alpha is the one that predicts per-token latency: tokens per round of the
rounds the steady-state statistic counts."""

import math

import pandas as pd
import pytest

from dsd.analytic import latency_model as lm
from dsd.modes import predict_per_token_s
from orchestrator.analysis.fits import fit_alpha, fit_alpha_tokens_per_round
from orchestrator.analysis.points import steady_windows
from orchestrator.analysis.predictions import calibrate
from dsd.costs.compute_times import ComputeTimes


def _rounds(
    accepted_by_request: list[list[int]], gamma: int = 4, mode: str = "sync", round_s: float = 0.03
) -> pd.DataFrame:
    """Network-run rounds (receipt times) of one point: request r's round i accepted
    accepted_by_request[r][i] drafts and emitted accepted + 1; one round every round_s."""
    rows = []
    for request, accepted in enumerate(accepted_by_request):
        for index, a in enumerate(accepted):
            t = 10.0 * request + round_s * (index + 1)
            rows.append(
                {
                    "point": f"{mode}_p",
                    "client_id": "edge0",
                    "request_index": request,
                    "round_index": index,
                    "mode": mode,
                    "gamma": gamma,
                    "proposed": gamma,
                    "accepted": a,
                    "emitted": a + 1,
                    "stale": False,
                    "t_draft_start_s": t - round_s,
                    "t_draft_end_s": t - round_s + 0.016,
                    "t_send_s": t - 0.012,
                    "t_receive_s": t,
                    "server_queue_s": 0.0,
                    "server_compute_s": 0.01,
                    "rtt_ms": 0.0,
                }
            )
    return pd.DataFrame(rows)


def test_moment_alpha_reproduces_the_tokens_per_round_it_was_fitted_on():
    rounds = _rounds([[4, 0, 4, 0, 4, 0, 4, 0]])  # all or nothing: far from geometric
    alpha = fit_alpha_tokens_per_round(rounds)
    assert lm.expected_tokens_per_round(alpha, 4) == pytest.approx(rounds["emitted"].mean(), rel=1e-6)
    # Not the maximum-likelihood alpha: these counts are not geometric.
    assert abs(alpha - fit_alpha(rounds)) > 0.05


def test_moment_alpha_at_the_ends_and_without_rounds():
    assert fit_alpha_tokens_per_round(_rounds([[0, 0, 0]])) == 0.0
    assert fit_alpha_tokens_per_round(_rounds([[4, 4, 4]])) == 1.0
    assert math.isnan(fit_alpha_tokens_per_round(_rounds([[1]]).iloc[:0]))


def test_calibration_alpha_leaves_out_the_first_and_the_cut_short_final_round():
    # Every request opens with a round that accepts nothing and ends with one cut short by
    # max_new_tokens (accepted 3 of 4 but emitted only 2); the steady rounds in between accept 2.
    requests = [[0] + [2] * 10 + [3] for _ in range(4)]
    rounds = _rounds(requests)
    last = rounds["round_index"] == 11
    rounds.loc[last, "emitted"] = 2
    calibration = calibrate(
        rounds, ComputeTimes(t_draft_edge_s=0.004, t_draft_server_s=0.002, t_ar_s=0.01, t_verify_by_gamma_s={4: 0.01})
    )
    assert lm.expected_tokens_per_round(calibration["alpha"], 4) == pytest.approx(3.0, rel=1e-6)
    assert "steady windows" in calibration["alpha_source"]
    # The per-token statistic counts the same rounds: a round every 30 ms over 3 tokens a round.
    windows = steady_windows(rounds)
    assert len(windows) == 4
    start_s, window = windows[("edge0", 0)]
    assert list(window["round_index"]) == list(range(1, 11))
    per_token_s = (window["t_receive_s"].iloc[-1] - start_s) / window["emitted"].sum()
    assert per_token_s == pytest.approx(0.03 / 3)
    # ... and the prediction from the calibration alone is that statistic (the maximum-likelihood
    # alpha of all rounds, 0.79 here, would predict 11.2 ms, not 10).
    predicted_s = predict_per_token_s(
        "sync", calibration["alpha"], 4, 0.0, **calibration["params"].closed_form_terms(4)
    )
    assert predicted_s == pytest.approx(per_token_s, rel=1e-4)
    assert (
        predict_per_token_s("sync", fit_alpha(rounds), 4, 0.0, **calibration["params"].closed_form_terms(4))
        > 1.05 * per_token_s
    )
