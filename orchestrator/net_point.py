"""Run one sweep point on a network testbed through the edges' control API; return trace rows.

Each client is one run on an edge (client c on edge c mod N). Warm-up requests run first in
every run and are dropped here, so that cold caches and first connections stay out of the
results. Every call (every attempt of a point) uses run ids of its own, so the rows of an earlier
attempt can never be fetched into a later one. While the runs go on, the testbed's shaping is
checked: a dead NFQUEUE daemon fails the point at once, with its reason, instead of stalling it
until the timeout. A partial last row of an edge's trace (an edge killed mid-write) is dropped
and counted in the point's record.
"""
from __future__ import annotations

import json
import os
import time

import pandas as pd

from orchestrator.csv_rows import read_whole_rows
from orchestrator.http_client import call
from orchestrator.launchers.base import LinkState, Testbed
from orchestrator.request_stats import add_request_stats
from orchestrator.sweep import Point


def run_net_point(point: Point, testbed: Testbed, prompts: list[list[int]], warmup: int,
                  max_new_tokens: int, max_in_flight: int, run_prefix: str,
                  timeout_s: float = 900.0) -> tuple[list[dict], list[dict], list[LinkState], dict]:
    links = testbed.shape([point.rtt_ms] * len(testbed.edges))
    attempt_id = os.urandom(3).hex()
    runs = []
    for client in range(point.clients):
        edge = testbed.edges[client % len(testbed.edges)]
        run_id = f"{run_prefix}-{point.key}-{attempt_id}-c{client}"
        call("POST", f"{edge.control_url}/runs", token=edge.token, body={
            "run_id": run_id, "client_id": str(client), "mode": point.mode, "gamma": point.gamma,
            "prompts": prompts, "max_new_tokens": max_new_tokens, "verifier_url": testbed.verifier_url,
            "max_in_flight": max_in_flight, **point.sampling.run_fields(),
            "app_delay_ms": testbed.app_delay_ms(client),
            "probe_count": 5, "probe_interval_ms": 200.0,
        })
        runs.append((edge, run_id))
    deadline = time.monotonic() + timeout_s
    pending = list(runs)
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} run(s) of {point.key} unfinished after {timeout_s:.0f} s")
        time.sleep(0.2)
        testbed.check()
        for edge, run_id in list(pending):
            status = json.loads(call("GET", f"{edge.control_url}/runs/{run_id}", token=edge.token))
            if status["status"] == "failed":
                raise RuntimeError(f"run {run_id} on {edge.name} failed: {status.get('error')}")
            if status["status"] == "done":
                pending.remove((edge, run_id))
    testbed.check()
    round_frames, request_frames, dropped = [], [], 0
    for edge, run_id in runs:
        for name, frames in (("rounds", round_frames), ("requests", request_frames)):
            frame, n_dropped = read_whole_rows(call("GET", f"{edge.control_url}/runs/{run_id}/{name}.csv",
                                                    token=edge.token))
            frames.append(frame)
            dropped += n_dropped
    rounds = pd.concat(round_frames, ignore_index=True)
    requests = pd.concat(request_frames, ignore_index=True)
    failed = requests["error"].notna() & (requests["error"].astype(str) != "") if "error" in requests else None
    if failed is not None and failed.any():
        raise RuntimeError(f"a request of {point.key} failed: {requests.loc[failed, 'error'].iloc[0]}")
    rounds = rounds[rounds.request_index >= warmup].copy()
    requests = requests[requests.request_index >= warmup].copy()
    rounds["request_index"] -= warmup
    requests["request_index"] -= warmup
    requests = add_steady_state(requests, rounds)
    requests = add_request_stats(requests, rounds, "token_ids")
    requests["shaper"] = testbed.shaper
    return rounds.to_dict("records"), requests.to_dict("records"), links, {"partial_rows_dropped": dropped}


def add_steady_state(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """steady_per_token_s: time after the first tokens arrived, per token after them; and the
    measured RTT column the analysis reads."""
    first_emitted = (rounds[rounds.emitted > 0].sort_values("round_index")
                     .groupby(["client_id", "request_index"])["emitted"].first())
    requests = requests.copy()
    keys = list(zip(requests.client_id, requests.request_index))
    firsts = [first_emitted.get(k, 1) for k in keys]
    steady_tokens = requests["tokens"] - pd.Series(firsts, index=requests.index)
    requests["steady_per_token_s"] = (requests["wall_s"] - requests["ttft_s"]) / steady_tokens.where(steady_tokens > 0)
    requests["rtt_measured_ms"] = requests["rtt_probe_ms"]
    return requests
