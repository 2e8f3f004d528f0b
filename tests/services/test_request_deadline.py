"""A request past its deadline (RunConfig.request_deadline_s) is given up as a real client would:
its requests.csv row says why, the run goes on, and the next requests complete exactly. The
stall is the verifier's process stopped (SIGSTOP) mid-request, on real loopback sockets."""

import os
import signal
import threading
import time

import pytest

from tests.services.harness import post_runs, read_csv, synthetic_args, wait_for_runs
from tests.checks import every

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]


@pytest.fixture(scope="module")
def pair(spawn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("deadline")
    return spawn(
        ("services.verifier", synthetic_args()),
        ("services.edge", synthetic_args() + ["--out-dir", str(folder / "runs")]),
    )


def run(edge, verifier, run_id: str, mode: str, **extra) -> str:
    post_runs(
        edge,
        [
            {
                "run_id": run_id,
                "client_id": "0",
                "mode": mode,
                "gamma": 3,
                "prompts": PROMPTS,
                "max_new_tokens": 100,
                "verifier_url": verifier.url,
                "app_delay_ms": 10.0,
                "probe_count": 1,
                **extra,
            }
        ],
    )
    return run_id


def stall_verifier_until_a_request_row(edge, verifier, run_id: str, hold_after_s: float) -> threading.Thread:
    """Stop the verifier once the run has rounds; resume it hold_after_s after the first request
    row appears (the given-up request), so only that request sees the whole stall."""

    def stall():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(read_csv(edge, run_id, "rounds.csv")) < 5:
            time.sleep(0.01)
        os.killpg(verifier.process.pid, signal.SIGSTOP)
        try:
            while time.monotonic() < deadline and not read_csv(edge, run_id, "requests.csv"):
                time.sleep(0.05)
            time.sleep(hold_after_s)
        finally:
            os.killpg(verifier.process.pid, signal.SIGCONT)

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", ["sync", "ar"])
def test_a_request_past_its_deadline_is_a_row_with_its_reason_and_the_next_requests_run_exactly(pair, mode):
    verifier, edge = pair
    reference = run(edge, verifier, f"reference-{mode}", mode)
    assert wait_for_runs(edge, [reference])[reference]["status"] == "done"
    reference_rows = read_csv(edge, reference, "requests.csv")
    expected = [row["token_ids"] for row in reference_rows]
    # well beyond a request's time on this (shared, busy) host, so only the stalled one misses it
    deadline_s = round(max(2.0, 3 * max(float(r["wall_s"]) for r in reference_rows) + 1), 1)

    stalled = run(edge, verifier, f"stalled-{mode}", mode, request_deadline_s=deadline_s)
    thread = stall_verifier_until_a_request_row(edge, verifier, stalled, hold_after_s=0.3)
    summary = wait_for_runs(edge, [stalled], timeout_s=60 + 3 * deadline_s)[stalled]
    thread.join(timeout=65)
    assert summary["status"] == "done", summary
    rows = read_csv(edge, stalled, "requests.csv")
    assert [int(r["request_index"]) for r in rows] == [0, 1, 2]
    first, *rest = rows
    assert first["gave_up"].startswith(f"deadline: not done within request_deadline_s {deadline_s:g} ("), first
    assert first["error"] == "" and first["token_ids"] == ""
    assert 0 < int(first["tokens"]) < 100
    assert every(r["gave_up"] == "" and r["error"] == "" for r in rest), [
        (r["gave_up"], r["error"], r["tokens"], r["wall_s"]) for r in rows
    ]
    assert [r["token_ids"] for r in rest] == expected[1:]
