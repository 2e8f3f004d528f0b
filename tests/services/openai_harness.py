"""A verifier and an edge on the toy pair (models/default-pair) behind one token, the edge
serving the OpenAI-compatible API, and what the tests ask of it over plain HTTP."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from services.access import bearer_header
from tests.services.harness import read_csv

TOKEN = "openai-test-token-" + "x" * 20
PAIR = "models/default-pair"
MODEL = "default-pair"
BACKEND = ["--backend-json", json.dumps({"kind": "hf", "pair_path": PAIR})]


@pytest.fixture(scope="module")
def served(spawn, tmp_path_factory):
    """(verifier, edge) with the token; the edge serves /v1/ in sync mode from the start."""
    folder = tmp_path_factory.mktemp("openai")
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    verifier = spawn(("services.verifier", BACKEND + ["--token-file", str(token_file)]))[0]
    settings = {"verifier_url": verifier.url, "mode": "sync", "gamma": 3, "max_in_flight": 2, "run_id": "served"}
    edge = spawn(
        (
            "services.edge",
            BACKEND
            + [
                "--token-file",
                str(token_file),
                "--out-dir",
                str(folder / "edge"),
                "--openai-json",
                json.dumps(settings),
            ],
        )
    )[0]
    verifier.token = edge.token = TOKEN
    return verifier, edge


def call(
    edge,
    method: str,
    path: str,
    body=None,
    token: str | None = TOKEN,
    raw: bytes | None = None,
    timeout_s: float = 120.0,
) -> tuple[int, dict, str]:
    """(status, headers, body text) of one HTTP request to the edge."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        edge.url + path, data=data, method=method, headers={"Content-Type": "application/json", **bearer_header(token)}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def serving_status(edge) -> dict:
    return edge.get_json("/openai")


def wait_idle(edge, timeout_s: float = 30.0) -> dict:
    """The serving status once no request is active or waiting."""
    deadline = time.monotonic() + timeout_s
    while (status := serving_status(edge))["active"] + status["waiting"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def serving_rows(edge, run_id: str = "served") -> list[dict]:
    return read_csv(edge, run_id, "requests.csv")


def configure(edge, **settings) -> dict:
    status, _headers, body = call(edge, "PUT", "/openai", settings)
    assert status == 200, body
    return json.loads(body)
