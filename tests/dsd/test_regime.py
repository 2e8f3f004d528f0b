"""The regime line a run prints before its first point (dsd.analytic.regime)."""

from __future__ import annotations

import math

import pytest

from dsd.analytic.regime import regime
from dsd.costs.compute_times import ComputeTimes


def pair_times(verify_over_ar: float, draft_over_ar: float, t_ar_s: float = 0.055) -> ComputeTimes:
    return ComputeTimes(
        t_draft_edge_s=draft_over_ar * t_ar_s,
        t_draft_server_s=draft_over_ar * t_ar_s,
        t_ar_s=t_ar_s,
        t_verify_by_gamma_s=((2, verify_over_ar * t_ar_s),),
    )


def test_a_memory_bound_pair_can_win_and_says_below_which_rtt():
    r = regime(pair_times(1.13, 0.22), (2,), "bfloat16", "bfloat16", alpha=0.7, alpha_source="held out")
    g = r.gammas[0]
    assert g.verify_over_ar == pytest.approx(1.13) and 0.4 < g.break_even_alpha < 0.6
    assert g.sync_wins_below_rtt_ms > 10 and not r.no_win
    assert not any("WARNING" in line for line in r.lines())
    assert "t_verify/t_ar 1.13" in r.lines()[0] and "wins below RTT" in r.lines()[0]


def test_float32_that_doubles_the_verification_is_a_no_win_regime_in_one_line():
    # the fresh machine without AMX: a 3-position pass cost 2.08 AR steps, alpha 0.49
    r = regime(pair_times(2.08, 0.27), (2,), "float32", "float32", alpha=0.49, alpha_source="held out")
    assert r.no_win
    warnings = [line for line in r.lines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "no DSD mode can beat cloud AR at any RTT" in warnings[0]
    assert "alpha 0.490" in warnings[0]


def test_without_alpha_the_warning_needs_a_regime_no_draft_can_win():
    assert not regime(pair_times(2.08, 0.27), (2,), "float32", "float32").no_win  # alpha 0.9 would win
    hopeless = regime(pair_times(2.9, 0.3), (2,), "float32", "float32")
    assert math.isinf(hopeless.gammas[0].break_even_alpha) and hopeless.no_win
    assert "with any draft" in hopeless.lines()[-1]
    assert hopeless.to_dict()["by_gamma"]["2"]["break_even_alpha"] is None


def test_alpha_out_of_range_is_refused():
    with pytest.raises(ValueError, match="alpha"):
        regime(pair_times(1.1, 0.2), (2,), "float32", "float32", alpha=1.0)
