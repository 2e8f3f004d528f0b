"""Link schedules as plain data (pure): steps and traces, the link in force at any time, what a
probe should see across a change, and when a change took effect."""

from __future__ import annotations

import math

import pytest

from netem.schedule import LinkSchedule, effect_brackets, effect_times, expected_rtt_at_ms
from netem.spec import LinkSpec

BASE = LinkSpec(rtt_ms=20, jitter_ms=2)


def test_steps_change_only_the_keys_they_name_from_their_time_on():
    schedule = LinkSchedule.from_steps(
        [{"at_s": 5, "rtt_ms": 150}, {"at_s": 8, "loss_pct": 1, "rate_mbit": 10}, {"at_s": 9, "rate_mbit": 0}]
    )
    assert schedule.state_at(BASE, 4.999) == BASE
    assert schedule.state_at(BASE, 5) == LinkSpec(rtt_ms=150, jitter_ms=2)
    assert schedule.state_at(BASE, 8.5) == LinkSpec(rtt_ms=150, jitter_ms=2, loss_pct=1, rate_mbit=10)
    assert schedule.state_at(BASE, 100) == LinkSpec(rtt_ms=150, jitter_ms=2, loss_pct=1)
    assert [at for at, _ in schedule.specs(BASE)] == [5, 8, 9]
    assert schedule.index_at(8.5) == 2


def test_one_way_steps_keep_the_other_direction():
    schedule = LinkSchedule.from_steps([{"at_s": 1, "delay_up_ms": 40}])
    spec = schedule.state_at(LinkSpec(rtt_ms=20), 1)
    assert (spec.up.delay_ms, spec.down.delay_ms) == (40, 10)


def test_trace_csv_replays_its_rows(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("t_s,rtt_ms,loss_pct\n0,20,0\n0.5,35.5,1\n1.0,20,0\n")
    trace = LinkSchedule.from_trace_csv(path)
    assert trace.source == "trace.csv" and len(trace.steps) == 3
    assert trace.state_at(BASE, 0.7) == LinkSpec(rtt_ms=35.5, jitter_ms=2, loss_pct=1)


@pytest.mark.parametrize(
    "text,message",
    [
        ("t,rtt_ms\n0,20\n", "trace columns"),
        ("t_s,rtt_ms,latency\n0,20,1\n", "trace columns"),
        ("t_s,rtt_ms\n0,20\n0.5,abc\n", r"trace.csv:3"),
        ("t_s,rtt_ms\n1,20\n0.5,30\n", "time order"),
        ("t_s,rtt_ms\n", "no rows"),
    ],
)
def test_bad_traces_are_named_with_their_line(tmp_path, text, message):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        LinkSchedule.from_trace_csv(path)


@pytest.mark.parametrize(
    "steps,message",
    [
        ([{"rtt_ms": 10}], "at_s"),
        ([{"at_s": -1, "rtt_ms": 10}], "at_s"),
        ([{"at_s": 1, "latency_ms": 10}], "latency_ms"),
        ([{"at_s": 1}], "changes nothing"),
    ],
)
def test_bad_steps_are_named(steps, message):
    with pytest.raises(ValueError, match=message):
        LinkSchedule.from_steps(steps)


def test_check_finds_a_state_that_is_no_valid_link():
    with pytest.raises(ValueError, match="step 0.*jitter_ms"):
        LinkSchedule.from_steps([{"at_s": 1, "rtt_ms": 2}]).check(BASE)


def test_a_probe_across_a_change_sees_old_up_and_new_down_delay():
    schedule = LinkSchedule.from_steps([{"at_s": 1.0, "rtt_ms": 60}])
    assert expected_rtt_at_ms(schedule, LinkSpec(rtt_ms=20), 0.5) == 20
    assert expected_rtt_at_ms(schedule, LinkSpec(rtt_ms=20), 0.995) == pytest.approx(40)  # 10 up + 30 down
    assert expected_rtt_at_ms(schedule, LinkSpec(rtt_ms=20), 1.0) == 60


def test_effect_time_is_the_first_probe_after_the_change_that_sees_the_new_rtt():
    samples = [(0.998, 20.1), (1.002, 39.9), (0.999, 40.2), (1.003, 60.1), (1.004, 60.0), (2.5, 20.0)]
    changes = [(1.0, 20.0, 60.0), (2.0, 60.0, 20.0), (3.0, 20.0, 99.0)]
    got = effect_times(changes, samples, tolerance_ms=1.0)
    assert got[:2] == [1.003, 2.5] and math.isnan(got[2])
    brackets = effect_brackets(changes, samples, tolerance_ms=1.0)
    # 1.002 still saw (part of) the old link; nothing was sent between 2.0 and 2.5: no evidence of lateness.
    assert brackets[:2] == [(1.002, 1.003), (2.0, 2.5)]
    assert brackets[2][0] == 3.0 and math.isnan(brackets[2][1])


def test_a_probe_held_up_beyond_the_new_rtt_is_no_evidence_that_the_link_was_late():
    """A stalled host holds a probe sent after a 10 -> 80 ms change: 130 ms is not 80 within the
    tolerance, but nearer 80 than 10, so it widens the bracket's upper end, not the lower one; a
    probe that saw 10 ms after the change does move the lower end (the link was late)."""
    changes = [(1.0, 10.0, 80.0)]
    stalled = [(0.99, 10.1), (1.01, 130.0), (1.05, 95.0), (1.09, 80.2)]
    assert effect_brackets(changes, stalled, tolerance_ms=2.0) == [(1.0, 1.09)]
    late = [(0.99, 10.1), (1.01, 10.2), (1.05, 10.1), (1.09, 80.2)]
    assert effect_brackets(changes, late, tolerance_ms=2.0) == [(1.05, 1.09)]
