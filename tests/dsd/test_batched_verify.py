"""Batched verification on the hf backend: several sessions (different prefix lengths, different
gamma) verified in one forward pass give the unbatched verdicts token for token (float32), leave
each session's KV cache as an unbatched pass would, and keep speculative sampling exact."""

import pytest
import torch
from scipy import stats

from dsd.backends.protocol import LogitsRequest, SamplingParams, run_jobs
from dsd.backends.torch_lm import TorchLM
from dsd.drive.generation import generate_ar
from dsd.speculation.draws import Draws
from dsd.speculation.drafting import draft_block
from dsd.speculation.stopping import StopRule
from dsd.drive.verifier_session import VerifierSession
from tests.torch_pairs import tiny_pair
from tests.checks import every

GREEDY = SamplingParams()
PROMPTS = [
    [5, 17, 42],
    [9] * 11,
    [3, 1, 4, 1, 5, 9, 2, 6],
    [60, 61],
    [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
    [44],
    [20, 30, 40, 50, 60, 70],
]
GAMMAS = [1, 2, 3, 4, 5, 6, 8]


def _sessions(target, prefix: str, budget: int) -> list[VerifierSession]:
    sessions = [
        VerifierSession(target, f"{prefix}{i}", prompt, GREEDY, StopRule(budget)) for i, prompt in enumerate(PROMPTS)
    ]
    for s in sessions:
        s.prefill()
    return sessions


def _round_jobs(draft, sessions, gammas):
    """Each unfinished session's draft block (greedy, on its committed prefix) as a verify job."""
    jobs = []
    for s, gamma in zip(sessions, gammas):
        if not s.finished:
            drafted, _ = draft_block(draft, s.seq_id, s.committed.tokens, gamma, GREEDY, None)
            jobs.append(s.verify_job(s.proposal_for(drafted, None)))
    return jobs


def _run_batched_and_serial(draft, target_batched, target_serial, budget=40, rounds=60):
    batched = _sessions(target_batched, "b", budget)
    serial = _sessions(target_serial, "s", budget)
    verdicts_b, verdicts_s = [], []
    for _ in range(rounds):
        jobs = _round_jobs(draft, batched, GAMMAS)
        if not jobs:
            break
        outcomes = run_jobs(jobs)
        assert every(ok for ok, _ in outcomes), outcomes
        verdicts_b.append([v for _, v in outcomes])
        verdicts_s.append([job.run() for job in _round_jobs(draft, serial, GAMMAS)])
    return batched, serial, verdicts_b, verdicts_s


def test_batched_verification_equals_unbatched_greedy_token_for_token():
    draft, target = tiny_pair(seed=5, noise=0.05)
    serial_target = TorchLM(target.model, "tiny-target-serial", None)
    passes_before = target.stats.passes
    batched, serial, verdicts_b, verdicts_s = _run_batched_and_serial(draft, target, serial_target)
    assert verdicts_b == verdicts_s
    rejected = sum(v.accepted < v.proposed for round_ in verdicts_b for v in round_)
    assert rejected >= 10, "the test needs rejections to mean anything"
    # One pass per round for every session together.
    assert target.stats.passes - passes_before == sum(len(p) > 1 for p in PROMPTS) + len(verdicts_b)
    for b, s in zip(batched, serial):
        assert b.committed.tokens == s.committed.tokens
        # And both are the target's own greedy continuation.
        reference = generate_ar(
            serial_target, list(b.committed.tokens[: b.prompt_length]), StopRule(40), seq_id=f"ref-{b.seq_id}"
        ).tokens
        assert b.generated == reference


def test_cache_after_a_batched_pass_and_rollback_equals_the_unbatched_one():
    draft, target = tiny_pair(seed=6, noise=0.08)
    serial_target = TorchLM(target.model, "tiny-target-serial", None)
    batched, serial, verdicts_b, _ = _run_batched_and_serial(draft, target, serial_target, budget=60, rounds=6)
    assert any(v.accepted < v.proposed for round_ in verdicts_b for v in round_)
    for b, s in zip(batched, serial):
        n = len(b.committed) - 1  # the cache holds every committed token but the last
        assert target._caches[b.seq_id].tokens == b.committed.tokens[:-1] == s.committed.tokens[:-1]
        assert target.cached_length(b.seq_id) == serial_target.cached_length(s.seq_id) == n
        for layer in range(len(target._caches[b.seq_id].keys)):
            for part in ("keys", "values"):
                mine = getattr(target._caches[b.seq_id], part)[layer][:, :n]
                theirs = getattr(serial_target._caches[s.seq_id], part)[layer][:, :n]
                assert torch.allclose(mine, theirs, atol=1e-5), (b.seq_id, layer, part)
        # The cached state is right: logits through the cache equal a fresh full forward pass.
        tokens = b.committed.tokens
        through_cache = target.logits(b.seq_id, tokens, 2)
        fresh = target.model(input_ids=torch.tensor([tokens])).logits[0, -2:]
        assert torch.allclose(through_cache, fresh, atol=1e-5)


def test_a_batched_pass_returns_each_sequence_its_unbatched_logits():
    """Rows of different cached lengths and new positions (one of them with nothing cached)."""
    _, target = tiny_pair(seed=7)
    reference = TorchLM(target.model, "reference", None)
    requests = [
        LogitsRequest("a", list(range(1, 30)), 5),
        LogitsRequest("b", [4, 5, 6], 1),
        LogitsRequest("c", list(range(40, 52)), 12),
        LogitsRequest("d", [9, 9, 9, 9, 9, 9], 2),
    ]
    for r in requests[:3]:  # warm caches of different lengths ("d" has none)
        target.logits(r.seq_id, r.tokens[: -r.n_last] or r.tokens[:1], 1)
    batched = target.logits_batch(requests)
    for r, logits in zip(requests, batched):
        alone = reference.logits(r.seq_id, r.tokens, r.n_last)
        assert logits.shape == alone.shape == (r.n_last, target.vocab_size)
        assert torch.allclose(logits, alone, atol=1e-5), r.seq_id
        assert target.cached_length(r.seq_id) == len(r.tokens)


def test_a_batch_with_a_failing_sequence_fails_only_that_job():
    """A row beyond the model's positions makes the batched pass fail; the jobs then run alone."""
    draft, target = tiny_pair(seed=8)  # n_positions = 256
    ok_session = VerifierSession(target, "ok", [5, 6, 7], GREEDY, StopRule(10))
    long_session = VerifierSession(target, "long", [5] * 300, GREEDY, StopRule(10))
    ok_session.prefill()
    jobs = [
        ok_session.verify_job(ok_session.proposal_for([1, 2], None)),
        long_session.verify_job(long_session.proposal_for([1, 2], None)),
    ]
    (ok, verdict), (failed, error) = run_jobs(jobs)
    assert ok and verdict.proposed == 2 and len(ok_session.committed) == 3 + verdict.emitted
    assert not failed and isinstance(error, Exception)


def test_a_batch_names_each_sequence_once():
    _, target = tiny_pair(seed=9)
    with pytest.raises(ValueError, match="each sequence once"):
        target.logits_batch([LogitsRequest("x", [1, 2], 1), LogitsRequest("x", [1, 2, 3], 1)])


def test_batched_speculative_sampling_keeps_the_target_distribution():
    """The first token a round emits follows the target's p (temperature 1), whatever the draft:
    8 sessions verified per batched pass, 3200 rounds, chi-square at p > 1e-3 (fixed seeds)."""
    draft, target = tiny_pair(seed=10, noise=0.3, vocab=11)
    prompt, gamma, n_sessions, n_passes = [3, 7, 2], 2, 8, 400
    p = torch.softmax(target.logits("p", prompt, 1)[0], dim=-1)  # [vocab]
    sampling = [SamplingParams(temperature=1.0, seed=1000 + i) for i in range(n_sessions)]
    counts = torch.zeros(target.vocab_size)
    for round_ in range(n_passes):
        jobs, firsts = [], []
        for i in range(n_sessions):
            session = VerifierSession(target, f"v{i}", prompt, sampling[i], StopRule(gamma + 1))
            session.draws = Draws(round_ * n_sessions + i)
            drafted, q = draft_block(draft, f"d{i}", prompt, gamma, sampling[i], session.draws)
            jobs.append(session.verify_job(session.proposal_for(drafted, q)))
            firsts.append(drafted[0])
        for (ok, verdict), first in zip(run_jobs(jobs), firsts):
            assert ok, verdict
            counts[first if verdict.accepted > 0 else verdict.next_token] += 1
    every = p.double() / p.double().sum() * counts.sum().double()
    rare = every < 5  # chi-square wants >= 5 expected per cell: pool the rest
    observed, expected = counts.double()[~rare], every[~rare]
    if rare.any():
        observed = torch.cat([observed, counts.double()[rare].sum().reshape(1)])
        expected = torch.cat([expected, every[rare].sum().reshape(1)])
    _, p_value = stats.chisquare(observed.numpy(), expected.numpy())
    assert p_value > 1e-3, (counts / counts.sum(), p)


@pytest.mark.model
def test_default_pair_batched_verification_equals_unbatched():
    from dsd.backends.factory import HfBackendConfig, load_pair

    draft, target = load_pair(HfBackendConfig())
    serial_target = TorchLM(target.model, "default-target-serial", None)
    batched, serial, verdicts_b, verdicts_s = _run_batched_and_serial(draft, target, serial_target, budget=30)
    assert verdicts_b == verdicts_s
    assert [b.committed.tokens for b in batched] == [s.committed.tokens for s in serial]


def test_batched_ar_steps_emit_each_session_its_own_greedy_tokens():
    """Cloud AR batched the same way: one pass per step for every session."""
    _, target = tiny_pair(seed=12)
    reference = TorchLM(target.model, "reference", None)
    sessions = _sessions(target, "ar", 12)
    passes_before = target.stats.passes
    for _ in range(12):
        for ok, value in run_jobs([s.ar_job() for s in sessions if not s.finished]):
            assert ok, value
    assert target.stats.passes - passes_before == 12
    for s in sessions:
        assert (
            s.generated
            == generate_ar(reference, PROMPTS[int(s.seq_id[2:])], StopRule(12), seq_id=f"ref-{s.seq_id}").tokens
        )
        assert target.cached_length(s.seq_id) == len(s.committed) - 1


def test_a_llama_style_model_with_grouped_query_attention_batches_too():
    """The attention is the model's own interface, not GPT-2's: a tiny Llama (rotary positions,
    2 key/value heads for 4 query heads) gives the logits of a full forward pass, batched."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config).eval()
    lm = TorchLM(model, "tiny-llama", None)
    sequences = {"a": list(range(1, 20)), "b": [5, 6, 7], "c": [9] * 11}
    for seq_id, tokens in sequences.items():
        lm.logits(seq_id, tokens[:-3] or tokens[:1], 1)
    batched = lm.logits_batch([LogitsRequest(seq_id, tokens, 3) for seq_id, tokens in sequences.items()])
    for (seq_id, tokens), logits in zip(sequences.items(), batched):
        with torch.inference_mode():
            fresh = model(input_ids=torch.tensor([tokens])).logits[0, -3:]
        assert torch.allclose(logits, fresh, atol=1e-5), seq_id
