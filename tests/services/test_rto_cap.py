"""TCP's retransmission backoff capped on the link to the verifier (services/frames.py
cap_retransmission_backoff; RunConfig.tcp_rto_max_ms, verifier --tcp-rto-max-ms): the option
lands on a TCP socket, and runs over both transports complete with it at both ends."""

import socket

import pytest

from services import frames
from tests.services.harness import post_runs, read_csv, synthetic_args, wait_for_runs


def test_the_cap_is_set_on_a_tcp_socket_and_left_alone_at_zero_or_on_a_unix_socket():
    with socket.socket() as sock:
        default_ms = sock.getsockopt(socket.IPPROTO_TCP, frames.TCP_RTO_MAX_MS)
        frames.cap_retransmission_backoff(sock, 0)
        assert sock.getsockopt(socket.IPPROTO_TCP, frames.TCP_RTO_MAX_MS) == default_ms
        frames.cap_retransmission_backoff(sock, 1000)
        assert sock.getsockopt(socket.IPPROTO_TCP, frames.TCP_RTO_MAX_MS) == 1000
    with socket.socket(socket.AF_UNIX) as unix:
        frames.cap_retransmission_backoff(unix, 1000)  # no TCP there: nothing to cap


@pytest.fixture(scope="module")
def pair(spawn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rto")
    return spawn(
        ("services.verifier", synthetic_args() + ["--tcp-rto-max-ms", "1000"]),
        ("services.edge", synthetic_args() + ["--out-dir", str(folder / "runs")]),
    )


@pytest.mark.parametrize("transport", ["ws", "tcp"])
def test_runs_complete_with_the_cap_at_both_ends(pair, transport):
    verifier, edge = pair
    run_id = f"rto-{transport}"
    post_runs(
        edge,
        [
            {
                "run_id": run_id,
                "client_id": "0",
                "mode": "sync",
                "gamma": 3,
                "prompts": [[5, 6, 7]],
                "max_new_tokens": 24,
                "verifier_url": verifier.url,
                "probe_count": 1,
                "transport": transport,
                "tcp_rto_max_ms": 1000,
            }
        ],
    )
    assert wait_for_runs(edge, [run_id])[run_id]["status"] == "done"
    (row,) = read_csv(edge, run_id, "requests.csv")
    assert int(row["tokens"]) == 24 and row["error"] == ""


def test_a_negative_cap_is_refused_by_name(pair):
    verifier, edge = pair
    status, body = edge.post_json(
        "/runs",
        {
            "run_id": "rto-bad",
            "client_id": "0",
            "mode": "sync",
            "gamma": 3,
            "prompts": [[5]],
            "max_new_tokens": 4,
            "verifier_url": verifier.url,
            "tcp_rto_max_ms": -1,
        },
    )
    assert status == 400 and "tcp_rto_max_ms" in body["error"]
