"""A hand-over's segments on the real verifier: each is acknowledged (Queued) as it arrives, not
after the segments asked before it, and a Withdraw drops those not yet started (Withdrawn names
them) while the one being served runs to its end; the session then goes on from the tokens
actually committed, so the output is still the target's."""

import time

import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from services import wire
from tests.services.harness import TEST_PROFILE, RawClient, open_message, run, sessions_open, synthetic_args
from tests.checks import every

ALPHA, SEED = 0.6, 5
T_AR_S = 0.02  # a segment of 4 AR steps holds the verifier 80 ms
PROMPT, TOKENS = [3, 1, 4], 40


@pytest.fixture(scope="module")
def verifier(spawn):
    return spawn(("services.verifier", synthetic_args(ALPHA, SEED, {**TEST_PROFILE, "t_ar_s": T_AR_S})))[0]


async def withdraw_mid_stream(url: str, transport: str, keep: int):
    async with RawClient(url, transport=transport) as c:
        assert isinstance(await c.ask(open_message(c.next_seq(), 1, PROMPT, TOKENS)), wire.Opened)
        segments = [c.next_seq() for _ in range(4)]
        sent_s = {}
        for seq in segments:
            sent_s[seq] = time.perf_counter()
            await c.send(wire.Generate(seq, 1, "ar", 0, 4))
        queued, tokens, first_tokens_s = {}, [], None
        while first_tokens_s is None or len(queued) < 4:
            m = await c.receive()
            if isinstance(m, wire.Queued):
                queued[m.seq] = (time.perf_counter() - sent_s[m.seq], m.held_s)
            elif isinstance(m, wire.Tokens):
                assert m.seq == segments[0], m
                tokens += m.tokens
                first_tokens_s = first_tokens_s or time.perf_counter()
        withdraw = c.next_seq()
        await c.send(wire.Withdraw(withdraw, 1, segments[keep - 1] if keep else -1))
        withdrawn = None
        while withdrawn is None or len(tokens) < 4 * max(keep, 1):  # the first (and kept) come in full
            m = await c.receive()
            if isinstance(m, wire.Withdrawn):
                withdrawn = m
            else:
                assert isinstance(m, wire.Tokens) and m.seq in segments[: max(keep, 1)], m
                tokens += m.tokens
        # the session goes on from what was committed: a new segment, then the rest in one stream
        await c.send(wire.Generate(c.next_seq(), 1, "ar", 0, 4))
        await c.send(wire.Generate(c.next_seq(), 1, "ar", 0))
        while True:
            m = await c.receive()
            if isinstance(m, wire.Tokens):
                tokens += m.tokens
                if m.done and m.seq == c.seq:
                    break
            else:
                assert isinstance(m, wire.Queued), m
        return segments, queued, withdraw, withdrawn, tokens


@pytest.mark.parametrize("transport,keep", [("ws", 0), ("tcp", 0), ("ws", 2)])
def test_a_withdraw_drops_the_unstarted_segments_and_the_output_stays_the_targets(verifier, transport, keep):
    """keep 0: every segment after the one being served is dropped; keep 2: those asked after the
    second (keep_through its seq)."""
    segments, queued, withdraw, withdrawn, tokens = run(withdraw_mid_stream(verifier.url, transport, keep))
    # every Queued came back as its Generate arrived: far sooner than the 80 ms a segment takes
    assert set(queued) == set(segments)
    assert every(rtt_s - held_s < 0.04 for rtt_s, held_s in queued.values()), queued
    # asked while the first ran: the other three had not started
    assert withdrawn.seq == withdraw and withdrawn.session == 1 and withdrawn.segments == segments[max(keep, 1) :]
    target = SyntheticLM(SyntheticConfig(alpha=ALPHA, seed=SEED), "target")
    assert tokens == generate_ar(target, PROMPT, StopRule(TOKENS)).tokens
    assert sessions_open(verifier) == 0


async def withdraw_unknown_session(url: str):
    async with RawClient(url) as c:
        return await c.ask(wire.Withdraw(c.next_seq(), 7))


def test_a_withdraw_of_a_session_not_open_is_refused_naming_it(verifier):
    error = run(withdraw_unknown_session(verifier.url))
    assert isinstance(error, wire.Error) and error.code == wire.UNKNOWN_SESSION and error.field == "session"


async def withdraw_with_nothing_queued(url: str):
    async with RawClient(url) as c:
        assert isinstance(await c.ask(open_message(c.next_seq(), 1, PROMPT, 8)), wire.Opened)
        return await c.ask(wire.Withdraw(c.next_seq(), 1))


def test_a_withdraw_with_nothing_queued_drops_nothing(verifier):
    withdrawn = run(withdraw_with_nothing_queued(verifier.url))
    assert isinstance(withdrawn, wire.Withdrawn) and withdrawn.segments == []
