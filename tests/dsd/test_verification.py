import itertools

import pytest
import torch
from scipy import stats

from dsd.backends.protocol import SamplingParams
from dsd.drive.generation import generate_colocated
from dsd.speculation.stopping import StopRule
from dsd.speculation.verification import greedy_verify, probs_from_logits, sample_index, speculative_sample
from tests.dsd.control_helpers import bigram_sequence_probs
from tests.toy_models import BigramLM, random_bigram


def _one_hot_logits(tokens, vocab=6):
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_accepts_the_matching_prefix_and_corrects_the_first_mismatch():
    outcome = greedy_verify(_one_hot_logits([1, 2, 3, 4]), torch.tensor([1, 2, 5]))
    assert (outcome.accepted, outcome.next_token) == (2, 3)


def test_greedy_full_acceptance_returns_the_bonus_token():
    outcome = greedy_verify(_one_hot_logits([1, 2, 3, 4]), torch.tensor([1, 2, 3]))
    assert (outcome.accepted, outcome.next_token) == (3, 4)


def test_greedy_rejects_the_first_token():
    outcome = greedy_verify(_one_hot_logits([0, 2]), torch.tensor([1]))
    assert (outcome.accepted, outcome.next_token) == (0, 0)


def test_sample_index_draws_from_the_weights_support_in_proportion():
    """Weights with most entries zero, as after nucleus truncation of a large vocabulary:
    only non-zero entries come out, at their normalised weights (chi-square, 20k draws)."""
    weights = torch.zeros(1000)
    support = torch.tensor([3, 500, 501, 998])
    weights[support] = torch.tensor([0.5, 1.0, 2.0, 0.5])
    g = torch.Generator().manual_seed(3)
    draws = [sample_index(weights, g) for _ in range(20_000)]
    assert set(draws) <= set(support.tolist())
    counts = [draws.count(int(i)) for i in support]
    expected = (weights[support] / weights.sum() * len(draws)).tolist()
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_sample_index_refuses_all_zero_weights():
    with pytest.raises(ValueError, match="all zero"):
        sample_index(torch.zeros(5), torch.Generator().manual_seed(0))


def test_speculative_sampling_first_token_has_the_target_distribution():
    """The first emitted token of a round must follow p[0], whatever q is (chi-square, 40k draws)."""
    vocab, gamma, n = 5, 3, 40_000
    g = torch.Generator().manual_seed(7)
    p = torch.softmax(torch.randn(gamma + 1, vocab, generator=g), dim=-1)
    q = torch.softmax(2 * torch.randn(gamma, vocab, generator=g), dim=-1)
    counts = torch.zeros(vocab)
    for _ in range(n):
        draft = torch.multinomial(q, 1, generator=g)[:, 0]
        outcome = speculative_sample(p, q, draft, g)
        first = int(draft[0]) if outcome.accepted > 0 else outcome.next_token
        counts[first] += 1
    _, p_value = stats.chisquare(counts.numpy(), (p[0] * n).numpy())
    assert p_value > 1e-3, (counts / n, p[0])


def test_speculative_sampling_reproduces_the_target_sequence_distribution():
    """Co-located SD with sampling vs the exact distribution of the bigram target's 3-token
    continuations (vocab 4: 64 outcomes), 12k runs, chi-square at p > 1e-3 (fixed seeds)."""
    vocab, n_runs, length = 4, 12_000, 3
    target_table = random_bigram(vocab, seed=1, sharpness=1.5)
    draft_table = random_bigram(vocab, seed=2, sharpness=1.5)
    target, draft = BigramLM(target_table, "t"), BigramLM(draft_table, "d")
    prompt = [0]
    exact = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, previous = 1.0, prompt[-1]
        for token in seq:
            prob *= float(target_table[previous, token])
            previous = token
        exact[seq] = prob
    counts = dict.fromkeys(exact, 0)
    for run in range(n_runs):
        sampling = SamplingParams(temperature=1.0, seed=run)
        out = generate_colocated(draft, target, prompt, 2, StopRule(length), sampling, seq_id=str(run))
        counts[tuple(out.tokens)] += 1
    observed = [counts[s] for s in exact]
    total = sum(exact.values())  # 1 up to float32 rounding of the table
    expected = [exact[s] * n_runs / total for s in exact]
    _, p_value = stats.chisquare(observed, expected)
    assert p_value > 1e-3


def test_temperature_and_top_k_shape_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    top2 = probs_from_logits(logits, 1.0, 2)
    assert top2[0, 2:].sum() == 0 and top2.sum() == pytest.approx(1.0)
    assert probs_from_logits(logits, 0.5, None)[0, 0] > probs_from_logits(logits, 1.0, None)[0, 0]


def test_top_p_keeps_the_smallest_set_that_reaches_p_and_renormalises():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = torch.log(probs)
    kept = probs_from_logits(logits, 1.0, None, 0.7)  # 0.5 + 0.3 crosses 0.7
    assert kept[0].tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    assert probs_from_logits(logits, 1.0, None, 0.8)[0, 2] == 0  # exactly reached: stop
    assert probs_from_logits(logits, 1.0, None, 0.81)[0, 2] > 0
    assert probs_from_logits(logits, 1.0, None, 0.01)[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    shuffled = probs_from_logits(torch.log(probs[:, [2, 0, 3, 1]]), 1.0, None, 0.7)
    assert shuffled[0].tolist() == pytest.approx([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8])
    both = probs_from_logits(logits, 1.0, 3, 0.9)  # top-k first, then top-p
    assert both[0, 3] == 0 and both[0, 2] > 0


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (None, 0.75), (4, 0.9)])
def test_colocated_sampling_with_truncation_reproduces_the_targets_truncated_distribution(top_k, top_p):
    """Co-located SD with top-k/top-p vs the exact distribution of the target's own truncated
    sampling of 3-token continuations (vocab 5), 6k runs, chi-square at p > 1e-3."""
    vocab, n_runs, length, temperature = 5, 6_000, 3, 0.9
    target_table = random_bigram(vocab, seed=3, sharpness=1.5)
    draft_table = random_bigram(vocab, seed=4, sharpness=1.5)
    target, draft = BigramLM(target_table, "t"), BigramLM(draft_table, "d")
    step = probs_from_logits(torch.log(target_table), temperature, top_k, top_p)  # [vocab, vocab]
    exact = {seq: prob for seq, prob in bigram_sequence_probs(step, vocab, length).items() if prob > 0}
    counts = dict.fromkeys(exact, 0)
    for run in range(n_runs):
        sampling = SamplingParams(temperature, top_k, run, top_p)
        out = generate_colocated(draft, target, [0], 2, StopRule(length), sampling, seq_id=str(run))
        assert tuple(out.tokens) in counts, f"{out.tokens} is outside the truncated support"
        counts[tuple(out.tokens)] += 1
    big = [s for s in exact if exact[s] * n_runs >= 5]
    observed = [counts[s] for s in big] + [n_runs - sum(counts[s] for s in big)]
    expected = [exact[s] * n_runs for s in big] + [n_runs * (1 - sum(exact[s] for s in big))]
    expected = [e * n_runs / sum(expected) for e in expected]
    _, p_value = stats.chisquare(observed, expected)
    assert p_value > 1e-3


@pytest.mark.parametrize("scale", [8.0, 3.0, 0.01])  # peaked rows (nucleus in the top 1,024) .. flat (it is not)
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_the_nucleus_found_among_the_top_tokens_is_the_full_sorts(scale, top_p):
    from dsd.speculation.verification import _nucleus, _nucleus_by_sort

    generator = torch.Generator().manual_seed(int(scale * 100 + top_p * 1000))
    probs = torch.softmax(torch.randn(4, 49152, generator=generator) * scale, dim=-1)
    fast, full = _nucleus(probs, top_p), _nucleus_by_sort(probs, top_p)
    assert torch.equal(fast > 0, full > 0)
    assert torch.allclose(fast, full, rtol=1e-5, atol=1e-9)
    assert torch.allclose(fast.sum(-1), torch.ones(4))
