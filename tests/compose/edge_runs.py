"""Drive runs through the edges' control API (POST /runs, poll, fetch the CSVs), bounded in time."""

from __future__ import annotations

import csv
import io
import json
import time

from orchestrator.common.http_client import call

MODES = ("ar", "colocated", "sync", "pipelined")


def run_waves(testbed, prompts: list[list[int]], max_new_tokens: int, gamma: int, timeout_s: float, **extra) -> dict:
    """Every mode on every edge: one wave per mode, edge i running mode (i + wave) mod 4, so a
    wave has one run per edge and runs on different links use different modes.

    Returns {(edge index, mode): (summary, rounds rows, requests rows)}.
    """
    results = {}
    for wave in range(len(MODES)):
        posted = {}
        for i, edge in enumerate(testbed.edges):
            mode = MODES[(i + wave) % len(MODES)]
            run_id = f"e{i}-{mode}"
            call(
                "POST",
                f"{edge.control_url}/runs",
                token=edge.token,
                body={
                    "run_id": run_id,
                    "client_id": run_id,
                    "mode": mode,
                    "gamma": gamma,
                    "prompts": prompts,
                    "max_new_tokens": max_new_tokens,
                    "verifier_url": testbed.verifier_url,
                    "app_delay_ms": testbed.app_delay_ms(i),
                    **extra,
                },
            )
            posted[(i, mode)] = (edge, run_id)
        summaries = wait_for(posted, timeout_s)
        results.update(
            {
                key: (summaries[key], read_csv(edge, run_id, "rounds.csv"), read_csv(edge, run_id, "requests.csv"))
                for key, (edge, run_id) in posted.items()
            }
        )
    return results


def wait_for(posted: dict, timeout_s: float) -> dict:
    """{key: (edge, run_id)} -> {key: final summary}; raises after timeout_s."""
    deadline = time.monotonic() + timeout_s
    summaries = {}
    while len(summaries) < len(posted):
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs unfinished after {timeout_s} s: {sorted(set(posted) - set(summaries))}")
        time.sleep(0.2)
        for key, (edge, run_id) in posted.items():
            if key not in summaries:
                summary = json.loads(call("GET", f"{edge.control_url}/runs/{run_id}", token=edge.token))
                if summary["status"] != "running":
                    summaries[key] = summary
    return summaries


def read_csv(edge, run_id: str, name: str) -> list[dict]:
    text = call("GET", f"{edge.control_url}/runs/{run_id}/{name}", token=edge.token).decode()
    return list(csv.DictReader(io.StringIO(text)))


def check_greedy(runs: dict, expected: list[list[int]]) -> None:
    """Every run done, and every request emitted exactly the expected tokens, round by round."""
    for (i, mode), (summary, rounds, requests) in runs.items():
        assert summary["status"] == "done", summary
        assert len(requests) == len(expected), (i, mode)
        for row in requests:
            assert row["error"] == "" and row["mode"] == mode
            got = [int(t) for t in row["token_ids"].split()]
            assert got == expected[int(row["request_index"])], f"edge {i} {mode} request {row['request_index']}"
            mine = [r for r in rounds if r["request_index"] == row["request_index"]]
            assert sum(int(r["emitted"]) for r in mine) == int(row["tokens"]) == len(got)
