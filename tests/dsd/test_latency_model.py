import math

import pytest

from dsd.analytic import latency_model as lm


def test_expected_tokens_matches_hand_computed_values():
    # (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2
    assert lm.expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)
    assert lm.expected_tokens_per_round(0.5, 1) == pytest.approx(1.5)
    assert lm.expected_tokens_per_round(0.0, 8) == pytest.approx(1.0)
    assert lm.expected_tokens_per_round(1.0, 8) == 9.0


def test_per_token_times_match_hand_computed_values():
    e = 3.3616
    assert lm.per_token_colocated_s(0.8, 4, 0.002, 0.030) == pytest.approx((4 * 0.002 + 0.030) / e)
    assert lm.per_token_sync_dsd_s(0.8, 4, 0.010, 0.030, 0.050) == pytest.approx((0.040 + 0.080) / e)


def test_pipelined_hides_the_round_trip_when_it_fits_in_the_drafting_window():
    # W = rtt + t_v = 0.03 <= (gamma+1)*t_d = 0.05: survivors pay only the drafting window.
    alpha, gamma, t_d, t_v, rtt = 0.9, 4, 0.010, 0.010, 0.020
    pi = 0.9**5
    fail = math.ceil(0.03 / 0.01 - 1e-9) * 0.01 + gamma * t_d
    expected = (pi * 0.05 + (1 - pi) * fail) / lm.expected_tokens_per_round(alpha, gamma)
    assert lm.per_token_pipelined_dsd_s(alpha, gamma, t_d, t_v, rtt) == pytest.approx(expected)


def test_pipelined_equals_sync_plus_nothing_when_nothing_survives():
    # alpha = 0: every verdict refutes the speculation; a cycle is W + gamma*t_d as in sync DSD.
    for rtt in (0.06, 0.2):
        assert lm.per_token_pipelined_dsd_s(0.0, 4, 0.01, 0.01, rtt) == pytest.approx(
            lm.per_token_sync_dsd_s(0.0, 4, 0.01, 0.01, rtt)
        )


def test_sync_dsd_crossover_is_reference_formula_when_t_verify_equals_t_ar():
    alpha, gamma, t_d, t_ar = 0.8, 4, 0.004, 0.030
    rtt = lm.sync_dsd_beats_ar_rtt_s(alpha, gamma, t_d, t_ar, t_ar)
    assert rtt == pytest.approx(t_ar * (3.3616 - 1) - gamma * t_d)
    # At the crossover the two per-token times are equal.
    assert lm.per_token_sync_dsd_s(alpha, gamma, t_d, t_ar, rtt) == pytest.approx(t_ar)


def test_pipelined_crossover_is_where_pipelined_meets_colocated():
    alpha, gamma, t_d_edge, t_d_server, t_v = 0.9, 4, 0.002, 0.002, 0.010
    rtt = lm.pipelined_beats_colocated_rtt_s(alpha, gamma, t_d_edge, t_d_server, t_v)
    co = lm.per_token_colocated_s(alpha, gamma, t_d_server, t_v)
    assert 0 < rtt < gamma * t_d_edge + t_d_edge
    assert lm.per_token_pipelined_dsd_s(alpha, gamma, t_d_edge, t_v, rtt) <= co + 1e-12
    assert lm.per_token_pipelined_dsd_s(alpha, gamma, t_d_edge, t_v, rtt + 1e-6) > co


def test_pipelined_crossover_is_minus_infinity_when_it_never_wins():
    assert lm.pipelined_beats_colocated_rtt_s(0.5, 4, 0.010, 0.001, 0.01) == -math.inf


def test_capacity_factor():
    assert lm.capacity_factor(4, 0.005, 0.020) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="t_verify_s"):
        lm.capacity_factor(4, 0.005, 0.0)


def test_colocated_speedup_is_leviathan_theorem():
    assert lm.colocated_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)


@pytest.mark.parametrize("alpha,gamma", [(1.5, 4), (-0.1, 4), (0.5, 0), (0.5, 2.5)])
def test_bad_alpha_or_gamma_is_named(alpha, gamma):
    with pytest.raises(ValueError, match="alpha|gamma"):
        lm.expected_tokens_per_round(alpha, gamma)


def test_batched_capacity_clients_run_exactly_at_the_rate_asked_for():
    e, gamma, t_d, t_v, s = 3.0, 4, 0.001, 0.008, 0.2
    rate = 60.0
    n_dsd, n_co = lm.batched_capacity(e, rate, gamma, t_d, t_v, s)
    t_v_of = lambda b: t_v * (1 + s * (b - 1))  # noqa: E731
    # Two alternating groups of any split: a round holds both groups' passes.
    for split in (1.0, n_dsd / 2):
        assert e / (t_v_of(split) + t_v_of(n_dsd - split)) == pytest.approx(rate)
    for split in (1.0, n_co / 2):
        assert e / (n_co * gamma * t_d + t_v_of(split) + t_v_of(n_co - split)) == pytest.approx(rate)
    # Batching for free: DSD is bounded by nothing but its own round; serial-like batching (s = 1)
    # gives the serial server's counts, E / (r * t_v) and E / (r * (gamma*t_d + t_v)).
    assert lm.batched_capacity(e, rate, gamma, t_d, t_v, 0.0)[0] == float("inf")
    serial = lm.batched_capacity(e, rate, gamma, t_d, t_v, 1.0)
    assert serial == pytest.approx((e / (rate * t_v), e / (rate * (gamma * t_d + t_v))))
    with pytest.raises(ValueError, match="rate_tok_s"):
        lm.batched_capacity(e, 0.0, gamma, t_d, t_v, s)


def test_capacity_with_the_idle_gap_and_batched_drafting_by_hand():
    """Hand-computed: E = 3, r = 60 tok/s (round R = 50 ms), gamma 4, t_d 1 ms, t_v 8 ms, s 0.2,
    s_d 0.5, idle gap g 0.5 ms between passes."""
    e, rate, gamma, t_d, t_v, s, s_d, g = 3.0, 60.0, 4, 0.001, 0.008, 0.2, 0.5, 0.0005
    # Batched: N_dsd = 2 + ((50 - 1)/8 - 2)/0.2 = 22.625;
    # N_co = 2 + (50 - 2 - 2*(4 + 8))/(4*0.5 + 8*0.2) = 2 + 24/3.6 = 8.6667.
    n_dsd, n_co = lm.batched_capacity(e, rate, gamma, t_d, t_v, s, s_d, g)
    assert n_dsd == pytest.approx(22.625)
    assert n_co == pytest.approx(2 + 24 / 3.6)
    # ... and each count's round is exactly E / r.
    assert lm.batched_round_s(n_dsd, gamma, t_d, t_v, s, s_d, g) == pytest.approx(0.05)
    assert lm.batched_round_s(n_co, gamma, t_d, t_v, s, s_d, g, colocated=True) == pytest.approx(0.05)
    # One client alone: its own passes and gaps (co-located 4 + 0.5 + 8 + 0.5 = 13 ms).
    assert lm.batched_round_s(1, gamma, t_d, t_v, s, s_d, g, colocated=True) == pytest.approx(0.013)
    # Serial: N_dsd = 50/8.5 = 5.882, N_co = 50/(4 + 8 + 1) = 3.846; their ratio is
    # 1 + (4 + 0.5)/(8 + 0.5) = 1.5294 (claim 4 without the gap: 1.5).
    serial = lm.serial_capacity(e, rate, gamma, t_d, t_v, g)
    assert serial == pytest.approx((50 / 8.5, 50 / 13))
    assert lm.serial_round_s(serial[1], gamma, t_d, t_v, g, colocated=True) == pytest.approx(0.05)
    assert lm.capacity_factor(gamma, t_d, t_v, g) == pytest.approx(serial[0] / serial[1])
    assert lm.capacity_factor(gamma, t_d, t_v, g) == pytest.approx(1 + 4.5 / 8.5)
    # Batched drafting at s_d = 1 and no gap is the earlier co-located count.
    assert lm.batched_capacity(e, rate, gamma, t_d, t_v, s)[1] == pytest.approx(
        (0.05 - 2 * t_v * (1 - s)) / (gamma * t_d + s * t_v)
    )
    with pytest.raises(ValueError, match="gap_s"):
        lm.batched_capacity(e, rate, gamma, t_d, t_v, s, s_d, -0.001)
    with pytest.raises(ValueError, match="gap_s"):
        lm.capacity_factor(gamma, t_d, t_v, -0.001)


def test_tokens_per_round_by_step_is_the_closed_form_at_equal_steps_and_inverts_to_one_alpha():
    assert lm.tokens_per_round_by_step([0.6] * 4) == pytest.approx(lm.expected_tokens_per_round(0.6, 4))
    falling = [0.56, 0.51, 0.47, 0.44]
    tokens = 1 + 0.56 + 0.56 * 0.51 + 0.56 * 0.51 * 0.47 + 0.56 * 0.51 * 0.47 * 0.44
    assert lm.tokens_per_round_by_step(falling) == pytest.approx(tokens)
    alpha = lm.alpha_for_tokens_per_round(tokens, 4)
    assert 0.44 < alpha < 0.56
    assert lm.expected_tokens_per_round(alpha, 4) == pytest.approx(tokens, abs=1e-9)
    assert lm.alpha_for_tokens_per_round(5.0000001, 4) == pytest.approx(1.0)
    assert lm.alpha_for_tokens_per_round(1.0, 4) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="gamma"):
        lm.alpha_for_tokens_per_round(2.0, 0)
