import json

import pytest

from dsd.costs.profiles import HardwareProfile, get_profile
from dsd.costs.compute_times import ComputeTimes, fit_verify_line
from dsd.costs.measurement import MeasuredTimes


def line_times(**changes) -> ComputeTimes:
    values = {
        "t_draft_edge_s": 0.02,
        "t_draft_server_s": 0.002,
        "t_ar_s": 0.05,
        "t_prefill_per_token_s": 1e-4,
        "t_verify_base_s": 0.045,
        "t_verify_per_position_s": 0.001,
        "batch_slope": 0.1,
    }
    return ComputeTimes(**{**values, **changes})


def test_the_line_answers_every_gamma_and_the_table_wins_where_it_has_one():
    times = line_times()
    assert times.t_verify_s(4) == pytest.approx(0.045 + 0.001 * 5)
    assert times.t_verify_s(4, batch_size=3) == pytest.approx((0.045 + 0.005) * 1.2)
    measured = times.with_verify_s({4: 0.07})
    assert measured.t_verify_s(4) == 0.07
    assert measured.t_verify_s(2) == pytest.approx(0.048)  # the line still answers the rest
    assert measured.knows_gamma(7)


def test_a_measured_table_refuses_a_gamma_it_did_not_measure():
    times = ComputeTimes(
        t_draft_edge_s=0.01,
        t_draft_server_s=0.01,
        t_ar_s=0.03,
        t_prefill_per_token_s=0.0,
        t_verify_by_gamma_s={1: 0.031, 4: 0.035},
    )
    assert times.t_verify_s(4) == 0.035
    assert times.knows_gamma(1) and not times.knows_gamma(2)
    with pytest.raises(ValueError, match=r"gamma 2: t_verify was measured only for gamma \[1, 4\]"):
        times.t_verify_s(2)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"t_ar_s": 0.0}, r"t_ar_s must be > 0, got 0.0"),
        ({"t_draft_edge_s": -0.1}, r"t_draft_edge_s must be >= 0, got -0.1"),
        ({"batch_slope": float("nan")}, r"batch_slope must be a finite number, got nan"),
        ({"t_prefill_per_token_s": "1"}, r"t_prefill_per_token_s must be a finite number, got '1'"),
        ({"t_verify_per_position_s": None}, r"t_verify_base_s and t_verify_per_position_s come together"),
        ({"t_verify_base_s": -1.0}, r"t_verify_base_s must be >= 0, got -1.0"),
        ({"t_verify_by_gamma_s": {2: -0.5}}, r"t_verify_by_gamma_s\[2\] must be >= 0, got -0.5"),
        ({"t_verify_by_gamma_s": {"x": 0.5}}, r"gamma must be a whole number, got 'x'"),
        ({"t_verify_base_s": None, "t_verify_per_position_s": None}, r"got neither"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_value(changes, message):
    with pytest.raises(ValueError, match=message):
        line_times(**changes)


def test_the_client_view_may_put_the_server_draft_step_below_zero():
    # predictions.calibrate derives it as a difference and does not clip it (see the NOTE)
    assert line_times(t_draft_server_s=-0.001).t_draft_server_s == -0.001


def test_a_profile_converts_without_losing_its_line_or_batch_slope():
    profile = get_profile("toy-edge-cloud")
    times = profile.times
    assert (times.t_verify_base_s, times.t_verify_per_position_s) == (
        profile.t_verify_base_s,
        profile.t_verify_per_position_s,
    )
    assert times.batch_slope == profile.batch_slope
    for gamma in (1, 4, 9):
        assert times.t_verify_s(gamma, 4) == pytest.approx(profile.t_verify_s(gamma, 4))
    assert times.t_prefill_s(100) == pytest.approx(profile.t_prefill_s(100))


def test_a_measurement_converts_with_one_draft_time_for_both_sides_and_its_table():
    measured = MeasuredTimes(
        t_draft_s=0.004,
        t_ar_s=0.03,
        t_verify_s={1: 0.031, 4: 0.036},
        t_prefill_per_token_s=2e-4,
        context_tokens=128,
        repeats=5,
    )
    times = measured.times
    assert times.t_draft_edge_s == times.t_draft_server_s == 0.004
    assert times.verify_table_s == {1: 0.031, 4: 0.036} and times.t_verify_base_s is None


@pytest.mark.parametrize(
    "times",
    [line_times(), line_times().tabulated([1, 4]), ComputeTimes(0.01, 0.01, 0.03, 0.0, t_verify_by_gamma_s={4: 0.035})],
)
def test_the_dict_form_survives_json(times):
    again = ComputeTimes.from_dict(json.loads(json.dumps(times.to_dict())))
    assert again == times


def test_the_dict_form_reads_the_costs_of_older_sweeps_and_refuses_unknown_keys():
    old = {
        "t_draft_edge_s": 0.02,
        "t_draft_server_s": 0.002,
        "t_ar_s": 0.05,
        "t_verify_s": {"4": 0.05},
        "t_prefill_per_token_s": 1e-4,
    }
    times = ComputeTimes.from_dict(old)
    assert times.t_verify_s(4) == 0.05 and times.batch_slope is None
    with pytest.raises(ValueError, match=r"batch_size 2: batch_slope is not known"):
        times.t_verify_s(4, batch_size=2)
    with pytest.raises(ValueError, match=r"t_prefill_per_token_s: not known"):
        ComputeTimes.from_dict({k: v for k, v in old.items() if k != "t_prefill_per_token_s"}).t_prefill_s(10)
    with pytest.raises(ValueError, match=r"unknown keys \['t_verfy_s'\]"):
        ComputeTimes.from_dict({**old, "t_verfy_s": {}})
    with pytest.raises(ValueError, match=r"missing keys \['t_ar_s'\]"):
        ComputeTimes.from_dict({k: v for k, v in old.items() if k != "t_ar_s"})


def test_tabulated_fills_the_table_from_the_line_for_the_sweep_gammas():
    times = line_times().tabulated([2, 4])
    assert times.verify_table_s == pytest.approx({2: 0.048, 4: 0.05})
    assert times.to_dict()["t_verify_s"] == times.verify_table_s


def test_the_line_through_a_measured_table_recovers_base_and_per_position():
    base, per_position = fit_verify_line({g: 0.03 + 0.002 * (g + 1) for g in (1, 2, 4, 8)})
    assert (base, per_position) == (pytest.approx(0.03), pytest.approx(0.002))
    with pytest.raises(ValueError, match=r"a line needs two gammas or more, got \{4: 0.1\}"):
        fit_verify_line({4: 0.1})


def test_a_profile_refuses_what_its_times_refuse_naming_the_profile():
    numbers = {
        "t_draft_edge_s": 0.02,
        "t_draft_server_s": 0.002,
        "t_ar_s": 0.05,
        "t_verify_base_s": 0.045,
        "t_verify_per_position_s": 0.001,
        "t_prefill_per_token_s": 1e-4,
        "batch_slope": 0.1,
    }
    profile = HardwareProfile(name="p", **numbers)
    assert profile.times == line_times()
    with pytest.raises(ValueError, match=r"profile 'p': t_verify_base_s must be a finite number, got inf"):
        HardwareProfile(name="p", **{**numbers, "t_verify_base_s": float("inf")})
