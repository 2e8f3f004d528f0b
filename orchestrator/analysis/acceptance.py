"""Acceptance over a sweep's rounds beside i.i.d. acceptance: what acceptance.png draws and
summary.json's ``acceptance`` reports."""

from __future__ import annotations

import pandas as pd

from dsd.modes import speculative_modes


def acceptance_histograms(rounds: pd.DataFrame, gamma: int) -> dict:
    """Per-request alpha (maximum likelihood over each request's live rounds) and the frequency
    of each accepted count per round at this gamma, beside the truncated geometric that i.i.d.
    acceptance at the pooled alpha gives: P(k) = alpha^k (1 - alpha) for k < gamma, alpha^gamma
    for k = gamma. Rounds of the speculative modes only."""
    live = rounds[
        rounds["mode"].isin(speculative_modes())
        & ~rounds["stale"].astype(bool)
        & (rounds["gamma"] == gamma)
        & (rounds["proposed"] == gamma)
    ]
    if live.empty:
        return {}
    failures = live["accepted"] < live["proposed"]
    alpha = float(live["accepted"].sum() / (live["accepted"].sum() + failures.sum()))
    keys = [k for k in ("point", "client_id", "request_index") if k in live.columns]
    per_request = live.assign(failure=failures).groupby(keys)[["accepted", "failure"]].sum()
    request_alpha = per_request["accepted"] / (per_request["accepted"] + per_request["failure"])
    counts = live["accepted"].value_counts().reindex(range(gamma + 1), fill_value=0)
    geometric = [alpha**k * (1 - alpha) for k in range(gamma)] + [alpha**gamma]
    return {
        "alpha": alpha,
        "request_alpha": request_alpha.dropna().tolist(),
        "accepted_share": (counts / counts.sum()).tolist(),
        "geometric": geometric,
        "rounds": int(len(live)),
    }
