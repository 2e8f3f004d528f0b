"""Cached pipelined DSD (dsd.cache.speculation_cache, dsd.cache.filler): the outcomes it drafts for, that it
commits the tokens of every other mode for one seed, hit or miss, and that its closed form
(dsd.analytic.latency_model.per_token_cached_dsd_s) is the protocol's time on the simulator."""

from __future__ import annotations

import pytest
import torch

from dsd.analytic import latency_model as lm
from dsd.backends.protocol import SamplingParams
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.cache.filler import PassTimes
from dsd.drive.generation import generate_colocated
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.cache.speculation_cache import (
    CacheConfig,
    Calibration,
    Outcome,
    SpeculationCache,
    batch_step_s,
    fill_plan,
    rank_outcomes,
    top_tokens,
)
from dsd.speculation.stopping import StopRule
from tests.checks import every
from tests.toy_models import BigramLM, random_bigram
from dsd.drive.driver import DriverConfig

VOCAB, GAMMA, TOKENS = 40, 3, 60
PROMPT = [3, 14, 15]


def _pair(seed: int, agreement: float = 0.6):
    target = BigramLM(random_bigram(VOCAB, seed=seed, sharpness=2.0), "target")
    draft = BigramLM(
        random_bigram(VOCAB, seed=seed + 1, sharpness=2.0) * (1 - agreement) + target.probs * agreement, "draft"
    )
    return draft, target


def _run(mode: str, seed: int, sampling: SamplingParams, link: LinkCosts, cache: CacheConfig = CacheConfig()):
    draft, target = _pair(seed)
    return simulate_dsd(
        draft,
        target,
        PROMPT,
        StopRule(TOKENS),
        link,
        DriverConfig(GAMMA, mode, max_in_flight=2 if mode == "pipelined" else 1, cache=cache),
        sampling=sampling,
    )


def _records(run):
    return [r.cache for r in run.generation.rounds if r.cache is not None]


def test_outcomes_are_ranked_by_acceptance_length_and_the_drafts_other_tokens():
    block = [5, 6]
    rows = torch.zeros(3, 10)
    rows[0, [5, 1, 2]] = torch.tensor([0.5, 0.3, 0.2])  # x_0 = 5: a correction is 1 (0.6) or 2 (0.4)
    rows[1, [6, 3]] = torch.tensor([0.9, 0.1])  # x_1 = 6: a correction is 3 (1.0)
    rows[2, [7, 8]] = torch.tensor([0.7, 0.3])  # the bonus: 7 or 8
    ranked = rank_outcomes(block, rows, alpha=0.5, k=2)
    probability = {c.outcome: c.probability for c in ranked}
    assert probability[Outcome(0, 1)] == pytest.approx(0.5 * 0.6)
    assert probability[Outcome(1, 3)] == pytest.approx(0.25 * 1.0)
    assert probability[Outcome(2, 7)] == pytest.approx(0.25 * 0.7)
    assert ranked[0].outcome == Outcome(0, 1) and Outcome(0, 5) not in probability, "the rejected token is no outcome"
    assert sum(probability.values()) == pytest.approx(1.0), "every outcome these rows allow is ranked"
    assert [p for _, p in top_tokens(rows[0], 5, exclude=5)] == pytest.approx([0.6, 0.4])


def test_the_fill_plan_weighs_hit_mass_against_the_depth_the_wait_allows():
    config = CacheConfig(max_branches=8)
    step_s = lambda b: 0.010 * (1 + 0.1 * (b - 1))  # noqa: E731
    flat = [0.05] * 20
    assert fill_plan(config, flat, None, 2, step_s) == (8, 2), "before a wait is known: all it may"
    # in 25 ms: 3 branches go 2 passes deep (0.15 x 2), 8 branches 1 pass (0.40 x 1)
    assert fill_plan(config, flat, 0.025, 2, step_s) == (8, 1)
    assert fill_plan(config, flat[:3], 0.025, 2, step_s) == (3, 2)
    assert fill_plan(config, [0.9] + [0.0] * 19, 0.025, 2, step_s) == (1, 2), "one likely outcome: deep beats wide"
    assert fill_plan(config, flat[:5], 1.0, 2, step_s) == (5, 2)
    assert fill_plan(CacheConfig(fanout=2), flat, 1.0, 2, step_s) == (2, 2)


def test_no_pass_starts_that_the_expected_verdict_would_interrupt():
    step_s = lambda b: 0.010 * b  # noqa: E731
    assert fill_plan(CacheConfig(fanout=4), [0.1] * 8, 0.025, 2, step_s) == (4, 0), "a 40 ms pass in a 25 ms wait"
    assert fill_plan(CacheConfig(fanout=2), [0.1] * 8, 0.025, 2, step_s) == (2, 1)
    assert fill_plan(CacheConfig(), [0.1] * 8, 0.005, 2, step_s)[1] == 0, "not even one branch fits"


def test_a_batched_pass_is_costed_from_the_passes_measured_so_far():
    measured = {1: 0.010, 16: 0.040}
    assert batch_step_s(measured, 16, 0.05) == 0.040
    assert batch_step_s(measured, 6, 0.05) == pytest.approx(0.020), "between two sizes: linear"
    assert batch_step_s(measured, 31, 0.05) == pytest.approx(0.070), "above: the line through 1 and the largest"
    assert batch_step_s({1: 0.010}, 11, 0.05) == pytest.approx(0.015), "only the step alone: the slope"
    assert batch_step_s({8: 0.030}, 4, 0.05) == 0.030, "below the smallest: no cheaper than it"
    assert batch_step_s({}, 4, 0.05) == 0.0


def test_a_cache_knows_which_outcome_a_committed_prefix_was():
    cache = SpeculationCache(base=[1, 2], block=[7, 8], candidates=[], branches=[])
    assert cache.outcome_of([1, 2, 7, 9]) == Outcome(1, 9)
    assert cache.outcome_of([1, 2, 7, 8, 4]) == Outcome(2, 4)
    assert cache.outcome_of([1, 2, 5]) == Outcome(0, 5)
    assert cache.outcome_of([1, 3, 5]) is None and cache.outcome_of([1, 2]) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_cached_commits_the_tokens_of_colocated_sync_and_pipelined_for_one_seed(seed, temperature):
    sampling = SamplingParams(temperature=temperature, seed=100 + seed, top_p=0.95 if temperature else 1.0)
    link = LinkCosts(t_draft_s=0.01, t_verify_s=0.03, rtt_s=0.05)
    draft, target = _pair(seed)
    outputs = {"colocated": generate_colocated(draft, target, PROMPT, GAMMA, StopRule(TOKENS), sampling).tokens}
    # three branches: few enough that some verdicts miss
    runs = {mode: _run(mode, seed, sampling, link, CacheConfig(fanout=3)) for mode in ("sync", "pipelined", "cached")}
    outputs |= {mode: run.generation.tokens for mode, run in runs.items()}
    assert all(len(t) == TOKENS for t in outputs.values())
    assert len({tuple(t) for t in outputs.values()}) == 1, outputs
    records = _records(runs["cached"])
    assert records and any(r.hit for r in records) and any(not r.hit for r in records), (
        "hits and misses both happened on the way: the same output is not trivial"
    )
    assert not any(r.stale for r in runs["cached"].generation.rounds), "one block in flight: nothing comes back stale"


def test_a_verdict_that_comes_mid_fill_uses_the_branch_as_far_as_it_got():
    # a slow draft, many branches and a short wait: the verdict lands before the fill is done
    link = LinkCosts(t_draft_s=0.02, t_verify_s=0.03, rtt_s=0.0)
    sampling = SamplingParams()
    slow = _run("cached", 0, sampling, link, CacheConfig(fanout=16, batch_slope=0.2))
    records = _records(slow)
    assert any(r.hit and 0 < r.depth < GAMMA for r in records), [(r.hit, r.depth) for r in records]
    assert slow.generation.tokens == _run("sync", 0, sampling, link).generation.tokens


def _held(records, gamma: int) -> float:
    """The steps held (the analysis's cache_hit_rate): the verdicts before the last, whose hits
    cut the cycles after the first short."""
    return sum(r.hit * min(r.depth, gamma) / gamma for r in records[:-1]) / len(records[:-1])


def _cycles_s(run, link: LinkCosts, held: float) -> tuple[float, float]:
    """(measured, closed form) seconds from one verdict to the next of a cached run."""
    measured_cycle_s = (run.total_s - run.first_token_s) / (len(run.generation.rounds) - 1)
    alpha = run.generation.alpha_measured
    return measured_cycle_s, lm.expected_tokens_per_round(alpha, GAMMA) * lm.per_token_cached_dsd_s(
        alpha, GAMMA, link.t_draft_s, link.t_verify_s, link.rtt_s, held
    )


@pytest.mark.parametrize("rtt_ms", [0, 10, 40, 80])
def test_the_closed_form_is_the_protocols_time_on_the_simulator(rtt_ms):
    link = LinkCosts(t_draft_s=0.012, t_verify_s=0.06, rtt_s=rtt_ms / 1e3)
    run = _run("cached", 2, SamplingParams(), link, CacheConfig(fanout=3))
    records = _records(run)
    # the closed form's hit: a complete branch at the verdict (the fill fits the wait here)
    assert every(r.fill_s <= link.rtt_s + link.t_verify_s + 1e-9 for r in records if r.branches)
    assert all(r.depth in (0, GAMMA) for r in records) and 0.2 < _held(records, GAMMA) < 1.0
    measured_cycle_s, predicted_cycle_s = _cycles_s(run, link, _held(records, GAMMA))
    assert measured_cycle_s == pytest.approx(predicted_cycle_s, rel=0.01)


@pytest.mark.parametrize("rtt_ms", [0, 10])
def test_the_closed_form_counts_a_branch_part_drafted_by_plan_as_the_steps_it_saves(rtt_ms):
    # a pass over 3 branches costs 24 ms: after the 12 ms step past the block, one pass fits the
    # wait, so the fill stops a pass deep and its hits save one draft step of two
    link = LinkCosts(t_draft_s=0.012, t_verify_s=0.04, rtt_s=rtt_ms / 1e3)
    run = _run("cached", 2, SamplingParams(), link, CacheConfig(fanout=3, batch_slope=0.5))
    records = _records(run)[1:]  # the first fill knows no wait yet: gamma deep
    assert all(r.depth <= 1 for r in records) and any(r.hit and r.depth == 1 for r in records)
    measured_cycle_s, predicted_cycle_s = _cycles_s(run, link, _held(records, GAMMA))
    assert measured_cycle_s == pytest.approx(predicted_cycle_s, rel=0.03)


def test_the_cache_beats_colocated_below_the_drafting_window_as_the_hit_rate_grows():
    args = dict(alpha=0.55, gamma=2, t_draft_edge_s=0.012, t_draft_server_s=0.012, t_verify_s=0.06)
    assert lm.cached_beats_colocated_rtt_s(**args, hit_rate=1.0) == pytest.approx(2 * 0.012, abs=1e-6)
    assert lm.cached_beats_colocated_rtt_s(**args, hit_rate=0.6) == pytest.approx(2 * 0.012 - 0.4 * 2 * 0.012, abs=1e-6)
    assert lm.cached_beats_colocated_rtt_s(**args, hit_rate=0.0) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("acceptance", ["iid", "stratified"])
def test_synthetic_drafts_branch_as_their_source_would_draft(acceptance):
    config = SyntheticConfig(alpha=0.9, acceptance=acceptance, seed=3)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    link = LinkCosts(t_draft_s=0.01, t_verify_s=0.03, rtt_s=0.02)
    runs = {
        mode: simulate_dsd(draft, target, [1, 2, 3, 4], StopRule(64), link, DriverConfig(4, mode), seq_id=mode)
        for mode in ("sync", "cached")
    }
    assert runs["sync"].generation.tokens == runs["cached"].generation.tokens
    # one-hot drafts know nothing of a correction; their guess of the bonus hits where they are right
    assert any(r.cache.hit for r in runs["cached"].generation.rounds)


def test_a_cache_config_names_its_bad_field():
    for bad in (
        {"fanout": 0},
        {"fanout": "many"},
        {"tokens_per_position": 0},
        {"batch_slope": -1.0},
        {"alpha_prior": 1.0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CacheConfig(**bad)


def test_pass_times_carry_a_running_estimate_per_batch_size():
    times = PassTimes()
    times.note(1, 0.010)
    times.note(16, 0.040)
    times.note(16, 0.030)
    assert times.seconds[16] == pytest.approx(0.7 * 0.040 + 0.3 * 0.030)
    assert times.step_s(8, 0.05) == pytest.approx(0.010 + (times.seconds[16] - 0.010) * 7 / 15)


def test_the_calibration_scales_each_accepted_length_by_what_it_caught():
    block = [5, 6]
    rows = torch.zeros(3, 10)
    rows[0, [5, 1]] = torch.tensor([0.5, 0.5])  # a correction at j = 0: 1 (1.0)
    rows[1, [6, 3, 4]] = torch.tensor([0.5, 0.25, 0.25])  # at j = 1: 3 or 4 (0.5 each)
    rows[2, [7]] = 1.0  # the bonus: 7 (1.0)
    calibration = Calibration(prior=1.0)
    assert calibration.coverage(2) == [1.0, 1.0, 1.0]
    for _ in range(3):  # the target corrected x_0 to 9 three times ...
        calibration.note(rank_outcomes(block, rows, 0.5, k=2), Outcome(0, 9))
    calibration.note(rank_outcomes(block, rows, 0.5, k=2), Outcome(2, 7))  # ... and the bonus was 7 once
    coverage = calibration.coverage(2)
    assert coverage == pytest.approx([(0 + 1) / (3 + 1), 1.0, (1 + 1) / (1 + 1)])
    plain, calibrated = rank_outcomes(block, rows, 0.5, k=2), rank_outcomes(block, rows, 0.5, k=2, coverage=coverage)
    assert plain[0].outcome == Outcome(0, 1), "uncalibrated: the likeliest accepted length first"
    assert calibrated[0].outcome == Outcome(2, 7), "calibrated: the length the draft predicts well first"
    assert calibrated[0].token_probability == 1.0


def test_a_cache_config_names_a_calibrate_that_is_not_a_boolean():
    with pytest.raises(ValueError, match="calibrate"):
        CacheConfig(calibrate="yes")
