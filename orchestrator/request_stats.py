"""A point's trace tables as every launcher finishes them (``finish_point``): warm-up requests
dropped, per-request figures of what the pair did added (alpha fitted over the request's own
rounds, and how repetitive its output was: distinct 4-grams; a looping output accepts nearly
every draft and says nothing about a real workload), and the link each client ran on."""
from __future__ import annotations

import math

import pandas as pd


def distinct_ngram_ratio(tokens: list[int], n: int = 4) -> float:
    """Distinct n-grams over all n-grams of a token sequence: 1 never repeats, near 0 loops."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else math.nan


def request_alpha(rounds: pd.DataFrame) -> float:
    """Maximum-likelihood alpha of one request's live rounds (nan without drafts, as in AR)."""
    if rounds.empty or "accepted" not in rounds:
        return math.nan
    live = rounds[~rounds["stale"].astype(bool)] if "stale" in rounds else rounds
    accepted = live["accepted"].sum()
    failures = (live["accepted"] < live["proposed"]).sum()
    return float(accepted / (accepted + failures)) if accepted + failures else math.nan


def add_request_stats(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """requests with ``alpha_measured`` (a sweep's ``alpha`` column is the configured one) and
    ``distinct_4gram`` columns (of ``token_ids``, the generated ids separated by spaces)."""
    requests = requests.copy()
    by_request = dict(iter(rounds.groupby(["client_id", "request_index"]))) if len(rounds) else {}
    empty = rounds.iloc[0:0]
    requests["alpha_measured"] = [request_alpha(by_request.get(key, empty))
                         for key in zip(requests["client_id"], requests["request_index"])]
    requests["distinct_4gram"] = [math.nan if pd.isna(text) else distinct_ngram_ratio([int(t) for t in str(text).split()])
                                  for text in requests["token_ids"]]
    return requests


def finish_point(rounds: pd.DataFrame, requests: pd.DataFrame, warmup: int, shaper: str,
                 links: list) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A point's rounds and requests (services/traces.py rows, of every request run) as the sweep
    records them, the same on every launcher: without the first ``warmup`` requests of each
    client (request_index renumbered from 0), with the request stats, the ``shaper`` and the
    link each client ran on (client c on links[c mod len(links)], a LinkState)."""
    rounds = rounds[rounds.request_index >= warmup].copy()
    requests = requests[requests.request_index >= warmup].copy()
    rounds["request_index"] -= warmup
    requests["request_index"] -= warmup
    requests = add_request_stats(requests, rounds)
    requests["shaper"] = shaper
    links_of = [links[int(client) % len(links)] for client in requests["client_id"]]
    requests["link_edge"] = [link.edge for link in links_of]
    requests["link_rtt_configured_ms"] = [link.rtt_configured_ms for link in links_of]
    return rounds, requests
