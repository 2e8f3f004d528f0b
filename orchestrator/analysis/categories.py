"""Acceptance and latency by the prompts' category (a categorized workload, workloads/README.md):
what a user reads off for their own mix of traffic. Pure functions over the sweep's frames."""

from __future__ import annotations

import pandas as pd

from dsd.modes import speculative_modes
from orchestrator.analysis.fits import fit_alpha

REQUEST_KEYS = ["run_id", "request_index"]  # a request's rounds carry these, not its category


def has_categories(requests: pd.DataFrame) -> bool:
    return "category" in requests and bool(_categories(requests).ne("").any())


def by_category(requests: pd.DataFrame, rounds: pd.DataFrame) -> dict[str, dict]:
    """Per category: its finished requests, alpha measured (pooled over the live rounds of its
    speculative requests, as alpha_measured is), and per mode the mean steady time per token
    (requests.csv's steady_per_token_s; a request without one is left out of the mean)."""
    finished = requests[_ok(requests)].assign(category=_categories(requests))
    finished = finished[finished["category"] != ""]
    tagged = (
        rounds.merge(finished[REQUEST_KEYS + ["category"]], on=REQUEST_KEYS, how="inner")
        if len(rounds)
        else pd.DataFrame(columns=[*REQUEST_KEYS, "category", "mode"])
    )
    spec = tagged[tagged["mode"].isin(speculative_modes())]
    result = {}
    for category, rows in finished.groupby("category", sort=True):
        steady_ms = rows.groupby("mode", sort=True)["steady_per_token_s"].mean() * 1e3
        result[str(category)] = {
            "requests": len(rows),
            "alpha_measured": fit_alpha(spec[spec["category"] == category]),
            "steady_per_token_ms_mean": {str(mode): float(v) for mode, v in steady_ms.items()},
        }
    return result


def _categories(requests: pd.DataFrame) -> pd.Series:
    return _text(requests["category"])


def _ok(requests: pd.DataFrame) -> pd.Series:
    ok = pd.Series(True, index=requests.index)
    for column in ("error", "gave_up"):
        if column in requests:
            ok &= _text(requests[column]).eq("")
    return ok


def _text(column: pd.Series) -> pd.Series:
    """A text column as read back (all-empty reads as float NaN) with "" for the empty cells."""
    return column.astype(object).where(column.notna(), "").astype(str)
