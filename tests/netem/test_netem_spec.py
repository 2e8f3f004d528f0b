"""LinkSpec: validation names the field and the value; the RTT split and expected figures."""

from __future__ import annotations

import math

import pytest

from netem.spec import DirectionSpec, LinkSpec


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        ({"rtt_ms": -1}, "rtt_ms", "-1"),
        ({"rtt_ms": math.nan}, "rtt_ms", "nan"),
        ({"rtt_ms": "20"}, "rtt_ms", "'20'"),
        ({"rtt_ms": True}, "rtt_ms", "True"),
        ({"rtt_ms": 20, "jitter_ms": -0.5}, "jitter_ms", "-0.5"),
        ({"rtt_ms": 20, "jitter_ms": 11}, "jitter_ms", "11"),
        ({"rtt_ms": 20, "loss_pct": 100.5}, "loss_pct", "100.5"),
        ({"rtt_ms": 20, "loss_pct": -1}, "loss_pct", "-1"),
        ({"rtt_ms": 20, "rate_mbit": 0}, "rate_mbit", "0"),
        ({"rtt_ms": 20, "rate_mbit": math.inf}, "rate_mbit", "inf"),
        ({"rtt_ms": 20, "correlation_pct": 100}, "correlation_pct", "100"),
        ({"rtt_ms": 20, "distribution": "lognormal"}, "distribution", "'lognormal'"),
        ({"delay_up_ms": 5, "delay_down_ms": -5}, "delay_down_ms", "-5"),
    ],
)
def test_invalid_field_raises_value_error_naming_field_and_value(kwargs, field, value):
    with pytest.raises(ValueError) as info:
        LinkSpec(**kwargs)
    assert field in str(info.value) and value in str(info.value)


def test_a_link_that_is_down_is_a_valid_link_of_a_schedule():
    down = LinkSpec(rtt_ms=20, loss_pct=100)
    assert down.up.loss_pct == down.down.loss_pct == 100.0 and down.expected_rtt_loss_pct == 100.0


@pytest.mark.parametrize("kwargs", [{}, {"delay_up_ms": 5}, {"rtt_ms": 10, "delay_up_ms": 5, "delay_down_ms": 5}])
def test_rtt_and_per_direction_delays_are_exclusive(kwargs):
    with pytest.raises(ValueError, match="rtt_ms"):
        LinkSpec(**kwargs)


def test_rtt_is_split_half_each_way_and_other_fields_apply_to_both():
    spec = LinkSpec(rtt_ms=30, jitter_ms=2, loss_pct=1, rate_mbit=10, correlation_pct=25)
    assert (
        spec.up
        == spec.down
        == DirectionSpec(delay_ms=15, jitter_ms=2, loss_pct=1, rate_mbit=10, correlation_pct=25, distribution="uniform")
    )


def test_asymmetric_delays():
    spec = LinkSpec(delay_up_ms=5, delay_down_ms=25)
    assert (spec.up.delay_ms, spec.down.delay_ms) == (5, 25)
    assert spec.expected_rtt_ms() == 30


def test_expected_round_trip_figures():
    uniform = LinkSpec(rtt_ms=40, jitter_ms=3, loss_pct=10)
    assert uniform.expected_rtt_stdev_ms == pytest.approx(math.sqrt(2) * 3 / math.sqrt(3))
    assert uniform.expected_rtt_loss_pct == pytest.approx(19.0)
    normal = LinkSpec(rtt_ms=40, jitter_ms=3, distribution="normal")
    assert normal.expected_rtt_stdev_ms == pytest.approx(math.sqrt(2) * 3)
    # 84 IP bytes each way at 1 Mbit/s add 2 x 0.672 ms.
    assert LinkSpec(rtt_ms=10, rate_mbit=1).expected_rtt_ms(84) == pytest.approx(10 + 2 * 0.672)


def test_from_dict_rejects_misspelt_option():
    assert LinkSpec.from_dict({"rtt_ms": 10}) == LinkSpec(rtt_ms=10)
    with pytest.raises(ValueError, match="rtt_msec"):
        LinkSpec.from_dict({"rtt_msec": 10})


def test_spec_is_frozen():
    with pytest.raises(AttributeError):
        LinkSpec(rtt_ms=10).rtt_ms = 20
