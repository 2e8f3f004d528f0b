"""Views of a sweep's rounds table that more than one analysis needs."""

from __future__ import annotations

import pandas as pd


def rounds_with_receipts(rounds: pd.DataFrame, emitting_only: bool = False) -> pd.DataFrame | None:
    """The live (not stale) rounds that carry receipt times, i.e. were measured across a network
    launcher's link; with ``emitting_only``, those that emitted tokens. None where no round has
    receipt times (the sim launcher)."""
    if rounds.empty or "t_receive_s" not in rounds or rounds["t_receive_s"].isna().all():
        return None
    keep = ~rounds["stale"].astype(bool) & rounds["t_receive_s"].notna()
    if emitting_only:
        keep &= rounds["emitted"] > 0
    return rounds[keep]
