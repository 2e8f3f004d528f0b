"""Parameters fitted from a run's rounds: alpha (maximum likelihood, and the one that reproduces
the rounds' tokens per round), the compute times (medians of the server's and edge's compute),
the closed form's parameters as the client sees them (compute plus the harness's per-round
overhead), and the speculation cache's hit rate and fill time.

Pure functions over pandas frames.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd.analytic import latency_model as lm
from dsd.modes import AR, CACHED, COLOCATED, SYNC, edge_modes
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis.rounds import rounds_with_receipts


def fit_alpha(rounds: pd.DataFrame) -> float:
    """Pooled maximum-likelihood alpha over live rounds: accepted successes, one failure per
    round that did not accept everything."""
    live = rounds[~rounds["stale"].astype(bool)] if "stale" in rounds else rounds
    accepted = live["accepted"].sum()
    failures = (live["accepted"] < live["proposed"]).sum()
    return float(accepted / (accepted + failures)) if accepted + failures else math.nan


def fit_alpha_tokens_per_round(rounds: pd.DataFrame) -> float:
    """The alpha whose closed-form tokens per round reproduces the rounds' own: the root of
    sum over rounds of E(alpha, gamma_r) = sum of tokens emitted (method of moments). The closed
    form uses alpha only through E (and the survival alpha^(gamma+1)), so where acceptance is not
    geometric (a stratified sequence, a real pair's bursts) this, not the maximum-likelihood
    alpha, is the one that predicts per-token latency. NaN without rounds; 0 or 1 at the ends."""
    live = rounds[~rounds["stale"].astype(bool)] if "stale" in rounds else rounds
    if live.empty:
        return math.nan
    gammas = live["proposed"].astype(int).to_numpy()
    emitted = float(live["emitted"].sum())

    def tokens(alpha: float) -> float:
        return sum(lm.expected_tokens_per_round(alpha, int(g)) for g in gammas if g >= 1) + (gammas < 1).sum()

    if emitted <= tokens(0.0):
        return 0.0
    if emitted >= tokens(1.0):
        return 1.0
    return lm.bisect_increasing(tokens, emitted, 0.0, 1.0, tol=1e-7)


FITTED = ("t_draft_edge_s", "t_draft_server_s", "t_ar_s", "t_verify_s")  # what a run's rounds can say


def fit_params(rounds: pd.DataFrame, fallback: ComputeTimes) -> tuple[ComputeTimes, dict]:
    """t_draft_edge_s, t_draft_server_s, t_verify_s per gamma and t_ar_s from the round timings
    of a network run (medians); where a column or mode is missing, the fallback's value.
    Returns (the times, where each of FITTED came from)."""
    times, source = fallback, {k: "assumed (profile or in-process measurement)" for k in FITTED}
    hit_rate = cache_hit_rate(rounds)
    if hit_rate is not None:
        times = times.replace(cache_hit_rate=hit_rate, cache_fill_s=cache_fill_s(rounds))
        source["cache_hit_rate"] = "measured: the draft steps the cache held, over the cached mode's rounds"
        source["cache_fill_s"] = "measured: median fill time of the cached rounds whose fill was complete"
    if rounds.empty or "server_compute_s" not in rounds:
        return times, source
    live = rounds[~rounds["stale"].astype(bool)]
    edge = live[live["mode"].isin(edge_modes()) & live["t_draft_end_s"].notna()]
    sync = edge[edge["mode"] == SYNC]
    if len(sync):
        draft_s = (sync.t_draft_end_s - sync.t_draft_start_s) / sync.proposed
        times = times.replace(t_draft_edge_s=float(draft_s.median()))
        source["t_draft_edge_s"] = f"fitted: median draft time per token over {len(sync)} sync rounds"
    verify = edge[edge["server_compute_s"].notna()]
    times = times.with_verify_s(
        {int(gamma): float(group["server_compute_s"].median()) for gamma, group in verify.groupby("gamma")}
    )
    if len(verify):
        source["t_verify_s"] = f"fitted: median server compute over {len(verify)} DSD rounds"
    ar = live[(live["mode"] == AR) & live["server_compute_s"].notna()]
    if len(ar):
        times = times.replace(t_ar_s=float(ar["server_compute_s"].median()))
        source["t_ar_s"] = f"fitted: median server compute over {len(ar)} AR steps"
    co = live[(live["mode"] == COLOCATED) & live["server_compute_s"].notna()]
    if len(co):
        per_round = co.groupby("gamma")["server_compute_s"].median()
        estimates = [(per_round[g] - _t_verify_or_zero_s(times, int(g))) / g for g in per_round.index]
        times = times.replace(t_draft_server_s=float(max(np.median(estimates), 0.0)))
        source["t_draft_server_s"] = "fitted: (co-located round compute - t_verify) / gamma, median"
    return times, source


def cached_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """The cached mode's answered rounds (those that met its speculation cache)."""
    if rounds.empty or "cache_hit" not in rounds:
        return rounds.iloc[0:0]
    return rounds[(rounds["mode"] == CACHED) & rounds["cache_hit"].notna() & ~rounds["stale"].astype(bool)]


def cache_hit_rate(rounds: pd.DataFrame) -> float | None:
    """The share of the next blocks' draft steps the cache held by the verdicts, over the cached
    mode's verdicts: a complete hit counts 1, a branch d of gamma tokens deep d / gamma, a miss 0
    (the closed form's h: a verdict then leaves (1 - h) gamma draft steps to do on average); None
    without any."""
    cached = cached_rounds(rounds)
    if cached.empty:
        return None
    held = cached["cache_depth"].clip(upper=cached["proposed"]) / cached["proposed"].clip(lower=1)
    return float((cached["cache_hit"].astype(bool) * held).mean())


def cache_fill_s(rounds: pd.DataFrame) -> float | None:
    """How long a fill takes: the median over the rounds whose fill was complete by the verdict;
    where none was, the longest part-fill seen (the fill takes at least that)."""
    cached = cached_rounds(rounds)
    if cached.empty:
        return None
    filled = cached[cached["cache_filled"].astype(bool)]
    return float(filled["cache_fill_s"].median() if len(filled) else cached["cache_fill_s"].max())


def _t_verify_or_zero_s(times: ComputeTimes, gamma: int) -> float:
    return times.t_verify_s(gamma) if times.knows_gamma(gamma) else 0.0


def fit_effective_params(rounds: pd.DataFrame, compute: ComputeTimes) -> tuple[ComputeTimes, dict, dict]:
    """The closed form's parameters as the client sees them: compute plus the harness's own
    per-round overhead (event loops, messages, timers), measured from the round receipts of a
    network run, so that the model is tested on how the parts combine rather than on whether
    the harness is free. Returns (the times, where each of FITTED came from, overhead_ms per
    kind); the compute-only times where a mode or the timestamps are missing (the sim launcher).

    Means, not medians: the closed form is in expected times and a per-token latency is a sum
    of round times over a sum of tokens, so a skewed harness (a loaded machine's late wake-ups)
    counts with its tail.
    t_ar: mean time between AR tokens at the client (streamed: no RTT in it).
    t_verify: mean (receive - send - configured RTT - server queue) over sync rounds after each
    request's first.
    t_draft_edge: mean (send - previous receipt) / gamma over sync rounds: drafting and the
    edge's own work between a verdict and the next block.
    t_draft_server: (mean time between co-located rounds - t_verify) / gamma, so that the
    co-located round (gamma*t_draft_server + t_verify) is the measured one."""
    times, source, overhead_ms = compute, {k: "compute only (no receipt times)" for k in FITTED}, {}
    live = rounds_with_receipts(rounds)
    if live is None:
        return times, source, overhead_ms
    live = live.sort_values("round_index")
    keys = [k for k in ["point", "client_id", "request_index"] if k in live]
    previous_receive_s = live.groupby(keys)["t_receive_s"].shift(1)
    live = live.assign(
        since_previous_s=live["t_receive_s"] - previous_receive_s,
        send_since_previous_s=live["t_send_s"] - previous_receive_s,
    )
    for fit in (_client_view_ar, _client_view_sync, _client_view_colocated):
        times = fit(live, times, compute, source, overhead_ms)
    return times, source, overhead_ms


def _client_view_ar(
    live: pd.DataFrame, times: ComputeTimes, compute: ComputeTimes, source: dict, overhead_ms: dict
) -> ComputeTimes:
    steps = live[(live["mode"] == AR) & live["since_previous_s"].notna()]
    if not len(steps):
        return times
    ar = steps["since_previous_s"]
    source["t_ar_s"] = f"client view: mean time between AR tokens over {len(ar)} steps"
    # the harness: each gap less the server's compute of the step it brought (the step's own
    # pass, so a slow pass is not charged to the harness); the compute's mean over its median
    # (what one slow pass adds to the client view) apart
    if steps["server_compute_s"].notna().all():
        overhead_ms["ar_step"] = 1e3 * float((ar - steps["server_compute_s"]).mean())
        overhead_ms["ar_compute_mean_over_median"] = 1e3 * float(steps["server_compute_s"].mean() - compute.t_ar_s)
    else:
        overhead_ms["ar_step"] = 1e3 * (float(ar.mean()) - compute.t_ar_s)
    return times.replace(t_ar_s=float(ar.mean()))


def _client_view_sync(
    live: pd.DataFrame, times: ComputeTimes, compute: ComputeTimes, source: dict, overhead_ms: dict
) -> ComputeTimes:
    sync = live[live["mode"] == SYNC]
    # A request's first round also waits for its prompt's prefill; the steady state the per-token
    # statistic measures (steady_windows) leaves it out, and so does the fit where it can.
    if sync["send_since_previous_s"].notna().any():
        sync = sync[sync["send_since_previous_s"].notna()]
    if not len(sync):
        return times
    wait_s = sync["t_receive_s"] - sync["t_send_s"] - sync["rtt_ms"] / 1e3 - sync["server_queue_s"].fillna(0.0)
    times = times.with_verify_s({int(gamma): float(group.mean()) for gamma, group in wait_s.groupby(sync["gamma"])})
    source["t_verify_s"] = f"client view: mean receive - send - RTT - queue over {len(sync)} sync rounds"
    overhead_ms["dsd_round_server_side"] = 1e3 * float((wait_s - sync["server_compute_s"]).mean())
    edge = (sync["send_since_previous_s"] / sync["proposed"]).dropna()
    if len(edge):
        times = times.replace(t_draft_edge_s=float(edge.mean()))
        source["t_draft_edge_s"] = f"client view: mean (send - previous receipt) / gamma over {len(edge)} sync rounds"
        overhead_ms["dsd_round_edge_side"] = 1e3 * float(
            (sync["send_since_previous_s"] - (sync["t_draft_end_s"] - sync["t_draft_start_s"])).mean()
        )
    return times


def _client_view_colocated(
    live: pd.DataFrame, times: ComputeTimes, compute: ComputeTimes, source: dict, overhead_ms: dict
) -> ComputeTimes:
    co = live[live["mode"] == COLOCATED].dropna(subset=["since_previous_s"])
    if not len(co):
        return times
    estimates = [
        (g["since_previous_s"].mean() - _t_verify_or_zero_s(times, int(gamma))) / gamma
        for gamma, g in co.groupby("gamma")
    ]
    source["t_draft_server_s"] = (
        "client view: (mean time between co-located rounds - t_verify) / gamma; "
        "below compute when t_verify carries DSD's message overhead"
    )
    overhead_ms["colocated_round"] = 1e3 * float((co["since_previous_s"] - co["server_compute_s"]).mean())
    return times.replace(t_draft_server_s=float(max(np.median(estimates), 0.0)))
