"""The edge's OpenAI-compatible API over plain HTTP on the toy pair: every error case answers in
the API's own shape with the status clients expect, the stream is framed as server-sent events
(each event ``data: ...`` and a blank line, ``data: [DONE]`` last), stop strings cut the text, and
clients that go away mid-stream leave no session behind (on the verifier or the edge)."""

import asyncio
import json

import aiohttp
import pytest

from dsd.backends.factory import HfBackendConfig
from services import wire
from services.access import bearer_header
from services.edge.cli import openai_text
from services.edge.openai_api import ServeConfig, TextStream
from services.edge.openai_api.routes import DISCONNECTED, STOPPED
from services.edge.openai_api.text import REPLACEMENT
from tests.services.harness import RawClient, open_message, run, sessions_open
from tests.services.openai_harness import (  # noqa: F401
    MODEL,
    TOKEN,
    call,
    configure,
    served,
    serving_rows,
    serving_status,
    wait_idle,
)

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
GOOD = {"model": MODEL, "prompt": "import os\n", "max_tokens": 8, "temperature": 0}


def error_of(status_headers_body) -> tuple[int, dict]:
    status, _headers, body = status_headers_body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return status, error


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        ({**GOOD, "temperature": 5}, 422, "temperature", "invalid_value"),
        ({**GOOD, "max_tokens": 0}, 422, "max_tokens", "invalid_value"),
        ({**GOOD, "n": 2}, 422, "n", "unsupported_value"),
        ({**GOOD, "prompt": ["a", "b"]}, 422, "prompt", "invalid_value"),
        ({**GOOD, "stop": ["a"] * 5}, 422, "stop", "invalid_value"),
        ({**GOOD, "tempreature": 0.5}, 422, "tempreature", "unsupported_field"),
        ({**GOOD, "dsd": {"mode": "beam"}}, 422, "dsd.mode", "invalid_value"),
        ({**GOOD, "dsd": {"gamma": 1000}}, 422, "dsd.gamma", "invalid_value"),
        ({**GOOD, "stream_options": {"include_usage": True}}, 422, "stream_options", "invalid_value"),
        ({**GOOD, "prompt": [1, 2, 10**6]}, 422, "prompt", "invalid_value"),
        ({**GOOD, "model": "gpt-4o"}, 404, "model", "model_not_found"),
        ({**GOOD, "max_tokens": 1020}, 400, "max_tokens", "context_length_exceeded"),  # the pair: 1024 positions
        ({**GOOD, "prompt": "x " * 1100}, 400, "prompt", "context_length_exceeded"),
    ],
)
def test_a_bad_completion_request_is_answered_in_the_apis_shape_naming_the_param(served, body, status, param, code):
    got_status, error = error_of(call(served[1], "POST", TEXT, body))
    assert (got_status, error["param"], error["code"]) == (status, param, code), error
    assert error["type"] == "invalid_request_error"


def test_a_bad_chat_body_names_the_message_at_fault(served):
    edge = served[1]
    status, error = error_of(
        call(edge, "POST", CHAT, {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]})
    )
    assert (status, error["param"]) == (422, "messages[0]")
    status, error = error_of(
        call(
            edge,
            "POST",
            CHAT,
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
        )
    )
    assert (status, error["param"]) == (422, "messages[0].content")


def test_a_body_that_is_not_a_json_object_is_a_400(served):
    for raw in (b"{not json", b"[1, 2]"):
        status, error = error_of(call(served[1], "POST", TEXT, raw=raw))
        assert (status, error["code"]) == (400, "invalid_json")


def test_the_token_guards_v1_and_a_wrong_path_or_method_answers_in_the_apis_shape(served):
    edge = served[1]
    for token in (None, "wrong-" + "y" * 20):
        status, headers, body = call(edge, "GET", "/v1/models", token=token)
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        assert json.loads(body)["error"]["type"] == "authentication_error"
    assert error_of(call(edge, "GET", "/v1/nowhere"))[0] == 404
    assert error_of(call(edge, "GET", CHAT))[0] == 405
    assert call(edge, "GET", "/openai", token=None)[0] == 401  # the settings: the control API's token


def test_a_full_admission_queue_is_a_429_and_an_unreachable_verifier_a_503(served):
    verifier, edge = served
    configure(edge, verifier_url=verifier.url, run_id="queue", max_concurrent=1, max_queue=0)

    async def two_at_once():
        async with aiohttp.ClientSession(headers=bearer_header(TOKEN)) as http:
            long = {**GOOD, "max_tokens": 400, "ignore_eos": True, "stream": True}
            async with http.post(edge.url + TEXT, json=long) as first:
                await first.content.readline()  # it decodes: the one slot is taken
                async with http.post(edge.url + TEXT, json=GOOD) as second:
                    return second.status, second.headers.get("Retry-After"), await second.json()

    status, retry_after, body = asyncio.run(asyncio.wait_for(two_at_once(), 120))
    assert (status, retry_after, body["error"]["code"], body["error"]["type"]) == (
        429,
        "1",
        "queue_full",
        "rate_limit_error",
    )
    wait_idle(edge)
    configure(edge, verifier_url="http://127.0.0.1:1", run_id="unreachable")
    status, error = error_of(call(edge, "POST", TEXT, GOOD))
    assert (status, error["code"]) == (503, "verifier_unreachable")
    configure(edge, verifier_url=verifier.url, run_id="served-again", mode="sync", gamma=3)


def test_settings_are_checked_and_never_overwrite_rows(served):
    edge = served[1]
    status, _headers, body = call(edge, "PUT", "/openai", {"verifier_url": "ftp://x"})
    assert status == 400 and "verifier_url" in json.loads(body)["error"]
    status, _headers, body = call(edge, "PUT", "/openai", {"verifier_url": served[0].url, "run_id": "served"})
    assert status == 409 and "exists" in json.loads(body)["error"]


async def raw_stream(edge, body: dict) -> tuple[int, dict, bytes]:
    async with aiohttp.ClientSession(headers=bearer_header(TOKEN)) as http:
        async with http.post(edge.url + CHAT, json=body) as response:
            return response.status, dict(response.headers), await response.read()


def test_the_stream_is_server_sent_events_each_data_then_a_blank_line_done_last(served):
    edge = served[1]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "def f(x):"}],
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, headers, raw = asyncio.run(asyncio.wait_for(raw_stream(edge, body), 120))
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    text = raw.decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert all(c["usage"] is None for c in chunks[:-1])
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    status, _headers, whole = call(
        edge, "POST", CHAT, {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    )
    assert json.loads(whole)["choices"][0]["message"]["content"] == streamed
    # one chunk per arrival of tokens: fewer chunks than tokens where the draft was right
    index = int(chunks[0]["id"].rsplit("-", 1)[1])
    [row] = [
        r for r in serving_rows(edge, serving_status(edge)["settings"]["run_id"]) if int(r["request_index"]) == index
    ]
    assert len(chunks) - 2 <= int(row["rounds"])


def test_continuous_usage_counts_the_tokens_so_far_in_every_chunk(served):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "for i in"}],
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    _status, _headers, raw = asyncio.run(asyncio.wait_for(raw_stream(served[1], body), 120))
    chunks = [json.loads(e[6:]) for e in raw.decode()[:-2].split("\n\n")[:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 16 and counts[0] >= 1


def test_a_stop_string_cuts_the_text_before_it_and_ends_the_request(served):
    edge = served[1]
    body = {**GOOD, "max_tokens": 60, "ignore_eos": True}
    whole = json.loads(call(edge, "POST", TEXT, body)[2])["choices"][0]["text"]
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    assert stop.strip(), whole
    answer = json.loads(call(edge, "POST", TEXT, {**body, "stop": [stop]})[2])
    assert answer["choices"][0]["text"] == whole[: whole.index(stop)]
    assert answer["choices"][0]["finish_reason"] == "stop"
    wait_idle(edge)
    run_id = serving_status(edge)["settings"]["run_id"]
    [row] = [r for r in serving_rows(edge, run_id) if int(r["request_index"]) == answer["dsd"]["request_index"]]
    assert row["gave_up"] == STOPPED and int(row["tokens"]) < 60


def test_fifty_clients_gone_mid_stream_leave_no_session_on_the_verifier_or_the_edge(served):
    verifier, edge = served
    before = serving_status(edge)
    body = {**GOOD, "max_tokens": 300, "ignore_eos": True, "stream": True}

    async def leave_after_first_chunk(http):
        async with http.post(edge.url + TEXT, json=body, headers={"X-Request-ID": "gone"}) as response:
            assert response.status == 200
            assert (await response.content.readline()).startswith(b"data: ")
            response.close()  # the connection goes, mid-stream

    async def fifty():
        async with aiohttp.ClientSession(headers=bearer_header(TOKEN)) as http:
            for _ in range(5):
                await asyncio.gather(*(leave_after_first_chunk(http) for _ in range(10)))

    asyncio.run(asyncio.wait_for(fifty(), 300))
    after = wait_idle(edge)
    assert (after["active"], after["waiting"], after["done"] - before["done"]) == (0, 0, 50)
    assert sessions_open(verifier) == 0
    rows = [r for r in serving_rows(edge, after["settings"]["run_id"]) if r["request_id"] == "gone"]
    assert len(rows) == 50 and all(r["gave_up"] == DISCONNECTED and int(r["tokens"]) < 300 for r in rows)
    status, _headers, whole = call(edge, "POST", TEXT, GOOD)  # and it serves on
    assert status == 200 and json.loads(whole)["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mode": "beam"}, "mode"),
        ({"gamma": 0}, "gamma"),
        ({"max_queue": -1}, "max_queue"),
        ({"run_id": "../x"}, "run_id"),
        ({"verifier_url": "ftp://x"}, "verifier_url"),
        ({"gama": 3}, "gama"),
        ({"probe_interval_ms": float("nan")}, "probe_interval_ms"),
        ({"transport": "udp"}, "transport"),
    ],
)
def test_serving_settings_errors_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        ServeConfig.from_json({"verifier_url": "http://127.0.0.1:8700", **change})


def test_the_text_stream_never_sends_half_a_character_and_adds_up_to_the_whole_text():
    tokenizer = openai_text(HfBackendConfig(pair_path="models/default-pair"))["tokenizer"]
    ids = tokenizer.encode("naïve café — größer ✓ 日本語 done", add_special_tokens=False)
    stream = TextStream(tokenizer)
    pieces = [stream.add([token]) for token in ids] + [stream.finish()]
    assert all(REPLACEMENT not in piece for piece in pieces)
    assert "".join(pieces) == tokenizer.decode(ids) and pieces.count("") > 0  # some tokens end mid-character


def test_the_text_stream_holds_back_what_may_begin_a_stop_string_and_cuts_before_it():
    tokenizer = openai_text(HfBackendConfig(pair_path="models/default-pair"))["tokenizer"]
    ids = tokenizer.encode("alpha beta gamma delta", add_special_tokens=False)
    stream = TextStream(tokenizer, stop=("gamma",))
    pieces = []
    for token in ids:
        pieces.append(stream.add([token]))
        assert "gam" not in "".join(pieces)  # never half of the stop string
    assert stream.stopped and "".join(pieces) + stream.finish() == "alpha beta "


def test_the_verifier_holds_a_session_to_the_targets_positions_whoever_the_client(served):
    """A client that skips the edge's context check (a peer's own client on the wire) gets a
    limit error naming the target's positions, not a failed pass past them."""

    async def ask():
        async with RawClient(served[0].url, token=TOKEN) as c:
            welcome = await c.ask(wire.Hello(c.next_seq(), "no-context-check"))
            over = await c.ask(open_message(c.next_seq(), 1, prompt=[5] * 20, max_new_tokens=1000))
            fits = await c.ask(
                open_message(c.next_seq(), 2, prompt=[5] * 20, max_new_tokens=welcome.max_tokens_per_session - 20)
            )
            return welcome, over, fits

    welcome, over, fits = run(ask())
    assert welcome.max_tokens_per_session == 1024 - welcome.max_gamma  # the toy pair: 1024 positions
    assert isinstance(over, wire.Error) and (over.limit, over.field) == ("max_tokens_per_session", "max_new_tokens")
    assert "reads 1024 positions" in over.message and f"max_gamma {welcome.max_gamma}" in over.message, over.message
    assert isinstance(fits, wire.Opened), fits
