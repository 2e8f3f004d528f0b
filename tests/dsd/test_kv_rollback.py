"""After a rejection the target's cache holds exactly the accepted prefix, and nothing is
computed twice (counted in forward positions)."""

import torch

from dsd.backends.protocol import SamplingParams
from dsd.speculation.drafting import draft_block
from dsd.speculation.stopping import StopRule
from dsd.drive.verifier_session import VerifierSession
from tests.torch_pairs import tiny_pair


def test_cache_holds_the_accepted_prefix_and_nothing_is_recomputed():
    draft, target = tiny_pair(seed=3, noise=0.05)
    prompt, gamma = [5, 17, 42, 8, 9, 60], 4
    session = VerifierSession(target, "s", prompt, SamplingParams(), StopRule(80))
    session.prefill()
    assert target.cached_length("s") == len(prompt) - 1
    target_positions = len(prompt) - 1
    rejections = 0
    for _ in range(200):
        if session.finished:
            break
        before = list(session.committed.tokens)
        drafted, _ = draft_block(draft, "s", before, gamma, SamplingParams(), None)
        verdict = session.verify(session.proposal_for(drafted, None))
        target_positions += gamma + 1
        rejections += verdict.accepted < gamma
        # The cache holds every committed token but the last, which the next pass feeds.
        assert target.cached_length("s") == len(session.committed) - 1
        assert target._caches["s"].tokens == session.committed.tokens[:-1]
        assert target._caches["s"].keys[0].shape[1] >= len(session.committed) - 1
        assert target.stats.positions_fed == target_positions
    assert rejections >= 3, "the test needs rejections to mean anything"
    # The cached state is right: logits through the cache equal a fresh full forward pass.
    tokens = session.committed.tokens
    through_cache = target.logits("s", tokens, 1)
    fresh = target.model(input_ids=torch.tensor([tokens])).logits[0, -1:]
    assert torch.allclose(through_cache, fresh, atol=1e-5)


def test_draft_model_feeds_each_position_once():
    draft, target = tiny_pair(seed=4, noise=0.05)
    prompt, gamma = [3, 1, 4, 1, 5], 3
    session = VerifierSession(target, "d", prompt, SamplingParams(), StopRule(60))
    session.prefill()
    expected = len(prompt) - 1  # the first step feeds the whole prompt: gamma - 1 + len(prompt)
    previous_full = False
    for _ in range(100):
        if session.finished:
            break
        drafted, _ = draft_block(draft, "d", session.committed.tokens, gamma, SamplingParams(), None)
        # Each step feeds one position; a round after a fully accepted block also feeds the
        # block's last draft token, which the draft produced but never consumed.
        expected += gamma + (1 if previous_full else 0)
        verdict = session.verify(session.proposal_for(drafted, None))
        previous_full = verdict.accepted == gamma
        assert draft.stats.positions_fed == expected
