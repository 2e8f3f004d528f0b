"""A draft over part of the target's vocabulary (dsd/backends/vocab_map.py): it reads and answers in
target ids, never proposes a dropped token, and speculative decoding with it stays exact."""

import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM

from dsd.backends.protocol import SamplingParams
from dsd.backends.torch_lm import TorchLM
from dsd.backends.vocab_map import VocabMap
from dsd.drive.generation import generate_ar, generate_colocated
from dsd.speculation.stopping import StopRule

VOCAB = 97
KEPT = list(range(0, VOCAB, 2))  # the even ids; odd ids are dropped


def _llama(vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def _pair() -> tuple[TorchLM, TorchLM]:
    vocab_map = VocabMap(KEPT, VOCAB)
    draft = TorchLM(_llama(len(KEPT) + 1, seed=1), "small-vocab-draft", None, vocab_map=vocab_map)
    return draft, TorchLM(_llama(VOCAB, seed=2), "target", None)


def test_vocab_map_round_trips_kept_ids_and_sends_the_rest_to_unknown():
    vocab_map = VocabMap(KEPT, VOCAB)
    table = vocab_map.to_draft()
    assert [int(table[t]) for t in KEPT] == list(range(len(KEPT)))
    assert {int(table[t]) for t in range(1, VOCAB, 2)} == {vocab_map.unknown_id}
    full = vocab_map.full_logits(torch.arange(2 * (len(KEPT) + 1), dtype=torch.float).view(2, -1))
    assert full.shape == (2, VOCAB)
    assert torch.isinf(full[:, 1::2]).all() and torch.equal(full[0, KEPT], torch.arange(len(KEPT), dtype=torch.float))


def test_a_small_vocab_draft_answers_over_the_target_vocabulary_and_never_proposes_a_dropped_token():
    draft, _ = _pair()
    assert draft.vocab_size == VOCAB
    logits = draft.logits("s", [3, 5, 8, 13], 4)  # odd (dropped) ids are valid inputs
    assert logits.shape == (4, VOCAB)
    assert torch.isinf(logits[:, 1::2]).all() and torch.isfinite(logits[:, ::2]).all()


def test_greedy_colocated_with_a_small_vocab_draft_equals_the_target_alone():
    draft, target = _pair()
    for i in range(6):
        prompt = [(5 * i + j) % VOCAB for j in range(4 + i)]
        stop = StopRule(max_new_tokens=24)
        reference = generate_ar(target, prompt, stop, seq_id=f"ar-{i}").tokens
        assert generate_colocated(draft, target, prompt, 4, stop, seq_id=f"co-{i}").tokens == reference
        assert any(t % 2 for t in reference), "the check needs target tokens the draft cannot propose"


def test_sampled_colocated_with_a_small_vocab_draft_keeps_the_target_distribution():
    """The first emitted token over 1,500 sampled runs against the target's own distribution
    at that position (chi-square over the tokens it gives >= 1% mass, the rest pooled)."""
    draft, target = _pair()
    prompt, sampling_t = [4, 9, 16, 25], 1.0
    p = torch.softmax(target.logits("ref", prompt, 1)[0] / sampling_t, dim=-1)
    counts = torch.zeros(VOCAB)
    runs = 1500
    for seed in range(runs):
        sampling = SamplingParams(temperature=sampling_t, seed=seed)
        tokens = generate_colocated(
            draft, target, prompt, 3, StopRule(max_new_tokens=1), sampling, seq_id=f"s{seed}"
        ).tokens
        counts[tokens[0]] += 1
    big = p >= 0.01
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    expected = torch.cat([p[big], p[~big].sum().view(1)]) * runs
    _, p_value = stats.chisquare(observed.numpy(), expected.numpy())
    assert p_value > 1e-3, (observed, expected)
    assert counts[1::2].sum() > 0, "odd tokens come only from the target's residual"
