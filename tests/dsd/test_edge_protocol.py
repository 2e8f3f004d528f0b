"""The pipelined protocol's bookkeeping: speculation, stale blocks, and bad verdicts."""

import pytest

from dsd.backends.protocol import Proposal, SamplingParams, Verdict
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.edge_decoder import EdgeDecoder
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from dsd.drive.verifier_session import VerifierSession
from tests.checks import every
from dsd.drive.driver import DriverConfig


def test_verifier_answers_stale_without_compute_when_the_base_differs():
    config = SyntheticConfig(alpha=1.0)
    target = SyntheticLM(config, "target")
    session = VerifierSession(target, "s", [1, 2, 3], SamplingParams(), StopRule(20))
    session.prefill()
    good = session.proposal_for([7, 8], None)
    wrong_digest = Proposal(good.start_pos, good.base_digest ^ 1, good.draft_tokens)
    wrong_position = Proposal(good.start_pos + 1, good.base_digest, good.draft_tokens)
    passes = target.stats.passes
    for proposal in (wrong_digest, wrong_position):
        verdict = session.verify(proposal)
        assert verdict.stale and verdict.emitted == 0
    assert target.stats.passes == passes
    assert session.generated == []


def test_speculation_survives_a_full_acceptance_and_dies_with_a_rejection():
    stop = StopRule(50)
    edge = EdgeDecoder([1, 2, 3], gamma=2, stop=stop, pipelined=True, max_in_flight=1)
    first = edge.next_draft()
    [block1] = edge.add_draft(first, [10, 11], None)
    guess = edge.next_draft()
    assert guess.with_guess and guess.prefix == [1, 2, 3, 10, 11]
    assert edge.add_draft(guess, [12], None) == []
    second = edge.next_draft()
    assert second.prefix == [1, 2, 3, 10, 11, 12] and second.n_tokens == 2
    assert edge.add_draft(second, [13, 14], None) == []  # held: one block in flight
    assert edge.next_draft() is None
    # Full acceptance with the guessed bonus: the held block goes out at once.
    emitted, to_send = edge.on_verdict(Verdict(block1.start_pos, 2, 2, 12))
    assert emitted == [10, 11, 12] and [p.start_pos for p in to_send] == [6]
    # A rejection refutes the speculation: drafting restarts from the corrected prefix.
    epoch = edge.epoch
    emitted, to_send = edge.on_verdict(Verdict(6, 2, 0, 99))
    assert emitted == [99] and to_send == [] and edge.epoch == epoch + 1
    restart = edge.next_draft()
    assert restart.prefix == [1, 2, 3, 10, 11, 12, 99] and not restart.with_guess


def test_blocks_sent_on_a_refuted_prefix_come_back_stale_and_are_counted():
    config = SyntheticConfig(alpha=0.5, seed=1)
    run = simulate_dsd(
        SyntheticLM(config, "draft"),
        SyntheticLM(config, "target"),
        [4, 5, 6],
        StopRule(300),
        LinkCosts(0.002, 0.001, 0.050),
        DriverConfig(3, "pipelined", max_in_flight=3),
    )
    stale = [r for r in run.generation.rounds if r.stale]
    assert stale and run.edge.stale_verdicts == len(stale)
    assert every(r.emitted == 0 for r in stale)


def test_a_verdict_for_another_block_is_an_error():
    edge = EdgeDecoder([1, 2], gamma=2, stop=StopRule(10))
    request = edge.next_draft()
    [block] = edge.add_draft(request, [5, 6], None)
    with pytest.raises(ValueError, match="does not answer the block in flight"):
        edge.on_verdict(Verdict(block.start_pos + 1, 2, 1, 7))


def test_edge_config_errors_name_the_field():
    with pytest.raises(ValueError, match="gamma"):
        EdgeDecoder([1], gamma=0, stop=StopRule(5))
    with pytest.raises(ValueError, match="max_in_flight"):
        EdgeDecoder([1], gamma=2, stop=StopRule(5), pipelined=True, max_in_flight=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        StopRule(0)


@pytest.mark.parametrize("rule", [StopRule(3), StopRule(3, eos_token_id=0), StopRule(1, eos_token_id=5)])
def test_finished_after_the_prompt_agrees_with_finished_on_the_generated_tokens(rule):
    for generated in ([], [0], [5], [1, 2], [1, 0], [1, 2, 3], [0, 0, 0, 0], [4, 5]):
        for prompt in ([7], [0, 5]):
            assert rule.finished_in(prompt + generated, len(prompt)) == rule.finished(generated), (prompt, generated)
