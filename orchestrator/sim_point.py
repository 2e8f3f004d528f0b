"""Run one sweep point on the ``sim`` launcher and return its trace rows."""
from __future__ import annotations

import pandas as pd

from dsd.stopping import StopRule
from orchestrator.request_stats import add_request_stats
from orchestrator.sim_launcher import Costs, run_request
from orchestrator.sweep import Point


def run_sim_point(point: Point, draft, target, prompts: list[list[int]], warmup: int,
                  max_new_tokens: int, max_in_flight: int, costs: Costs, controller: str = "static",
                  gamma_max: int = 16) -> tuple[list[dict], list[dict]]:
    if point.clients != 1:
        raise ValueError("the sim launcher runs one client per point; use a network launcher for more")
    stop = StopRule(max_new_tokens, target.eos_token_id)
    rtt_s = point.rtt_ms / 1e3
    round_rows, request_rows = [], []
    for index, prompt in enumerate(prompts):
        seq_id = f"{point.key}-{index}"
        tokens, rounds, wall_s, ttft_s = run_request(point.mode, draft, target, prompt, point.gamma,
                                                     rtt_s, stop, costs, max_in_flight, seq_id,
                                                     point.sampling.params(index), controller, gamma_max)
        if index < warmup:
            continue
        request_index = index - warmup
        for record in rounds:
            round_rows.append({"client_id": 0, "request_index": request_index,
                               "round_index": record.round_index, "proposed": record.proposed,
                               "accepted": record.accepted, "emitted": record.emitted,
                               "stale": record.stale, "round_gamma": record.gamma or None,
                               "round_mode": record.mode})
        first_emitted = next((r.emitted for r in rounds if r.emitted), 1)
        steady_tokens = len(tokens) - first_emitted
        request_rows.append({
            "client_id": 0, "request_index": request_index, "launcher": "sim",
            "shaper": "none (virtual link)", "rtt_measured_ms": point.rtt_ms,
            "tokens": len(tokens), "wall_s": wall_s, "ttft_s": ttft_s,
            "per_token_s": wall_s / max(len(tokens), 1),
            "steady_per_token_s": (wall_s - ttft_s) / steady_tokens if steady_tokens > 0 else float("nan"),
            "generated": " ".join(map(str, tokens)),
        })
    if not request_rows:
        return round_rows, request_rows
    requests = add_request_stats(pd.DataFrame(request_rows), pd.DataFrame(round_rows), "generated")
    return round_rows, requests.to_dict("records")
