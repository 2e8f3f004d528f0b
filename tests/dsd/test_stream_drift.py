"""A server stream's arrivals as a measure of a link that got faster (dsd/drive/stream_drift.py)."""

import pytest

from dsd.drive.stream_drift import ArrivalDrift, fallen_rtt_s


def falls(gaps_ms: list[float], compute_ms: float = 20.0) -> list[float]:
    drift = ArrivalDrift()
    return [round(drift.add(g / 1e3, compute_ms / 1e3) * 1e3, 6) for g in gaps_ms]


def test_a_fall_of_the_back_path_shows_as_a_burst_below_the_servers_pace():
    # 150 -> 10 ms RTT (75 -> 5 ms one way), tokens 20 ms apart: those sent after the fall wait
    # behind the last one on the old path, then come 20 ms apart again
    seen = falls([20, 20, 20, 4, 0, 1, 5, 20, 20])
    assert seen[:3] == [0, 0, 0] and seen[3:7] == [16, 36, 55, 70] and seen[7:] == [0, 0]


def test_a_stall_of_the_edge_or_a_retransmission_is_not_a_fall():
    # read 60 ms late, then three at once and on pace: the drift rises and comes back
    assert max(falls([20, 20, 80, 0, 0, 0, 20, 20])) == 0
    # a slow upward creep of the server's overhead (0.5 ms a token), then a burst: the creep is no
    # fall, and the burst is read against the lowest drift of the 8 arrivals before it (3.5 ms up)
    assert max(falls([20.5] * 12)) == 0
    assert falls([20.5] * 12 + [0, 0])[-2:] == [pytest.approx(16.5), pytest.approx(36.5)]


def test_a_burst_read_as_a_fall_makes_the_drift_after_it_the_baseline():
    drift = ArrivalDrift()
    seen = []
    for gap_ms in [20, 20, 4, 0, 1, 0, 20, 5, 20]:
        seen.append(round(drift.add(gap_ms / 1e3, 0.02) * 1e3, 6))
        if seen[-1] >= 35:
            drift.settle()
    # the whole burst against the drift before it; after it, a token 15 ms early is a 15 ms fall
    # against the new baseline, not 90 against the old
    assert seen == [0, 0, 16, 36, 55, 75, 0, 15, 0]


def test_bad_samples_are_ignored():
    drift = ArrivalDrift()
    assert drift.add(-0.001, 0.02) == 0 and drift.add(0.0, 0.0) == 0 and drift.drift_s == 0


@pytest.mark.parametrize(
    "rtt_s, fall_s, expected",
    [
        (0.15, 0.070, 0.15 - 0.14),  # symmetric: both directions fell as the back path did
        (0.15, 0.030, None),  # 90 ms: above half of 150, not a fall
        (0.15, 0.100, 0.0075),  # at least a twentieth of the old RTT
        (None, 0.070, None),
        (0.15, 0.0, None),
    ],
)
def test_fallen_rtt(rtt_s, fall_s, expected):
    got = fallen_rtt_s(rtt_s, fall_s, 0.5)
    assert got == (None if expected is None else pytest.approx(expected))
