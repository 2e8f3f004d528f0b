"""The per-segment oracle's rule for a measured trace (benchmarks/trace_levels.py), and the oracle's
score over its segments (benchmarks/adaptive_scenario.py), on small synthetic traces."""

import pytest

from benchmarks.adaptive_oracle import levels_err_pct
from benchmarks.adaptive_scenario import RequestRun, Scenario, touched_levels_ms, vs_oracle_pct
from benchmarks.trace_levels import LevelRule, level_segments, time_weighted_median, window_rtts_ms

# Four seconds of echoes every 0.25 s: about 20 ms for 2 s, a hold of 0.5 s at 2.0 s (its echoes'
# RTTs fall by the echo interval: they came back together), then about 100 ms.
TRACE = (
    (0.0, 19.0),
    (0.25, 21.0),
    (0.5, 20.0),
    (0.75, 22.0),
    (1.0, 18.0),
    (1.25, 20.0),
    (1.5, 21.0),
    (1.75, 19.0),
    (2.0, 500.0),
    (2.25, 250.0),
    (2.5, 21.0),
    (2.75, 20.0),
    (3.0, 95.0),
    (3.25, 105.0),
    (3.5, 100.0),
    (3.75, 110.0),
)


def scenario(levels=()) -> Scenario:
    return Scenario([10.0], 1.0, [0.9], 100, 100, 32, 16, ("ar", "sync"), 16, TRACE, "synthetic", levels)


def test_a_windows_rtt_is_its_time_weighted_median():
    assert time_weighted_median([(10.0, 0.6), (500.0, 0.4)]) == 10.0
    assert time_weighted_median([(10.0, 0.4), (500.0, 0.6)]) == 500.0
    assert time_weighted_median([(30.0, 0.25), (10.0, 0.25), (20.0, 0.5)]) == 20.0
    with pytest.raises(ValueError, match="pieces"):
        time_weighted_median([])


def test_windows_cover_the_trace_and_a_hold_under_half_a_window_leaves_its_median():
    windows = window_rtts_ms(TRACE, 1.0)
    assert [t for t, _ in windows] == [0.0, 1.0, 2.0, 3.0]
    # window 0: 19, 21, 20, 22 for 0.25 s each -> the median of the time is 20 (half at or below 20)
    assert windows[0][1] == 20.0 and windows[1][1] == 19.0
    # window 2: the hold (500, 250) is half the window: 21 is in force for 0.25 s, 20 for 0.25 s
    assert windows[2][1] == 21.0
    assert windows[3][1] == 100.0
    # half-second windows see the hold: its first half is one window at 250 ms
    assert dict(window_rtts_ms(TRACE, 0.5))[2.0] == 250.0


def test_windows_in_one_bin_are_one_level_at_their_mean_and_runs_of_a_level_are_one_segment():
    segments = level_segments(TRACE, LevelRule(window_s=1.0, factor=1.25))
    # 20, 19 and 21 ms fall in the bin [1.25**13, 1.25**14) = [18.2, 22.7): one level at their mean
    assert segments == ((0.0, 20.0), (3.0, 100.0))
    # bins of 1.05 hold one each (19 in [18.7, 19.6), 20 in [19.6, 20.6), 21 in [20.6, 21.6))
    fine = level_segments(TRACE, LevelRule(window_s=1.0, factor=1.05))
    assert fine == ((0.0, 20.0), (1.0, 19.0), (2.0, 21.0), (3.0, 100.0))


def test_a_step_schedule_whose_steps_fall_on_window_boundaries_keeps_its_steps():
    steps = ((0.0, 27.0), (3.0, 174.0), (7.0, 114.0))
    assert level_segments(steps, LevelRule(window_s=1.0)) == steps


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(window_s=0), "window_s"),
        (dict(window_s=float("nan")), "window_s"),
        (dict(factor=1.0), "factor"),
        (dict(factor="2"), "factor"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        LevelRule(**changes)


def test_the_link_follows_the_trace_and_the_oracle_its_segments():
    sc = scenario(level_segments(TRACE, LevelRule(1.0, 1.25)))
    assert sc.rtt_at_ms(2.1) == 500.0 and sc.level_at_ms(2.1) == 20.0
    assert sc.levels_ms() == [20.0, 100.0]
    assert sc.pieces(2.5, 3.5) == [(20.0, 0.5), (100.0, 0.5)]
    assert sc.next_change_s(0.2) == 3.0 and sc.next_change_s(3.2) == float("inf")
    # without levels, every row of the trace is a segment, as for a step schedule
    assert scenario().pieces(2.0, 2.5) == [(500.0, 0.25), (250.0, 0.25)]


def test_the_oracle_scores_a_run_over_the_segments_it_spent_time_in():
    """The oracle's per-token time is 10 ms at 20 ms and 40 ms at 100 ms: a request of 2 s from 2.0 s
    spends 1 s in each, so the oracle emits 100 + 25 tokens in its time; a run of 100 tokens there
    is 25% slower per token."""
    sc = scenario(level_segments(TRACE, LevelRule(1.0, 1.25)))
    best = {(20.0, 0.9): 0.010, (100.0, 0.9): 0.040}
    run = [RequestRun(2.0, 2.0, 100, 0.9)]
    assert vs_oracle_pct(run, best, sc) == pytest.approx(25.0)
    assert touched_levels_ms({"a": run, "b": [RequestRun(0.0, 1.0, 50, 0.9)]}, sc) == [20.0, 100.0]
    assert touched_levels_ms({"b": [RequestRun(0.0, 1.0, 50, 0.9)]}, sc) == [20.0]


def test_the_levels_check_is_each_arms_run_against_its_own_times_at_the_levels():
    """An arm measured at 10 ms a token at the 20-ms level, whose request there emitted 80 tokens in
    1 s: its own times put it 25% faster than it ran. Its request at the 100-ms level, where it was
    not measured on every prompt (the pilot dropped it there), is left out; an arm with no request
    left is left out."""
    sc = scenario(level_segments(TRACE, LevelRule(1.0, 1.25)))
    statics = {
        "static sync 4": [RequestRun(0.0, 1.0, 80, 0.9), RequestRun(3.0, 1.0, 10, 0.9)],
        "static ar 1": [RequestRun(0.0, 1.0, 50, 0.9)],
    }
    measured = {
        "static sync 4": {(20.0, 0.9): [(0, 0.5, 50), (1, 0.5, 50)], (100.0, 0.9): [(0, 1.0, 20)]},
        "static ar 1": {(20.0, 0.9): [(0, 1.0, 50)], (100.0, 0.9): [(0, 1.0, 30), (1, 1.0, 30)]},
    }
    assert levels_err_pct(statics, measured, sc) == {"static sync 4": pytest.approx(25.0)}
