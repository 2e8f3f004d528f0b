"""Under greedy decoding every mode emits exactly the tokens the target alone would emit."""

import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar, generate_colocated
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from dsd.drive.driver import DriverConfig

GAMMAS = (1, 2, 4, 8)
PROMPTS = [[(7 * i + j) % 500 + 1 for j in range(3 + i % 5)] for i in range(20)]
# Link timings chosen so that verdicts arrive mid-draft, just after drafting, and long after.
LINKS = [LinkCosts(0.004, 0.010, 0.0), LinkCosts(0.004, 0.010, 0.015), LinkCosts(0.004, 0.010, 0.120)]


def check_all_modes(draft, target, prompt, gamma, stop, seq_id):
    reference = generate_ar(target, prompt, stop, seq_id=f"{seq_id}-ar").tokens
    outputs = {"colocated": generate_colocated(draft, target, prompt, gamma, stop, seq_id=f"{seq_id}-co").tokens}
    for i, link in enumerate(LINKS):
        outputs[f"sync/{i}"] = simulate_dsd(
            draft, target, prompt, stop, link, DriverConfig(gamma, "sync"), seq_id=f"{seq_id}-s{i}"
        ).generation.tokens
        for depth in (1, 2):
            outputs[f"pipelined/{i}/{depth}"] = simulate_dsd(
                draft,
                target,
                prompt,
                stop,
                link,
                DriverConfig(gamma, "pipelined", max_in_flight=depth),
                seq_id=f"{seq_id}-p{i}{depth}",
            ).generation.tokens
    for mode, tokens in outputs.items():
        assert tokens == reference, f"{mode} differs from the target's greedy output"
    return reference


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("alpha", [0.3, 0.9])
def test_synthetic_every_mode_matches_target_greedy_at_the_budget(gamma, alpha):
    config = SyntheticConfig(alpha=alpha, seed=gamma)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    for i, prompt in enumerate(PROMPTS):
        stop = StopRule(max_new_tokens=17 + i)
        reference = check_all_modes(draft, target, prompt, gamma, stop, f"{alpha}-{gamma}-{i}")
        assert len(reference) == 17 + i


@pytest.mark.parametrize("gamma", GAMMAS)
def test_synthetic_every_mode_stops_at_eos(gamma):
    config = SyntheticConfig(alpha=0.8, seed=11, eos_prob=0.05)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    stopped_at_eos = 0
    for i, prompt in enumerate(PROMPTS):
        reference = check_all_modes(
            draft, target, prompt, gamma, StopRule(200, config.eos_token_id), f"eos-{gamma}-{i}"
        )
        if reference[-1] == config.eos_token_id:
            stopped_at_eos += 1
            assert config.eos_token_id not in reference[:-1]
    assert stopped_at_eos >= 15  # P(no EOS in 200 tokens) = 0.95^200, so nearly all do


@pytest.fixture(scope="module")
def default_pair():
    from dsd.backends.factory import HfBackendConfig, load_pair
    from orchestrator.spec.workload import make_prompts

    backend = HfBackendConfig()
    draft, target = load_pair(backend)
    return draft, target, make_prompts(backend, 20, 24, seed=3)


@pytest.mark.model
@pytest.mark.parametrize("gamma", GAMMAS)
def test_default_pair_every_mode_matches_target_greedy(default_pair, gamma):
    """20 held-out prompts; budgets from 8 to 46 tokens; EOS (id 0) stops a request where the
    target emits it."""
    draft, target, prompts = default_pair
    for i, prompt in enumerate(prompts):
        stop = StopRule(max_new_tokens=8 + 2 * i, eos_token_id=target.eos_token_id)
        check_all_modes(draft, target, prompt, gamma, stop, f"pair-{gamma}-{i}")


@pytest.mark.model
def test_default_pair_stops_at_the_stop_token_in_every_mode(default_pair):
    """This small pair almost never emits its own EOS (it loops), so a token it does emit
    stands in for EOS: every mode must stop right after the first one, as the target does."""
    draft, target, prompts = default_pair
    for i, prompt in enumerate(prompts[:6]):
        unstopped = generate_ar(target, prompt, StopRule(30), seq_id=f"probe-{i}").tokens
        stop_token = unstopped[5]
        stop = StopRule(max_new_tokens=30, eos_token_id=stop_token)
        reference = check_all_modes(draft, target, prompt, 4, stop, f"pair-stop-{i}")
        assert reference[-1] == stop_token and reference.index(stop_token) == len(reference) - 1
