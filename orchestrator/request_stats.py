"""Per-request figures of what the pair did: alpha fitted over the request's own rounds and how
repetitive its output was (distinct 4-grams). A looping output accepts nearly every draft and
says nothing about a real workload; these columns let a reader see it."""
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


def add_request_stats(requests: pd.DataFrame, rounds: pd.DataFrame, tokens_column: str) -> pd.DataFrame:
    """requests with ``alpha_measured`` (a sweep's ``alpha`` column is the configured one) and
    ``distinct_4gram`` columns; tokens_column holds the generated ids separated by spaces."""
    requests = requests.copy()
    by_request = dict(iter(rounds.groupby(["client_id", "request_index"]))) if len(rounds) else {}
    empty = rounds.iloc[0:0]
    requests["alpha_measured"] = [request_alpha(by_request.get(key, empty))
                         for key in zip(requests["client_id"], requests["request_index"])]
    requests["distinct_4gram"] = [math.nan if pd.isna(text) else distinct_ngram_ratio([int(t) for t in str(text).split()])
                                  for text in requests[tokens_column]]
    return requests
