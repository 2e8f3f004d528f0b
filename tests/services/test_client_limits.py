"""Per-client limits: a connection is a client. Each limit, exceeded, gives a structured error
naming it and touches nothing else; a client flooding the verifier gets errors while a polite
client's latency stays within a bound of its own baseline, and its output is unchanged."""

import asyncio
import statistics
import time

import pytest

from dsd.backends.protocol import SamplingParams
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar
from dsd.speculation.drafting import draft_block
from dsd.sequence import prefix_digest
from dsd.speculation.stopping import StopRule
from services import wire
from tests.services.harness import (
    TEST_PROFILE,
    RawClient,
    open_message,
    post_runs,
    read_csv,
    run,
    sessions_open,
    synthetic_args,
    wait_for_runs,
)
from tests.checks import every

ALPHA, SEED = 0.6, 5
SESSIONS, INFLIGHT, PROMPT, TOKENS = 4, 5, 16, 200
LIMITS = [
    "--max-sessions-per-connection",
    str(SESSIONS),
    "--max-inflight-per-connection",
    str(INFLIGHT),
    "--max-prompt-tokens",
    str(PROMPT),
    "--max-tokens-per-connection",
    str(TOKENS),
]
SLOW_AR = {**TEST_PROFILE, "t_ar_s": 0.02}  # a Generate "ar" holds its slot for a while
PASS_S = 0.004
FAIR = {**TEST_PROFILE, "t_ar_s": PASS_S, "t_verify_base_s": PASS_S, "t_verify_per_position_s": 0.0}
FLOOD_SESSIONS = 8


@pytest.fixture(scope="module")
def verifiers(spawn, tmp_path_factory):
    """The limited verifier, the fairness verifier, and an edge for bystanders' runs."""
    return spawn(
        ("services.verifier", synthetic_args(ALPHA, SEED, SLOW_AR) + LIMITS),
        (
            "services.verifier",
            synthetic_args(ALPHA, SEED, FAIR) + ["--max-inflight-per-connection", str(FLOOD_SESSIONS)],
        ),
        ("services.edge", synthetic_args(ALPHA, SEED, SLOW_AR) + ["--out-dir", str(tmp_path_factory.mktemp("e"))]),
    )


BYSTANDER_PROMPTS = [[2, 4, 6], [8, 1]]


def start_bystanders(verifier, edge, name):
    """Polite clients (one connection each) on the verifier a test is about to abuse."""
    return post_runs(
        edge,
        [
            {
                "run_id": f"{name}-{mode}",
                "client_id": name,
                "mode": mode,
                "gamma": 3,
                "max_in_flight": 2,
                "prompts": BYSTANDER_PROMPTS,
                "max_new_tokens": 30,
                "verifier_url": verifier.url,
                "probe_count": 0,
            }
            for mode in ("sync", "pipelined")
        ],
    )


def check_bystanders(edge, run_ids):
    target = SyntheticLM(SyntheticConfig(alpha=ALPHA, seed=SEED), "target")
    stop = StopRule(30, target.eos_token_id)
    for run_id, summary in wait_for_runs(edge, run_ids).items():
        assert summary["status"] == "done", summary
        for row in read_csv(edge, run_id, "requests.csv"):
            expected = generate_ar(target, BYSTANDER_PROMPTS[int(row["request_index"])], stop).tokens
            assert [int(t) for t in row["token_ids"].split()] == expected, run_id


def is_limit(reply, limit, field, code=wire.LIMIT) -> bool:
    return (
        isinstance(reply, wire.Error)
        and (reply.code, reply.limit, reply.field) == (code, limit, field)
        and limit in reply.message
    )


async def sessions_prompt_and_tokens(url):
    async with RawClient(url) as c, RawClient(url) as other:
        opened = [await c.ask(open_message(c.next_seq(), s)) for s in range(SESSIONS + 1)]
        elsewhere = await other.ask(open_message(other.next_seq(), 1))
        long_prompt = await other.ask(open_message(other.next_seq(), 2, prompt=[1] * (PROMPT + 1)))
        too_much = open_message(other.next_seq(), 3, max_new_tokens=TOKENS - 3 - 10)  # 11 are held already
        over = await other.ask(too_much)
        closed = await other.ask(wire.Close(other.next_seq(), 1))
        freed = await other.ask(open_message(other.next_seq(), 3, max_new_tokens=TOKENS - 3 - 10))
        return opened, elsewhere, long_prompt, over, closed, freed


def test_sessions_prompt_and_tokens_per_connection_are_limited_and_named(verifiers):
    verifier, edge = verifiers[0], verifiers[2]
    bystanders = start_bystanders(verifier, edge, "limits")
    opened, elsewhere, long_prompt, over, closed, freed = run(sessions_prompt_and_tokens(verifier.url))
    assert every(isinstance(r, wire.Opened) for r in opened[:SESSIONS])
    assert is_limit(opened[SESSIONS], "max_sessions_per_connection", "session"), opened[SESSIONS]
    assert isinstance(elsewhere, wire.Opened)  # another connection is another client
    assert is_limit(long_prompt, "max_prompt_tokens", "prompt"), long_prompt
    assert is_limit(over, "max_tokens_per_connection", "max_new_tokens"), over
    assert isinstance(closed, wire.Closed) and isinstance(freed, wire.Opened)  # closing frees its tokens
    check_bystanders(edge, bystanders)
    assert sessions_open(verifier) == 0


async def inflight(url):
    async with RawClient(url) as c:
        for session in (1, 2, 3):  # three long AR streams: three requests in flight
            assert isinstance(await c.ask(open_message(c.next_seq(), session, max_new_tokens=40)), wire.Opened)
            await c.send(wire.Generate(c.next_seq(), session, "ar", 0))
        await c.until(lambda m: isinstance(m, wire.Tokens))
        prompt = [4, 5, 6]
        assert isinstance(await c.ask(open_message(c.next_seq(), 4, prompt)), wire.Opened)
        # A burst of four: a live block (waits behind the AR passes), one queued behind it, two too many.
        base = wire.Verify(0, 4, len(prompt), prefix_digest(prompt), [7, 7])
        seqs = [c.next_seq() for _ in range(5)]
        for seq in seqs[:4]:
            await c.send(wire.Verify(seq, base.session, base.start_pos, base.base_digest, base.draft_tokens))
        await c.send(wire.Generate(seqs[4], 4, "ar", 0))  # a Generate counts too
        replies = {}
        while len(replies) < 5:
            m = await c.receive()
            if getattr(m, "seq", None) in seqs:
                replies[m.seq] = m
        after = await c.ask(wire.Verify(c.next_seq(), 4, 0, 0, [1]))  # the slots are free again
        return [replies[s] for s in seqs[:4]], replies[seqs[4]], after


def test_requests_beyond_the_in_flight_limit_are_answered_busy_at_once(verifiers):
    verifier, edge = verifiers[0], verifiers[2]
    bystanders = start_bystanders(verifier, edge, "inflight")
    replies, opened_too, after = run(inflight(verifier.url))
    check_bystanders(edge, bystanders)
    assert isinstance(replies[0], wire.Verified) and not replies[0].stale
    assert isinstance(replies[1], wire.Verified) and replies[1].stale  # its block was already verified
    for reply in replies[2:] + [opened_too]:
        assert is_limit(reply, "max_inflight_per_connection", None, wire.BUSY), reply
    assert isinstance(after, wire.Verified)
    assert sessions_open(verifier) == 0
    assert verifier.get_json("/metrics")["errors"]["busy"] >= 3


# ---- fairness ------------------------------------------------------------------------------


async def polite_rounds(c, session, prompt, rounds, stop, draft):
    """Sequential verifications of live blocks: (latencies, verifier queue times, compute, tokens)."""
    assert isinstance(await c.ask(open_message(c.next_seq(), session, prompt, stop.max_new_tokens)), wire.Opened)
    committed, latencies, queues, computes = list(prompt), [], [], []
    for _ in range(rounds):
        block, _ = draft_block(draft, f"d{session}", committed, 3, SamplingParams(), None)
        start = time.perf_counter()
        v = await c.ask(wire.Verify(c.next_seq(), session, len(committed), prefix_digest(committed), block))
        latencies.append(time.perf_counter() - start)
        assert isinstance(v, wire.Verified) and not v.stale, v
        queues.append(v.queue_s)
        computes.append(v.compute_s)
        committed += stop.clip(block[: v.accepted] + [v.next_token], len(committed) - len(prompt))
    await c.ask(wire.Close(c.next_seq(), session))
    return latencies, queues, computes, committed[len(prompt) :]


async def flood_and_polite(url, rounds, stop, draft):
    async with RawClient(url) as polite, RawClient(url) as flood:
        base = await polite_rounds(polite, 1, [3, 1, 4], rounds, stop, draft)
        for session in range(FLOOD_SESSIONS):  # every slot busy with a long AR stream
            assert isinstance(
                await flood.ask(open_message(flood.next_seq(), session, max_new_tokens=3000)), wire.Opened
            )
            await flood.send(wire.Generate(flood.next_seq(), session, "ar", 0))
        refused = await flood.ask(open_message(flood.next_seq(), 99))
        streamed = 0

        async def drain():
            nonlocal streamed
            while True:
                streamed += isinstance(await flood.receive(), wire.Tokens)

        reader = asyncio.create_task(drain())
        await asyncio.sleep(0.05)
        before = streamed
        loaded = await polite_rounds(polite, 2, [3, 1, 4], rounds, stop, draft)
        during = streamed - before
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        return base, loaded, refused, during


def test_a_flooding_client_gets_errors_and_cannot_starve_a_polite_one(verifiers):
    verifier = verifiers[1]
    config = SyntheticConfig(alpha=ALPHA, seed=SEED)
    stop = StopRule(40, config.eos_token_id)
    base, loaded, refused, during = run(flood_and_polite(verifier.url, 12, stop, SyntheticLM(config, "draft")))
    assert is_limit(refused, "max_inflight_per_connection", None, wire.BUSY), refused
    assert during >= 6  # the flood kept the device busy meanwhile
    # Clients take turns: a polite verification waits for at most the pass in progress and one
    # more, not behind the flood's whole backlog (FIFO: FLOOD_SESSIONS passes, ~8x the baseline).
    pass_s = statistics.median(loaded[2])
    assert statistics.median(loaded[1]) <= 1.5 * pass_s, (loaded[1], pass_s)
    assert statistics.median(loaded[0]) <= 3 * statistics.median(base[0]), (base[0], loaded[0])
    reference = generate_ar(SyntheticLM(config, "target"), [3, 1, 4], stop).tokens
    assert base[3][: len(loaded[3])] == loaded[3] == reference[: len(loaded[3])]
    assert sessions_open(verifier) == 0
    assert verifier.get_json("/metrics")["limits"]["max_inflight_per_connection"] == FLOOD_SESSIONS
