"""Stratified synthetic acceptance: every request realises alpha, rounds stay truncated geometric."""

import json
import random

import pytest
from scipy import stats

from dsd.backends import acceptance as acc
from dsd.backends.factory import SyntheticBackendConfig, load_pair
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import Generation, generate_ar, generate_colocated
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from dsd.drive.driver import DriverConfig

ALPHAS = [0.5, 0.7, 0.85, 0.9]
COSTS = LinkCosts(t_draft_s=0.01, t_verify_s=0.05, rtt_s=0.02)


def _pair(alpha: float, acceptance: str = "stratified", seed: int = 0):
    config = SyntheticConfig(alpha=alpha, seed=seed, acceptance=acceptance)
    return SyntheticLM(config, "draft"), SyntheticLM(config, "target")


def _prompt(i: int) -> list[int]:
    rng = random.Random(i)
    return [rng.randrange(1, 512) for _ in range(rng.randrange(3, 12))]


@pytest.mark.parametrize("alpha", ALPHAS + [0.3, 0.97])
@pytest.mark.parametrize("gamma", [1, 3, 5, 8])
def test_schedule_keeps_the_running_drift_within_its_bound(alpha, gamma):
    bound = acc.drift_bound(alpha, gamma)
    for seed in range(20):
        counts = acc.stratified_accepted_counts(alpha, gamma, random.Random(seed))
        total = 0.0  # counted from the schedule's start
        for _ in range(500):
            total += acc.alpha_drift(next(counts), alpha, gamma)
            assert abs(total) <= bound + 1e-9


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("mode", ["colocated", "sync", "pipelined"])
def test_every_request_realises_alpha_within_0_005(alpha, mode):
    """Over 40 requests (prompts, i.e. seeds) per case, each long enough by tokens_needed:
    |alpha_measured - alpha| <= 0.005 for every one, in every mode (pipelined: its live rounds)."""
    gamma = 5
    n_tokens = acc.tokens_needed(alpha, gamma)
    assert n_tokens <= 320  # the length condition docs/backends.md states for gamma 5
    draft, target = _pair(alpha)
    worst = 0.0
    for i in range(40):
        stop = StopRule(n_tokens)
        if mode == "colocated":
            rounds = generate_colocated(draft, target, _prompt(i), gamma, stop, seq_id=str(i)).rounds
        else:
            rounds = simulate_dsd(
                draft,
                target,
                _prompt(i),
                stop,
                COSTS,
                DriverConfig(gamma, "pipelined" if mode == "pipelined" else "sync"),
                seq_id=str(i),
            ).generation.rounds
        worst = max(worst, abs(Generation([], rounds).alpha_measured - alpha))
    assert worst <= 0.005


def test_iid_acceptance_misses_0_005_on_the_same_requests():
    """The test above can fail: i.i.d. acceptance at the same length misses by far more."""
    alpha, gamma = 0.9, 5
    draft, target = _pair(alpha, "iid")
    errors = [
        abs(
            generate_colocated(
                draft, target, _prompt(i), gamma, StopRule(acc.tokens_needed(alpha, gamma)), seq_id=str(i)
            ).alpha_measured
            - alpha
        )
        for i in range(60)
    ]
    assert max(errors) > 0.02


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("gamma", [3, 5])
def test_accepted_counts_per_round_are_truncated_geometric(alpha, gamma):
    """Chi-square of the pooled per-round histogram (live rounds of 100 pipelined requests)
    against the truncated geometric: not rejected at the 1% level."""
    draft, target = _pair(alpha, seed=2)
    histogram = [0] * (gamma + 1)
    for i in range(100):
        run = simulate_dsd(
            draft, target, _prompt(i), StopRule(200), COSTS, DriverConfig(gamma, "pipelined"), seq_id=str(i)
        )
        for r in run.generation.rounds:
            if not r.stale:
                histogram[r.accepted] += 1
    n = sum(histogram)
    expected = [n * p for p in acc.truncated_geometric_pmf(alpha, gamma)]
    assert stats.chisquare(histogram, expected).pvalue > 0.01


@pytest.mark.parametrize("alpha", ALPHAS)
def test_a_request_s_sum_of_d_is_0_on_average(alpha):
    """The start points make alpha_measured unbiased: over 400 requests of 60 rounds, the mean sum of
    d (alpha_measured - alpha times the tested positions) is within 0.05 of 0; from a start at 0 it
    would be 0.05-0.25."""
    ends = []
    for seed in range(400):
        counts = acc.stratified_accepted_counts(alpha, 5, random.Random(seed))
        ends.append(sum(acc.alpha_drift(next(counts), alpha, 5) for _ in range(60)))
    assert abs(sum(ends) / len(ends)) < 0.05


def test_chi_square_rejects_a_schedule_that_is_not_geometric():
    """The histogram test has teeth: a constant accepted count with the right mean is rejected."""
    alpha, gamma, n = 0.7, 5, 3000
    histogram = [0] * (gamma + 1)
    histogram[2] = n // 2
    histogram[3] = n - n // 2
    expected = [n * p for p in acc.truncated_geometric_pmf(alpha, gamma)]
    assert stats.chisquare(histogram, expected).pvalue < 1e-6


def test_stratified_drafts_leave_the_output_the_target_stream():
    draft, target = _pair(0.7)
    prompt, stop = _prompt(1), StopRule(150)
    reference = generate_ar(target, prompt, stop, seq_id="ar").tokens
    assert generate_colocated(draft, target, prompt, 5, stop, seq_id="co").tokens == reference
    for pipelined in (False, True):
        assert (
            simulate_dsd(
                draft, target, prompt, stop, COSTS, DriverConfig(5, "pipelined" if pipelined else "sync"), seq_id="d"
            ).generation.tokens
            == reference
        )


def test_a_request_gets_the_same_rounds_in_every_mode():
    draft, target = _pair(0.85)
    prompt, stop = _prompt(3), StopRule(200)
    co = [r.accepted for r in generate_colocated(draft, target, prompt, 5, stop, seq_id="a").rounds]
    sync = [
        r.accepted
        for r in simulate_dsd(draft, target, prompt, stop, COSTS, DriverConfig(5, "sync"), seq_id="b").generation.rounds
    ]
    assert co == sync


def test_drafting_without_begin_request_is_refused():
    draft, _ = _pair(0.8)
    with pytest.raises(ValueError, match="begin_request"):
        draft.logits("x", [1, 2, 3], 1)


def test_acceptance_is_validated_and_reaches_the_pair():
    with pytest.raises(ValueError, match="acceptance"):
        SyntheticConfig(acceptance="sorted")
    with pytest.raises(ValueError, match="acceptance"):
        SyntheticBackendConfig(acceptance="sorted")
    draft, _ = load_pair(SyntheticBackendConfig(alpha=0.7, acceptance="stratified"))
    assert draft.config.acceptance == "stratified"


def test_service_flags_carry_acceptance():
    import argparse

    from orchestrator.launchers.processes import backend_args
    from services.compute import add_backend_args, backend_from_args

    backend = SyntheticBackendConfig(alpha=0.9, acceptance="stratified")
    parser = argparse.ArgumentParser()
    add_backend_args(parser)
    args = parser.parse_args(backend_args(backend, None) + ["--profile", "toy-edge-cloud"])
    assert backend_from_args(args)[0] == backend


def test_compose_carries_acceptance_to_both_services():
    from pathlib import Path

    from dsd.costs.profiles import get_profile
    from orchestrator.launchers.compose import ComposeConfig

    env = ComposeConfig(
        n_edges=1, profile=get_profile("toy-edge-cloud"), backend=SyntheticBackendConfig(acceptance="stratified")
    ).compose_env()
    assert json.loads(env["DSD_BACKEND_JSON"])["acceptance"] == "stratified"
    compose = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()
    assert compose.count("--backend-json=${DSD_BACKEND_JSON:-}") == 2  # verifier and edge
