"""Common random numbers across modes (dsd.speculation.draws): with one seed, co-located SD, synchronous DSD
and pipelined DSD commit the same tokens, because each block draws from a generator keyed by
where it starts; different seeds still give different outputs."""

import pytest

from dsd.backends.protocol import SamplingParams
from dsd.drive.generation import generate_colocated
from dsd.speculation.draws import DRAFT, TARGET, VERIFY, Draws, draw_key
from dsd.simulation.one_client import LinkCosts, ServerCosts, simulate_dsd, simulate_on_server
from dsd.speculation.stopping import StopRule
from tests.toy_models import BigramLM, random_bigram
from tests.checks import every
from dsd.drive.driver import DriverConfig

VOCAB, GAMMA, TOKENS = 40, 3, 60
PROMPT = [3, 14, 15]
SERVER = ServerCosts(t_ar_s=0.02, t_draft_s=0.01, t_verify_s=0.03, t_prefill_s=0.0, one_way_s=0.025)


def _pair(seed: int):
    target = BigramLM(random_bigram(VOCAB, seed=seed, sharpness=2.0), "target")
    draft = BigramLM(random_bigram(VOCAB, seed=seed + 1, sharpness=2.0) * 0.4 + target.probs * 0.6, "draft")
    return draft, target


def _outputs(seed: int, sampling: SamplingParams):
    draft, target = _pair(seed)
    stop = StopRule(TOKENS)
    link = LinkCosts(t_draft_s=0.01, t_verify_s=0.03, rtt_s=0.05)
    pipelined = simulate_dsd(
        draft, target, PROMPT, stop, link, DriverConfig(GAMMA, "pipelined", max_in_flight=2), sampling=sampling
    )
    return {
        "colocated": generate_colocated(draft, target, PROMPT, GAMMA, stop, sampling).tokens,
        "colocated, as the services run it": simulate_on_server(
            draft, target, PROMPT, GAMMA, stop, "colocated", SERVER, sampling
        ).generation.tokens,
        "sync": simulate_dsd(
            draft, target, PROMPT, stop, link, DriverConfig(GAMMA, "sync"), sampling=sampling
        ).generation.tokens,
        "pipelined": pipelined.generation.tokens,
    }, pipelined


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_colocated_sync_and_pipelined_commit_the_same_tokens_under_sampling(seed):
    sampling = SamplingParams(temperature=1.0, seed=100 + seed, top_p=0.95)
    outputs, pipelined = _outputs(seed, sampling)
    assert every(len(tokens) == TOKENS for tokens in outputs.values())
    assert len({tuple(tokens) for tokens in outputs.values()}) == 1, outputs
    # The pipelined run speculated and was refuted on the way: its same output is not trivial.
    rounds = pipelined.generation.rounds
    assert any(r.stale for r in rounds) and any(r.accepted == GAMMA for r in rounds if not r.stale)


def test_other_seeds_give_other_outputs():
    first, _ = _outputs(0, SamplingParams(temperature=1.0, seed=7))
    second, _ = _outputs(0, SamplingParams(temperature=1.0, seed=8))
    assert first["sync"] != second["sync"]


def test_keys_differ_by_seed_position_and_role_and_repeat_exactly():
    keys = {
        draw_key(seed, position, role)
        for seed in range(3)
        for position in range(50)
        for role in (DRAFT, VERIFY, TARGET)
    }
    assert len(keys) == 3 * 50 * 3
    assert draw_key(5, 9, DRAFT) == draw_key(5, 9, DRAFT)
    draws = Draws(5)
    assert draws.at(9, VERIFY).initial_seed() == draw_key(5, 9, VERIFY)


def test_a_bad_role_or_position_is_refused_by_name():
    with pytest.raises(ValueError, match="role must be one of"):
        draw_key(1, 2, "bonus")
    with pytest.raises(ValueError, match="position must be >= 0"):
        draw_key(1, -1, DRAFT)
