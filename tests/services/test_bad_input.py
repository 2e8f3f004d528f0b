"""Bad input never hurts the verifier: every malformed or out-of-range message gets a structured
Error naming the problem, the server stays up, and other sessions' outputs are unchanged."""

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar
from dsd.speculation.drafting import draft_block
from dsd.backends.protocol import SamplingParams
from dsd.sequence import prefix_digest
from dsd.speculation.stopping import StopRule
from services import wire
from tests.services.harness import (
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

ALPHA, SEED, VOCAB = 0.6, 7, 512
MAX_GAMMA, MAX_TOKENS, MAX_BYTES, MAX_SESSIONS = 8, 256, 65536, 40
LIMIT_ARGS = [
    "--max-gamma",
    str(MAX_GAMMA),
    "--max-tokens-per-session",
    str(MAX_TOKENS),
    "--max-message-bytes",
    str(MAX_BYTES),
    "--max-sessions",
    str(MAX_SESSIONS),
]
STRUCTURED = {
    wire.MALFORMED,
    wire.BAD_VERSION,
    wire.UNKNOWN_TYPE,
    wire.BAD_FIELD,
    wire.OUT_OF_RANGE,
    wire.UNKNOWN_SESSION,
    wire.DUPLICATE_SESSION,
    wire.LIMIT,
}


@pytest.fixture(scope="module")
def services(spawn, tmp_path_factory):
    return spawn(
        ("services.verifier", synthetic_args(ALPHA, SEED) + LIMIT_ARGS + ["--max-batch", "4"]),
        ("services.edge", synthetic_args(ALPHA, SEED) + ["--out-dir", str(tmp_path_factory.mktemp("edge"))]),
        ("services.verifier", synthetic_args(ALPHA, SEED) + ["--idle-timeout-s", "0.5"]),
    )


def body(message, **changes) -> dict:
    return {**msgpack.unpackb(wire.encode(message)), **changes}


# ---- named cases ---------------------------------------------------------------------------


def bad_messages() -> list[tuple]:
    """(name, message, code and field the error must carry) for each bad message."""
    verify = wire.Verify(0, 1, 3, prefix_digest([1, 2, 3]), [5, 6])
    return [
        (
            "gamma above max_gamma",
            wire.Verify(0, 1, 3, verify.base_digest, [5] * (MAX_GAMMA + 1)),
            wire.OUT_OF_RANGE,
            "draft_tokens",
        ),
        ("gamma zero", wire.Verify(0, 1, 3, verify.base_digest, []), wire.OUT_OF_RANGE, "draft_tokens"),
        ("negative draft id", wire.Verify(0, 1, 3, verify.base_digest, [5, -1]), wire.OUT_OF_RANGE, "draft_tokens"),
        (
            "out-of-vocabulary draft id",
            wire.Verify(0, 1, 3, verify.base_digest, [VOCAB]),
            wire.OUT_OF_RANGE,
            "draft_tokens",
        ),
        ("negative start", wire.Verify(0, 1, -4, verify.base_digest, [5]), wire.OUT_OF_RANGE, "start_pos"),
        ("unknown session", wire.Verify(0, 99, 3, verify.base_digest, [5]), wire.UNKNOWN_SESSION, "session"),
        ("out-of-vocabulary prompt", open_message(0, 3, prompt=[1, VOCAB + 5]), wire.OUT_OF_RANGE, "prompt"),
        ("empty prompt", open_message(0, 3, prompt=[]), wire.OUT_OF_RANGE, "prompt"),
        ("too many tokens", open_message(0, 3, max_new_tokens=MAX_TOKENS), wire.OUT_OF_RANGE, "max_new_tokens"),
        ("zero tokens", open_message(0, 3, max_new_tokens=0), wire.OUT_OF_RANGE, "max_new_tokens"),
        ("negative temperature", open_message(0, 3, temperature=-1.0), wire.OUT_OF_RANGE, "temperature"),
        ("duplicate session", open_message(0, 1), wire.DUPLICATE_SESSION, "session"),
        ("unknown mode", wire.Generate(0, 1, "beam", 2), wire.OUT_OF_RANGE, "mode"),
        ("gamma for co-located", wire.Generate(0, 1, "colocated", 0), wire.OUT_OF_RANGE, "gamma"),
        ("sampling without q", wire.Verify(0, 2, 3, verify.base_digest, [5]), wire.BAD_FIELD, "probs_dense"),
        (
            "q of the wrong size",
            wire.Verify(0, 2, 3, verify.base_digest, [5], probs_dense=b"\0" * 12),
            wire.OUT_OF_RANGE,
            "probs_dense",
        ),
        (
            "a draft token q says is impossible",
            wire.Verify(0, 2, 3, verify.base_digest, [5], probs_ids=[[4]], probs_values=[[1.0]]),
            wire.OUT_OF_RANGE,
            "probs",
        ),
        ("a reply sent as a request", wire.Pong(0, 0.0, 0.0), wire.UNKNOWN_TYPE, "type"),
        ("wrong type", body(verify, draft_tokens="abc"), wire.BAD_FIELD, "draft_tokens"),
        ("bool for an int", body(verify, start_pos=True), wire.BAD_FIELD, "start_pos"),
        (
            "missing field",
            {k: v for k, v in body(verify).items() if k != "base_digest"},
            wire.BAD_FIELD,
            "base_digest",
        ),
        ("unknown field", body(verify, colour="red"), wire.BAD_FIELD, "colour"),
        ("other version", body(verify, v=2), wire.BAD_VERSION, "v"),
        ("unknown type", body(verify, type="Teleport"), wire.UNKNOWN_TYPE, "type"),
        ("not a map", [1, 2, 3], wire.MALFORMED, None),
        ("truncated frame", wire.encode(verify)[:9], wire.MALFORMED, None),
        ("oversized frame", wire.encode(wire.Hello(0, "x" * MAX_BYTES)), wire.LIMIT, None),
    ]


async def expect_errors(url, transport="ws"):
    """(what was sent, code and field expected) for each case, on one connection."""
    results = []
    async with RawClient(url, transport=transport) as c:
        assert isinstance(await c.ask(open_message(1, 1)), wire.Opened)
        assert isinstance(await c.ask(open_message(2, 2, temperature=0.5)), wire.Opened)
        for name, message, code, field in bad_messages():
            if isinstance(message, (dict, list)):
                message = msgpack.packb(message)
            await c.send(message)
            reply = await c.receive()
            results.append((name, reply, code, field))
        if transport == "ws":  # frames have no text kind
            await c.ws.send_str("hello")
            results.append(("text frame", await c.receive(), wire.MALFORMED, None))
        pong = await c.ask(wire.Ping(c.next_seq() + 1000, 1.0))
    return results, pong


@pytest.mark.parametrize("transport", ["ws", "tcp"])
def test_each_bad_message_gets_an_error_naming_the_problem(services, transport):
    verifier = services[0]
    results, pong = run(expect_errors(verifier.url, transport))
    for name, reply, code, field in results:
        assert isinstance(reply, wire.Error), f"{name}: {reply}"
        assert (reply.code, reply.field) == (code, field), f"{name}: {reply}"
        assert reply.message, name
        if name == "oversized frame":  # on either transport: the limit, named
            assert reply.limit == "max_message_bytes" and f"max_message_bytes {MAX_BYTES}" in reply.message
    assert isinstance(pong, wire.Pong)  # the connection survived all of it


async def wrong_position_then_right(url):
    config = SyntheticConfig(alpha=ALPHA, seed=SEED)
    draft = SyntheticLM(config, "draft")
    prompt, stop = [9, 8, 7], StopRule(30, config.eos_token_id)
    replies = []
    async with RawClient(url) as c:
        await c.ask(open_message(1, 1, prompt, 30))
        committed = list(prompt)
        good = wire.Verify(0, 1, len(committed), prefix_digest(committed), [4, 4])
        for bad in (
            wire.Verify(c.next_seq(), 1, len(committed) + 1, good.base_digest, [4, 4]),
            wire.Verify(c.next_seq(), 1, len(committed), good.base_digest ^ 1, [4, 4]),
            wire.Verify(c.next_seq(), 1, len(committed) - 1, prefix_digest(committed[:-1]), [4, 4]),
        ):
            replies.append(await c.ask(bad))
        for _ in range(60):
            if len(committed) - len(prompt) >= stop.max_new_tokens:
                break
            block, _ = draft_block(draft, "d", committed, 3, SamplingParams(), None)
            v = await c.ask(wire.Verify(c.next_seq(), 1, len(committed), prefix_digest(committed), block))
            committed += stop.clip(block[: v.accepted] + [v.next_token], len(committed) - len(prompt))
    return replies, committed[len(prompt) :], prompt, stop, config


def test_a_block_at_the_wrong_position_is_stale_and_costs_nothing(services):
    replies, generated, prompt, stop, config = run(wrong_position_then_right(services[0].url))
    for reply in replies:
        assert isinstance(reply, wire.Verified) and reply.stale, reply
        assert (reply.accepted, reply.next_token, reply.compute_s, reply.batch_size) == (0, -1, 0.0, 0)
    target = SyntheticLM(config, "target")
    assert generated == generate_ar(target, prompt, stop).tokens


# ---- fuzzing -------------------------------------------------------------------------------

REQUESTS = {
    "Hello": wire.Hello(1, "fuzz"),
    "Ping": wire.Ping(1, 0.5),
    "Open": wire.Open(1, 2, [1, 2, 3], 6, 0.0, None, 0, True),
    "Verify": wire.Verify(1, 1, 3, prefix_digest([1, 2, 3]), [5, 6, 7]),
    "Generate": wire.Generate(1, 1, "colocated", 2),
    "Withdraw": wire.Withdraw(1, 1),
    "Close": wire.Close(1, 1),
}
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(-5, 600), max_size=12),
    st.lists(st.lists(st.integers(-2, 3), max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-10, 10), max_size=2),
    st.sampled_from([[1] * 5000, "x" * 70000, b"\0" * 40000, [[0.5] * 600] * 3]),
)


@st.composite
def fuzz_frames(draw) -> bytes:
    kind = draw(st.sampled_from(["bytes", "truncated", "field", "drop", "extra", "type", "version", "verify"]))
    name = draw(st.sampled_from(sorted(REQUESTS)))
    fields = body(REQUESTS[name])
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "truncated":
        data = wire.encode(REQUESTS[name])
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "field":
        fields[draw(st.sampled_from(sorted(fields)))] = draw(ODD_VALUES)
    elif kind == "drop":
        del fields[draw(st.sampled_from(sorted(fields)))]
    elif kind == "extra":
        fields[draw(st.text(min_size=1, max_size=6))] = draw(ODD_VALUES)
    elif kind == "type":
        fields["type"] = draw(st.one_of(st.text(max_size=8), st.sampled_from(["Welcome", "Tokens", "Error"])))
    elif kind == "version":
        fields["v"] = draw(st.integers(-3, 5))
    else:  # a well-formed Verify: any block, any position, any session
        fields = body(REQUESTS["Verify"])
        fields.update(
            session=draw(st.sampled_from([1, 1, 2, 77, -1])),
            start_pos=draw(st.integers(-3, 300)),
            draft_tokens=draw(st.lists(st.integers(-2, VOCAB + 2), max_size=MAX_GAMMA + 2)),
            base_digest=draw(st.one_of(st.just(fields["base_digest"]), st.integers(0, 2**64 - 1))),
        )
    return msgpack.packb(fields)


async def send_fuzz(url, frame: bytes):
    async with RawClient(url) as c:
        assert isinstance(await c.ask(open_message(100, 1)), wire.Opened)
        await c.send(frame)
        await c.send(wire.Ping(10**6, 0.0))
        # Up to our Pong, or whatever ends the connection (a WebSocket close has no seq).
        return await c.until(
            lambda m: isinstance(m, wire.Pong) and m.seq == 10**6 or not hasattr(m, "seq"), timeout_s=20
        )


def test_fuzzed_frames_get_structured_errors_and_other_sessions_are_unchanged(services):
    verifier, edge = services[:2]
    config = SyntheticConfig(alpha=ALPHA, seed=SEED)
    prompts = [[i + 1, 2 * i + 3, 5] for i in range(4)]
    runs = [
        {
            "run_id": f"victim-{mode}-{i}",
            "client_id": "victim",
            "mode": mode,
            "gamma": 3,
            "max_in_flight": 2,
            "prompts": prompts,
            "max_new_tokens": 60,
            "verifier_url": verifier.url,
            "app_delay_ms": 2,
            "probe_count": 0,
        }
        for mode in ("ar", "colocated", "sync", "pipelined")
        for i in range(2)
    ]
    run_ids = post_runs(edge, runs)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(frame=fuzz_frames())
    def fuzz(frame):
        replies = run(send_fuzz(verifier.url, frame))
        assert isinstance(replies[-1], wire.Pong), f"the connection did not survive: {replies[-1]}"
        for reply in replies[:-1]:
            assert isinstance(
                reply,
                (
                    wire.Error,
                    wire.Welcome,
                    wire.Pong,
                    wire.Queued,
                    wire.Withdrawn,
                    wire.Opened,
                    wire.Verified,
                    wire.Tokens,
                    wire.Closed,
                ),
            ), reply
            if isinstance(reply, wire.Error):
                assert reply.code in STRUCTURED and reply.message, reply

    statuses = [edge.get_json(f"/runs/{run_id}")["status"] for run_id in run_ids]
    fuzz()
    assert "running" in statuses  # the victims overlapped the fuzzing
    summaries = wait_for_runs(edge, run_ids)
    target = SyntheticLM(config, "target")
    stop = StopRule(60, config.eos_token_id)
    for run_id in run_ids:
        assert summaries[run_id]["status"] == "done", summaries[run_id]
        for row in read_csv(edge, run_id, "requests.csv"):
            reference = generate_ar(target, prompts[int(row["request_index"])], stop).tokens
            assert [int(t) for t in row["token_ids"].split()] == reference
    metrics = verifier.get_json("/metrics")
    assert metrics["errors"] and "internal" not in metrics["errors"]
    assert sessions_open(verifier) == 0


# ---- limits and lifetimes ------------------------------------------------------------------


async def open_many(url, n, transport="ws"):
    async with RawClient(url, transport=transport) as c:
        return [await c.ask(open_message(c.next_seq(), session)) for session in range(n)]


@pytest.mark.parametrize("transport", ["ws", "tcp"])
def test_sessions_beyond_max_sessions_are_refused_and_freed_on_disconnect(services, transport):
    verifier = services[0]
    assert sessions_open(verifier) == 0
    replies = run(open_many(verifier.url, MAX_SESSIONS + 2, transport))
    assert every(isinstance(r, wire.Opened) for r in replies[:MAX_SESSIONS])
    assert every(
        isinstance(r, wire.Error) and (r.code, r.field) == (wire.LIMIT, "session") for r in replies[MAX_SESSIONS:]
    )
    assert sessions_open(verifier) == 0  # the connection closed: every session freed
    assert verifier.get_json("/metrics")["connections_open"] == 0


async def idle(url, transport="ws"):
    async with RawClient(url, transport=transport) as c:
        welcome = await c.ask(wire.Hello(1, "idle"))
        return welcome, await c.receive(timeout_s=5), await c.receive(timeout_s=5)


@pytest.mark.parametrize("transport", ["ws", "tcp"])
def test_an_idle_connection_is_told_and_closed(services, transport):
    welcome, error, closing = run(idle(services[2].url, transport))
    assert isinstance(welcome, wire.Welcome)
    assert isinstance(error, wire.Error) and error.code == wire.IDLE_TIMEOUT
    assert not hasattr(closing, "seq")  # the WebSocket close, not another message
