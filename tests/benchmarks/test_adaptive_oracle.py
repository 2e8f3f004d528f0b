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
    rates = {10.0: 10.0, 150.0: 2.0}  # tokens per second
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
    statics = {
        "good": noisy_arm(rng, sc, {10.0: 0.05, 150.0: 0.4}, 24),
        "bad": noisy_arm(rng, sc, {10.0: 0.1, 150.0: 0.2}, 24),
    }
    best = split_oracle(statics, sc)
    assert best[(10.0, 0.9)] == pytest.approx(0.05, rel=0.2)
    assert best[(150.0, 0.9)] == pytest.approx(0.2, rel=0.2)


# ---- the constant-condition oracle (netns) ------------------------------------------------------


def test_pilot_survivors_keep_only_arms_near_the_pilots_best():
    from benchmarks.adaptive_oracle import pilot_survivors

    pilot = {
        "ar": {(150.0, 0.3): [(6, 0.8, 32), (7, 0.8, 32)], (10.0, 0.3): [(6, 0.66, 32)]},
        "sync 16": {(150.0, 0.3): [(6, 3.2, 32), (7, 3.0, 32)], (10.0, 0.3): [(6, 0.70, 32)]},
        "sync 2": {(150.0, 0.3): [(6, 0.95, 32), (7, 0.99, 32)], (10.0, 0.3): [(6, 1.1, 32)]},
    }
    got = pilot_survivors(pilot, factor=1.25)
    assert got[(150.0, 0.3)] == ["ar", "sync 2"]  # 0.97 / 0.8 = 1.21 within, 3.1 / 0.8 not
    assert got[(10.0, 0.3)] == ["ar", "sync 16"]


def test_constant_oracle_compares_only_arms_measured_on_every_prompt_and_splits_by_prompt():
    from benchmarks.adaptive_oracle import constant_oracle

    key = (10.0, 0.9)
    prompts = range(8)
    # the prompts' luck is common to every arm (paired); "fast" is 20% quicker on each of them;
    # "eliminated" ran only the pilot's two prompts, where it was quickest: it does not compete
    luck = [1.0, 1.6, 0.8, 1.2, 1.1, 0.9, 1.4, 1.0]
    measured = {
        "fast": {key: [(p, 0.8 * luck[p], 32) for p in prompts]},
        "slow": {key: [(p, 1.0 * luck[p], 32) for p in prompts]},
        "eliminated": {key: [(p, 0.1, 32) for p in prompts[:2]]},
    }
    split, in_sample = constant_oracle(measured)
    assert in_sample[key] == pytest.approx(0.8 * sum(luck) / (32 * 8))
    assert split[key] == pytest.approx(
        statistics.mean([0.8 * sum(luck[1::2]) / (32 * 4), 0.8 * sum(luck[0::2]) / (32 * 4)])
    )


def test_constant_split_oracle_is_not_biased_low_by_timing_noise():
    """Five equal arms whose per-prompt times carry independent timing noise: the in-sample
    minimum over them is below the truth, the split choice averages to it."""
    from benchmarks.adaptive_oracle import constant_oracle

    rng, key = random.Random(3), (10.0, 0.9)
    split, in_sample = [], []
    for _ in range(200):
        measured = {f"arm {a}": {key: [(p, rng.uniform(0.8, 1.2), 1) for p in range(12)]} for a in range(5)}
        s, i = constant_oracle(measured)
        split.append(s[key])
        in_sample.append(i[key])
    assert statistics.mean(in_sample) < 0.97
    assert statistics.mean(split) == pytest.approx(1.0, abs=0.015)


def test_prompt_matched_oracle_times_each_prompt_with_the_arm_chosen_on_the_other_half():
    """Per prompt: the arm best on the other half of the prompts, timed on this one. "fast" wins
    the even prompts, "slow" is never best; on the odd ones "odd" wins, so the even prompts are
    timed with "odd" (chosen on the odd half) and the odd ones with "fast"."""
    from benchmarks.adaptive_oracle import prompt_matched_oracle

    key = (10.0, 0.9)
    luck = [1.0, 1.6, 0.8, 1.2]
    measured = {
        "fast": {key: [(p, 0.8 * luck[p] if p % 2 == 0 else 1.1 * luck[p], 32) for p in range(4)]},
        "odd": {key: [(p, 0.9 * luck[p] if p % 2 == 0 else 0.7 * luck[p], 32) for p in range(4)]},
        "slow": {key: [(p, 1.2 * luck[p], 32) for p in range(4)]},
    }
    got = prompt_matched_oracle(measured)[key]
    assert got == pytest.approx({0: 0.9 * 1.0 / 32, 2: 0.9 * 0.8 / 32, 1: 1.1 * 1.6 / 32, 3: 1.1 * 1.2 / 32})


def test_a_policy_as_fast_as_the_oracle_on_its_own_prompts_scores_zero_against_the_matched_oracle():
    """A policy that took exactly the oracle's time on each of its prompts scores 0 against the
    prompt-matched oracle; against the class average over all the class's prompts it is credited
    its prompts' luck (here it ran only the three lucky ones of four: 15% "faster" than the oracle)."""
    from benchmarks.adaptive import RequestRun, Scenario, matched_vs_oracle_pct, vs_oracle_pct

    scenario = Scenario([10.0], 100.0, [0.9], 4, 4, 32, 16, ("ar", "pipelined"), 16)
    per_token = {0: 0.006, 1: 0.012, 2: 0.007, 3: 0.008}  # prompt 1 is the unlucky one
    runs, t_s = [], 0.0
    for p in (0, 2, 3):
        runs.append(RequestRun(t_s, 32 * per_token[p], 32, 0.9))
        t_s += 32 * per_token[p]
    lucky = {(10.0, 0.9): {i: per_token[p] for i, p in enumerate((0, 2, 3))}}  # run index -> its prompt's time
    assert matched_vs_oracle_pct(runs, lucky, scenario) == pytest.approx(0.0)
    class_average = {(10.0, 0.9): statistics.mean(per_token.values())}
    assert vs_oracle_pct(runs, class_average, scenario) == pytest.approx(-15.15, abs=0.01)


def test_the_warmup_cut_leaves_the_first_requests_out_of_every_run_and_their_prompts_out_of_the_oracle():
    """A policy that loses its first request (cold start) and then runs at the oracle's pace scores
    0 from request 1 on; the oracle is re-measured without prompt 0 (here prompt 0 was quick for the
    best arm, so the oracle without it is slower than with it)."""
    from benchmarks.adaptive_oracle import after_warmup, constant_oracle
    from benchmarks.adaptive_scenario import vs_oracle_pct

    sc = scenario()
    key = (10.0, 0.9)
    times = [0.1, 0.4, 0.4, 0.4]  # arm "fast", per prompt, 32 tokens each
    measured = {
        "fast": {key: [(p, times[p], 32) for p in range(4)]},
        "slow": {key: [(p, 2 * times[p], 32) for p in range(4)]},
    }
    starts = [0.0, 1.0, 1.4, 1.8]  # all inside the first 10-ms segment of 4 s
    policy = [RequestRun(starts[0], 1.0, 32, 0.9)] + [RequestRun(starts[p], 0.4, 32, 0.9) for p in range(1, 4)]
    results = {"model": policy, "static fast": [RequestRun(starts[p], times[p], 32, 0.9) for p in range(4)]}
    _, in_sample = constant_oracle(measured)
    assert vs_oracle_pct(results["model"], in_sample, sc) > 50
    cut, oracle = after_warmup(results, measured, 1, split=False)
    assert [len(runs) for runs in cut.values()] == [3, 3] and cut["model"][0].start_s == 1.0
    assert oracle[key] == pytest.approx(0.4 / 32) and oracle[key] > in_sample[key]
    assert vs_oracle_pct(cut["model"], oracle, sc) == pytest.approx(0.0)
    assert after_warmup(results, measured, 0, split=True)[1] == constant_oracle(measured)[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["--warmup-requests", "6", "--alpha-requests", "6"],
        ["--warmup-requests", "-1"],
        ["--launcher", "netns", "--oracle", "schedule", "--warmup-requests", "1"],
    ],
)
def test_a_warmup_that_leaves_a_class_without_prompts_or_has_no_oracle_to_remeasure_is_refused(argv, capsys):
    from benchmarks.adaptive import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "--warmup-requests" in capsys.readouterr().err
