"""The measurement's statistics and packet building (pure)."""

from __future__ import annotations

import math
import struct

import pytest

from netem import measure


def test_percentile_interpolates_like_numpy_when_asked_and_is_a_value_that_occurred_by_default():
    values = [float(v) for v in range(1, 101)]
    assert measure.percentile(values, 50, "linear") == pytest.approx(50.5)
    assert measure.percentile(values, 99, "linear") == pytest.approx(99.01)
    assert measure.percentile(values, 50) == 50 and measure.percentile(values, 99) == 99
    with pytest.raises(ValueError, match="method"):
        measure.percentile(values, 50, "nearest")
    assert math.isnan(measure.percentile([], 50))


def test_summarize_counts_loss_and_spread():
    s = measure.summarize([10.0, 12.0, 14.0], n_sent=4)
    assert (s.n_received, s.loss_pct, s.p50_ms, s.mean_ms, s.min_ms, s.max_ms) == (3, 25.0, 12.0, 12.0, 10.0, 14.0)
    assert s.stdev_ms == pytest.approx(2.0)


def test_loss_sigma_is_distance_in_binomial_standard_errors():
    # 1000 probes at 10% expected loss: one standard error is ~0.95 points.
    assert measure.loss_sigma(1000, 10.0 + 100 * math.sqrt(0.09 / 1000), 10.0) == pytest.approx(1.0)


def test_icmp_checksum_verifies_to_zero():
    packet = struct.pack("!BBHHH", 8, 0, 0, 0x1234, 7) + b"payload!"
    checksum = measure._inet_checksum(packet)
    with_checksum = packet[:2] + struct.pack("!H", checksum) + packet[4:]
    assert measure._inet_checksum(with_checksum) == 0
