"""benchmarks/adaptive_oracle.py: every piece of every request counts, and the split oracle is not
biased low by the noise it is chosen on (the in-sample minimum is)."""
from __future__ import annotations

import random
import statistics

import pytest

from benchmarks.adaptive import RequestRun, Scenario
from benchmarks.adaptive_oracle import condition_rates, in_sample_oracle, split_oracle


def scenario() -> Scenario:
    return Scenario([10.0, 150.0], 4.0, [0.9], 100, 100, 32, 16, ("ar", "sync"), 16)


def test_condition_rates_share_a_straddling_request_by_time_and_rate():
    sc = scenario()
    rates = {10.0: 10.0, 150.0: 2.0}                                  # tokens per second
    runs = []
    for k, (start_s, wall_s) in enumerate([(0.5, 1.0), (3.0, 2.0), (5.0, 1.0), (7.5, 1.0), (9.0, 2.0), (11.5, 1.5)]):
        tokens = sum(seconds * rates[rtt] for rtt, seconds in sc.pieces(start_s, start_s + wall_s))
        runs.append(RequestRun(start_s, wall_s, tokens, 0.9))
    got = condition_rates(runs, sc)
    assert set(got) == {(10.0, 0.9), (150.0, 0.9)}
    for (rtt, _), (tokens, seconds) in got.items():
        assert tokens / seconds == pytest.approx(rates[rtt], rel=1e-3)
    # the seconds are every piece's: 0.5-1.5, 3-4, 8-8.5, 9-11, 11.5-12 at 10 ms; the rest at 150 ms
    assert got[(10.0, 0.9)][1] == pytest.approx(1.0 + 1.0 + 0.5 + 2.0 + 0.5)
    assert got[(150.0, 0.9)][1] == pytest.approx(1.0 + 1.0 + 0.5 + 1.0)


def noisy_arm(rng: random.Random, sc: Scenario, per_token_s: dict, requests: int) -> list[RequestRun]:
    """Requests of 1 s each wholly inside a segment, alternating 10 / 150 ms, whose tokens scatter
    +-30% about the arm's true rate there."""
    runs = []
    for i in range(requests):
        start_s = i * sc.segment_s + 0.5
        rtt = sc.rtt_at_ms(start_s)
        runs.append(RequestRun(start_s, 1.0, rng.uniform(0.7, 1.3) / per_token_s[rtt], 0.9))
    return runs


def test_split_oracle_is_unbiased_where_in_sample_is_low():
    """Six arms equally good (0.1 s / token at 10 ms, 0.5 at 150 ms): the in-sample minimum over
    their noisy estimates falls below the truth; the split one averages to it."""
    sc, rng = scenario(), random.Random(5)
    truth = {10.0: 0.1, 150.0: 0.5}
    split, in_sample = {k: [] for k in truth}, {k: [] for k in truth}
    for _ in range(100):
        statics = {f"arm {a}": noisy_arm(rng, sc, truth, 12) for a in range(6)}
        for rtt in truth:
            split[rtt].append(split_oracle(statics, sc)[(rtt, 0.9)] / truth[rtt])
            in_sample[rtt].append(in_sample_oracle(statics, sc)[(rtt, 0.9)] / truth[rtt])
    for rtt in truth:
        assert statistics.mean(in_sample[rtt]) < 0.95
        assert statistics.mean(split[rtt]) == pytest.approx(1.0, abs=0.02)


def test_split_oracle_finds_a_clearly_better_arm():
    sc, rng = scenario(), random.Random(7)
    statics = {"good": noisy_arm(rng, sc, {10.0: 0.05, 150.0: 0.4}, 24),
               "bad": noisy_arm(rng, sc, {10.0: 0.1, 150.0: 0.2}, 24)}
    best = split_oracle(statics, sc)
    assert best[(10.0, 0.9)] == pytest.approx(0.05, rel=0.2)
    assert best[(150.0, 0.9)] == pytest.approx(0.2, rel=0.2)
