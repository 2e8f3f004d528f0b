"""The official `openai` client, streaming and not, against a live edge on the toy pair: it gets
the tokens the edge's own API (POST /runs) decodes for the same prompt, mode, gamma and seed, and
every request is a row of the serving run's requests.csv."""

import pytest

from dsd.text import encode_prompt
from services.edge.cli import openai_text
from dsd.backends.factory import HfBackendConfig
from tests.services.harness import post_runs, read_csv, wait_for_runs
from tests.services.openai_harness import MODEL, PAIR, TOKEN, served, serving_rows, wait_idle  # noqa: F401

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.model

SEED, TEMPERATURE, TOP_P, MAX_TOKENS = 7, 0.8, 0.95, 40


@pytest.fixture(scope="module")
def tokenizer():
    return openai_text(HfBackendConfig(pair_path=PAIR))["tokenizer"]


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key=TOKEN, max_retries=0, timeout=120)


def own_api_tokens(served, run_id: str, prompt: list[int], mode: str) -> list[int]:
    """What the edge's own API decodes for one prompt at the test's sampling settings."""
    verifier, edge = served
    spec = {
        "run_id": run_id,
        "client_id": run_id,
        "mode": mode,
        "gamma": 3,
        "max_in_flight": 2,
        "prompts": [prompt],
        "max_new_tokens": MAX_TOKENS,
        "verifier_url": verifier.url,
        "probe_count": 0,
        "temperature": TEMPERATURE,
        "top_p": TOP_P,
        "seed": SEED,
    }
    assert wait_for_runs(edge, post_runs(edge, [spec]))[run_id]["status"] == "done"
    [row] = read_csv(edge, run_id, "requests.csv")
    return [int(t) for t in row["token_ids"].split()]


def row_tokens(edge, request_index: int) -> list[int]:
    wait_idle(edge)
    [row] = [r for r in serving_rows(edge) if int(r["request_index"]) == request_index]
    assert row["error"] == "" and row["gave_up"] == ""
    return [int(t) for t in row["token_ids"].split()]


def test_completions_without_streaming_give_the_tokens_of_the_edges_own_api(served, client, tokenizer):
    prompt = "def parse(path):\n    "
    expected = own_api_tokens(served, "own-text", encode_prompt(tokenizer, prompt), "sync")
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=TEMPERATURE, top_p=TOP_P, seed=SEED
    )
    assert answer.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert row_tokens(served[1], answer.model_extra["dsd"]["request_index"]) == expected
    assert answer.usage.completion_tokens == len(expected)
    assert answer.usage.prompt_tokens == len(encode_prompt(tokenizer, prompt))
    assert answer.choices[0].finish_reason == ("stop" if expected[-1] == tokenizer.eos_token_id else "length")


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_streamed_chat_gives_the_tokens_of_the_edges_own_api(served, client, tokenizer, mode):
    messages = [
        {"role": "user", "content": "import sys"},
        {"role": "assistant", "content": "import os"},
        {"role": "user", "content": "class Parser:"},
    ]
    expected = own_api_tokens(served, f"own-chat-{mode}", encode_prompt(tokenizer, messages), mode)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        seed=SEED,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"dsd": {"mode": mode}},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tokenizer.decode(expected, skip_special_tokens=True)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected)
    index = int(chunks[0].id.rsplit("-", 1)[1])
    assert row_tokens(served[1], index) == expected
    [row] = [r for r in serving_rows(served[1]) if int(r["request_index"]) == index]
    assert row["mode"] == mode and float(row["ttft_s"]) > 0


def test_models_lists_the_pair_and_a_wrong_key_is_refused(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served[1].url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError) as error:
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert error.value.body["code"] == "model_not_found"
