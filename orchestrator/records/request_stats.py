"""A point's trace tables as every launcher finishes them (``finish_point``): warm-up requests
dropped, per-request figures of what the pair did added (alpha fitted over the request's own
rounds, and how repetitive its output was: distinct 4-grams; a looping output accepts nearly
every draft and says nothing about a real workload), latency as the request's user feels it
(``token_latencies_ms``), and the link each client ran on."""

from __future__ import annotations

import math

import pandas as pd

from netem.measure import percentile


def distinct_ngram_ratio(tokens: list[int], n: int = 4) -> float:
    """Distinct n-grams over all n-grams of a token sequence: 1 never repeats, near 0 loops."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else math.nan


def token_latencies_ms(arrivals: list[tuple[float, int]]) -> list[float]:
    """Each token's latency after the request's first arrival, from its arrivals in time order,
    (receipt time s, tokens received): an arrival of k tokens g after the previous one charges
    each of its k tokens g / k (tokens that come together are shown together; the charges sum to
    the time from the first arrival to the last, so their mean is the steady time per token).
    The first arrival's tokens are the time to first token's, not here."""
    out: list[float] = []
    for (t_before_s, _), (t_s, k) in zip(arrivals, arrivals[1:]):
        out += [1e3 * (t_s - t_before_s) / k] * k
    return out


def longest_gap_ms(arrivals: list[tuple[float, int]]) -> float:
    """The longest wait between two arrivals of tokens (a stall shows here whole); NaN with one."""
    return max((1e3 * (b - a) for (a, _), (b, _) in zip(arrivals, arrivals[1:])), default=math.nan)


def request_arrivals(rounds: pd.DataFrame) -> dict:
    """(client_id, request_index) -> [(t_receive_s, emitted)] of its rounds that brought tokens,
    in time order; empty where the rounds carry no receipt times (the sim launcher's)."""
    if rounds.empty or "t_receive_s" not in rounds or rounds["t_receive_s"].isna().all():
        return {}
    live = rounds[(rounds["emitted"] > 0) & rounds["t_receive_s"].notna()].sort_values("t_receive_s")
    return {
        (str(c), int(r)): list(zip(g["t_receive_s"].astype(float), g["emitted"].astype(int)))
        for (c, r), g in live.groupby(["client_id", "request_index"])
    }


def add_latency_stats(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """requests with ``token_latency_ms_p50``/``_p99`` (over ``token_latencies_ms``, inverted-CDF
    percentiles: always a latency a token had) and ``longest_gap_ms``; NaN without receipt times."""
    requests = requests.copy()
    arrivals = request_arrivals(rounds)
    keys = [(str(c), int(r)) for c, r in zip(requests["client_id"], requests["request_index"])]
    latencies = [token_latencies_ms(arrivals.get(key, [])) for key in keys]
    requests["token_latency_ms_p50"] = [percentile(x, 50) for x in latencies]
    requests["token_latency_ms_p99"] = [percentile(x, 99) for x in latencies]
    requests["longest_gap_ms"] = [longest_gap_ms(arrivals.get(key, [])) for key in keys]
    return requests


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
    requests["alpha_measured"] = [
        request_alpha(by_request.get(key, empty)) for key in zip(requests["client_id"], requests["request_index"])
    ]
    requests["distinct_4gram"] = [
        math.nan if pd.isna(text) else distinct_ngram_ratio([int(t) for t in str(text).split()])
        for text in requests["token_ids"]
    ]
    return requests


def finish_point(
    rounds: pd.DataFrame, requests: pd.DataFrame, warmup: int, shaper: str, links: list
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A point's rounds and requests (services/traces.py rows, of every request run) as the sweep
    records them, the same on every launcher: without the first ``warmup`` requests of each
    client (request_index renumbered from 0), with the request stats, the ``shaper`` and the
    link each client ran on (client c on links[c mod len(links)], a LinkState)."""
    rounds = rounds[rounds.request_index >= warmup].copy()
    requests = requests[requests.request_index >= warmup].copy()
    rounds["request_index"] -= warmup
    requests["request_index"] -= warmup
    requests = add_request_stats(requests, rounds)
    requests = add_latency_stats(requests, rounds)
    requests["shaper"] = shaper
    links_of = [links[int(client) % len(links)] for client in requests["client_id"]]
    requests["link_edge"] = [link.edge for link in links_of]
    requests["link_rtt_configured_ms"] = [link.rtt_configured_ms for link in links_of]
    return rounds, requests
