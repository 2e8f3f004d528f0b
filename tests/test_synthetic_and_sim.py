"""The synthetic backend keeps its promises, and the simulated protocol meets the closed form."""
import math

import pytest

from dsd import latency_model as lm
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.decoding import Generation, generate_colocated
from dsd.simulate import LinkCosts, simulate_dsd
from dsd.stopping import StopRule


@pytest.mark.parametrize("alpha,gamma", [(0.5, 4), (0.8, 4), (0.9, 8), (0.7, 1)])
def test_measured_acceptance_and_tokens_per_round_match_alpha_and_E(alpha, gamma):
    config = SyntheticConfig(alpha=alpha, seed=5)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    rounds = []
    for i in range(25):
        rounds += generate_colocated(draft, target, [i + 1, 2, 3], gamma, StopRule(200), seq_id=str(i)).rounds
    measured = Generation([], rounds)
    n_rounds = len(rounds)
    # alpha_hat is a proportion over accepted + rejections trials; allow 4 standard errors.
    trials = sum(r.accepted for r in rounds) + sum(r.accepted < r.proposed for r in rounds)
    assert abs(measured.alpha_hat - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / trials)
    # Tokens per round: mean of a bounded variable, 4 standard errors (sd <= (gamma+1)/2).
    e = lm.expected_tokens_per_round(alpha, gamma)
    assert abs(measured.tokens_per_round - e) < 4 * ((gamma + 1) / 2) / math.sqrt(n_rounds)


def test_synthetic_streams_are_deterministic_and_eos_free_by_default():
    config = SyntheticConfig(alpha=0.6, seed=9)
    a = generate_colocated(SyntheticLM(config, "draft"), SyntheticLM(config, "target"), [1, 2], 4, StopRule(100))
    b = generate_colocated(SyntheticLM(config, "draft"), SyntheticLM(config, "target"), [1, 2], 4, StopRule(100))
    assert a.tokens == b.tokens and a.rounds == b.rounds
    assert config.eos_token_id not in a.tokens


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("rtt_s", [0.0, 0.006, 0.02, 0.08])
def test_simulated_protocol_meets_the_closed_form(pipelined, rtt_s):
    """Steady-state per-token time of the real protocol on virtual time vs the formula at the
    measured alpha: within 3% (the rest is the last, clipped round of each request)."""
    config = SyntheticConfig(alpha=0.8, seed=3)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    costs = LinkCosts(t_draft_s=0.004, t_verify_s=0.010, rtt_s=rtt_s)
    total_s, tokens, rounds = 0.0, 0, []
    for i in range(10):
        run = simulate_dsd(draft, target, [i + 1, 2, 3], 4, StopRule(300), costs, pipelined, seq_id=str(i))
        total_s += run.total_s - run.first_token_s
        tokens += len(run.generation.tokens) - run.generation.rounds[0].emitted
        rounds += run.generation.rounds
    alpha_hat = Generation([], rounds).alpha_hat
    model = lm.per_token_pipelined_dsd_s if pipelined else lm.per_token_sync_dsd_s
    predicted_s = model(alpha_hat, 4, costs.t_draft_s, costs.t_verify_s, rtt_s)
    assert total_s / tokens == pytest.approx(predicted_s, rel=0.03)
