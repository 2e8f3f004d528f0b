"""The edge's /link API: token-protected, shaping only when the edge was started for it, bad
input named, and RTT probes over the same WebSocket Ping/Pong a run uses."""

import os
import urllib.error
import urllib.request

import pytest

from tests.services.harness import synthetic_args

TOKEN = "link-token-" + "y" * 24


@pytest.fixture(scope="module")
def pair(spawn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("link")
    token_file = folder / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    verifier, edge = spawn(
        ("services.verifier", synthetic_args() + ["--token-file", str(token_file)]),
        ("services.edge", synthetic_args() + ["--token-file", str(token_file), "--out-dir", str(folder / "runs")]),
    )
    verifier.token = edge.token = TOKEN
    return verifier, edge


def test_link_api_needs_the_token(pair):
    _, edge = pair
    edge.token = None
    try:
        status, body = edge.post_json("/link/probe", {"verifier_url": "http://127.0.0.1:1"})
    finally:
        edge.token = TOKEN
    assert status == 401 and body["code"] == "unauthorized"


def test_an_edge_started_without_shape_link_refuses_to_shape(pair):
    verifier, edge = pair
    assert edge.get_json("/link") == {"shaping_allowed": False, "record": None, "failures": []}
    request = urllib.request.Request(
        edge.url + "/link",
        method="PUT",
        data=b'{"verifier_url": "%s", "rtt_ms": 10}' % verifier.url.encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403 and "--shape-link" in refused.value.read().decode()


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "verifier_url"),
        ({"verifier_url": "x"}, "verifier_url"),
        ({"verifier_url": "http://127.0.0.1:1", "count": 0}, "count"),
        ({"verifier_url": "http://127.0.0.1:1", "counts": 3}, "counts"),
    ],
)
def test_probe_names_the_bad_field(pair, body, field):
    status, answer = pair[1].post_json("/link/probe", body)
    assert status == 400 and field in answer["error"]


def test_probe_measures_the_rtt_to_the_verifier_with_the_runs_ping(pair):
    verifier, edge = pair
    status, answer = edge.post_json("/link/probe", {"verifier_url": verifier.url, "count": 5, "interval_ms": 5})
    assert status == 200 and len(answer["rtt_ms"]) == 5 and all(0 < r < 50 for r in answer["rtt_ms"])
    status, delayed = edge.post_json(
        "/link/probe", {"verifier_url": verifier.url, "count": 3, "interval_ms": 5, "app_delay_ms": 15}
    )
    assert status == 200 and all(30 <= r < 80 for r in delayed["rtt_ms"])  # 15 ms each way
    status, refused = edge.post_json("/link/probe", {"verifier_url": "http://127.0.0.1:1", "count": 1})
    assert status == 502
