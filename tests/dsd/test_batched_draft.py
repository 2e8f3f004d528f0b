"""Batched co-located drafting (dsd.speculation.drafting.run_draft_jobs): several sessions' draft blocks
(different prefix lengths, different block lengths, caches holding rejected drafts) drafted with
one pass of the draft per step give each session the blocks of drafting alone, token for token
under greedy decoding (float32) and draw for draw under sampling, and leave its cache the same."""

import asyncio

import pytest
import torch

from dsd.backends.protocol import SamplingParams
from dsd.backends.torch_lm import TorchLM
from dsd.speculation.draws import Draws
from dsd.speculation.drafting import DraftJob, draft_block, run_draft_jobs
from services.compute import ThreadDevice
from dsd.drive.batching import BatchingConfig
from services.verifier.scheduler import Scheduler
from tests.torch_pairs import tiny_pair
from tests.checks import every

GREEDY = SamplingParams()
PREFIXES = [[5, 17, 42], [9] * 11, [3, 1, 4, 1, 5, 9, 2, 6], [60], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]
BLOCKS = [4, 1, 6, 3, 8]


def _twins(seed: int = 3):
    """The same draft model twice, each with its own caches: one drafts batched, one alone."""
    draft, _ = tiny_pair(seed=seed, noise=0.05)
    return draft, TorchLM(draft.model, "tiny-draft-alone", None)


def _jobs(model, prefixes, blocks, sampling, draws):
    return [
        DraftJob(model, f"s{i}", prefix, n, sampling[i], draws[i])
        for i, (prefix, n) in enumerate(zip(prefixes, blocks))
    ]


def _rounds(model, batched: bool, sampling, seeds, rounds: int = 5):
    """Drafting rounds as a co-located server runs them: each round every session drafts on its
    prefix, keeps the first half of its block (the rest rejected: its cache holds stale drafts)
    and one corrected token. Returns every round's blocks (tokens, q)."""
    prefixes = [list(p) for p in PREFIXES]
    draws = [Draws(seed) for seed in seeds]
    out = []
    for r in range(rounds):
        jobs = _jobs(model, prefixes, BLOCKS, sampling, draws)
        results = [value for ok, value in run_draft_jobs(jobs)] if batched else [job.run() for job in jobs]
        out.append(results)
        for i, (drafted, _) in enumerate(results):
            prefixes[i] += drafted[: len(drafted) // 2] + [(7 * r + i) % model.vocab_size]
    return out, prefixes


def test_batched_greedy_drafting_equals_drafting_alone_token_for_token():
    batched_lm, alone_lm = _twins()
    greedy = [GREEDY] * len(PREFIXES)
    passes_before = batched_lm.stats.passes
    batched, prefixes = _rounds(batched_lm, True, greedy, range(len(PREFIXES)))
    alone, _ = _rounds(alone_lm, False, greedy, range(len(PREFIXES)))
    assert [[tokens for tokens, _ in r] for r in batched] == [[tokens for tokens, _ in r] for r in alone]
    assert every(q is None for r in batched for _, q in r)
    # One pass of the draft per step of the longest block, whatever the number of sessions.
    assert batched_lm.stats.passes - passes_before == 5 * max(BLOCKS)
    for i in range(len(PREFIXES)):
        assert batched_lm.cached_length(f"s{i}") == alone_lm.cached_length(f"s{i}")


def test_batched_sampled_drafting_makes_the_same_draws_from_the_same_q():
    """Each session samples from its own q with its own draws in the order it would alone:
    the same seeds give the same tokens, and q rows equal to float rounding."""
    batched_lm, alone_lm = _twins(seed=4)
    sampling = [
        SamplingParams(temperature=t, top_k=k, seed=0)
        for t, k in ((1.0, None), (0.7, None), (1.3, 20), (1.0, 5), (0.9, None))
    ]
    seeds = [101, 202, 303, 404, 505]
    batched, _ = _rounds(batched_lm, True, sampling, seeds)
    alone, _ = _rounds(alone_lm, False, sampling, seeds)
    for round_b, round_a in zip(batched, alone):
        for (tokens_b, q_b), (tokens_a, q_a), n in zip(round_b, round_a, BLOCKS):
            assert tokens_b == tokens_a
            assert q_b.shape == (n, batched_lm.vocab_size)
            torch.testing.assert_close(q_b, q_a, rtol=1e-5, atol=1e-6)


def test_a_failing_draft_job_fails_alone_and_the_others_finish_their_blocks():
    batched_lm, alone_lm = _twins()
    good = [[5, 17, 42], [9] * 7]
    jobs = _jobs(batched_lm, good + [[1, 10_000]], [3, 5, 2], [GREEDY] * 3, [None] * 3)
    outcomes = run_draft_jobs(jobs)
    assert [ok for ok, _ in outcomes] == [True, True, False]
    assert isinstance(outcomes[2][1], Exception)
    for (_, (tokens, _)), prefix, n in zip(outcomes, good, (3, 5)):
        assert tokens == draft_block(alone_lm, f"ref{n}", prefix, n, GREEDY, None)[0]
    with pytest.raises(ValueError, match="each sequence once"):
        run_draft_jobs(_jobs(batched_lm, [[1], [2]], [1, 1], [GREEDY] * 2, [None] * 2)[:1] * 2)


def test_the_scheduler_runs_waiting_draft_jobs_as_one_batched_draft():
    """services.verifier.scheduler batches DraftJobs like verifications: the jobs waiting when the device
    frees up become one pass (batch size > 1), each answered with its own block."""
    batched_lm, alone_lm = _twins()

    async def main():
        device = ThreadDevice()
        scheduler = Scheduler(BatchingConfig(max_batch=8), device, None)
        scheduler.start()
        try:
            jobs = _jobs(batched_lm, PREFIXES, BLOCKS, [GREEDY] * len(PREFIXES), [None] * len(PREFIXES))
            return await asyncio.gather(
                *(scheduler.submit("draft", job.n_tokens, job, i) for i, job in enumerate(jobs))
            )
        finally:
            await scheduler.stop()
            device.executor.shutdown()

    answers = asyncio.run(main())
    assert max(timing.batch_size for _, timing in answers) > 1
    for ((tokens, _), _), prefix, n in zip(answers, PREFIXES, BLOCKS):
        assert tokens == draft_block(alone_lm, f"ref-{len(prefix)}", prefix, n, GREEDY, None)[0]


@pytest.mark.model
def test_default_pair_batched_drafting_equals_drafting_alone():
    from dsd.backends.factory import HfBackendConfig, load_pair

    draft, _ = load_pair(HfBackendConfig())
    alone_lm = TorchLM(draft.model, "default-draft-alone", None)
    greedy = [GREEDY] * len(PREFIXES)
    batched, _ = _rounds(draft, True, greedy, range(len(PREFIXES)), rounds=3)
    alone, _ = _rounds(alone_lm, False, greedy, range(len(PREFIXES)), rounds=3)
    assert [[t for t, _ in r] for r in batched] == [[t for t, _ in r] for r in alone]
