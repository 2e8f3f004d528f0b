"""After the measurements: each point and cell against the prediction written before it ran
(predictions.csv, orchestrator/analysis/predictions.py), the machine's own drift since the
calibration, and the crossovers predicted from the calibration alone.

Pure functions over pandas frames.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd.modes import CROSSOVERS, PIPELINED, SYNC
from orchestrator.analysis.points import GROUP_KEYS, point_keys


def add_out_of_sample(points: pd.DataFrame, predictions: pd.DataFrame | None) -> pd.DataFrame:
    """points.csv's out-of-sample columns: calibration (the point fed the prediction),
    per_token_ms_predicted_oos (written before the point ran) and latency_err_oos_pct (NaN for
    calibration points: they are in sample by construction)."""
    points = points.copy()
    if predictions is None:
        points["calibration"] = False
        points["per_token_ms_predicted_oos"] = math.nan
        points["latency_err_oos_pct"] = math.nan
        return points
    keys = [k for k in point_keys(points) if k in predictions.columns]
    matched = predictions.set_index(keys).reindex(pd.MultiIndex.from_frame(points[keys]))
    points["calibration"] = matched["calibration"].astype(object).fillna(False).astype(bool).to_numpy()
    # A point's own prediction; a repeat added after the plan (orchestrator/running/repeat_until_ci.py) has
    # no row of its own and takes its cell's (the median over the repeats' calibrations).
    cell_keys = [k for k in keys if k != "repeat"]
    by_cell = predictions.groupby(cell_keys, dropna=False)["per_token_ms_predicted"].median()
    own = matched["per_token_ms_predicted"].to_numpy(dtype=float)
    cell = by_cell.reindex(pd.MultiIndex.from_frame(points[cell_keys])).to_numpy(dtype=float)
    points["per_token_ms_predicted_oos"] = np.where(np.isnan(own), cell, own)
    err = 100 * (points["per_token_ms_p50"] / points["per_token_ms_predicted_oos"] - 1)
    points["latency_err_oos_pct"] = err.where(~points["calibration"])
    return points


def add_compute_drift(points: pd.DataFrame) -> pd.DataFrame:
    """points.csv's compute_drift_pct: the server's compute per pass at the point
    (server_compute_ms_p50) against the calibration point of its group and mode (pipelined DSD,
    which has none while sync DSD calibrates, against sync DSD's: both time the verification pass).
    It is how far the machine itself moved between the calibration and the point; a prediction
    made from the calibration cannot know it."""
    points = points.copy()
    points["compute_drift_pct"] = math.nan
    if "server_compute_ms_p50" not in points or not points["calibration"].any():
        return points
    group_keys = [k for k in GROUP_KEYS if k in points.columns]
    for _, group in points.groupby(group_keys, dropna=False) if group_keys else [(None, points)]:
        calibrations = group[group["calibration"]]
        for repeat, rows in group.groupby("repeat"):
            # the repeat's own calibration (calibrate = "every_repeat"), else the group's first
            own = calibrations[calibrations["repeat"] == repeat]
            reference = (own if not own.empty else calibrations).groupby("mode")["server_compute_ms_p50"].first()
            if PIPELINED not in reference and SYNC in reference:
                reference[PIPELINED] = reference[SYNC]
            ratio = rows["server_compute_ms_p50"] / rows["mode"].astype(str).map(reference)
            points.loc[rows.index, "compute_drift_pct"] = (100 * (ratio - 1)).where(~rows["calibration"])
    return points


def oos_cells(points: pd.DataFrame) -> pd.DataFrame:
    """Per (group, mode, RTT, gamma) cell of one-client points: the median over its
    non-calibration repeats of per_token_ms_p50 against the median of their predictions, the
    error, and the median compute drift of those points (add_compute_drift)."""
    single = points[
        (points["clients"] == points["clients"].min())
        & ~points["calibration"]
        & points["per_token_ms_predicted_oos"].notna()
    ]
    keys = [k for k in GROUP_KEYS if k in single.columns] + ["mode", "rtt_ms", "gamma"]
    if single.empty:
        return pd.DataFrame(columns=keys + ["measured_ms", "predicted_ms", "err_pct", "repeats", "compute_drift_pct"])
    cells = (
        single.groupby(keys)
        .agg(
            measured_ms=("per_token_ms_p50", "median"),
            predicted_ms=("per_token_ms_predicted_oos", "median"),
            repeats=("repeat", "nunique"),
            compute_drift_pct=("compute_drift_pct", "median"),
        )
        .reset_index()
    )
    cells["err_pct"] = 100 * (cells["measured_ms"] / cells["predicted_ms"] - 1)
    return cells


def oos_crossovers(
    predictions: pd.DataFrame | None,
    group: dict,
    gamma: int,
    clients: int | None = None,
    pairs: dict[str, tuple[str, str]] = CROSSOVERS,
) -> dict:
    """The group's crossovers as predicted from calibration alone (name -> RTT in ms; with a
    calibration per repeat, the median over them), at this client count (default: the smallest,
    the calibration's)."""
    if predictions is None:
        return {}
    rows = predictions[predictions["gamma"] == gamma]
    if "clients" in rows.columns and len(rows):
        rows = rows[rows["clients"] == (rows["clients"].min() if clients is None else clients)]
    for key, value in group.items():
        if key in rows.columns:
            rows = rows[rows[key] == value]
    if rows.empty:
        return {}
    per_unit = rows.groupby("repeat").first()  # one row per calibration
    return {
        name: float(np.median(per_unit[f"crossover_{name}_rtt_ms"].to_numpy(dtype=float)))
        for name in pairs
        if f"crossover_{name}_rtt_ms" in rows.columns
    }


def crossover_err_pct(measured_ms: float, predicted_ms: float) -> float:
    """|measured / predicted - 1| in percent; 0 if both are the same infinity, inf if one is."""
    if math.isfinite(measured_ms) and math.isfinite(predicted_ms) and predicted_ms:
        return 100 * abs(measured_ms / predicted_ms - 1)
    if math.isnan(measured_ms) or math.isnan(predicted_ms):
        return math.nan
    return 0.0 if measured_ms == predicted_ms else math.inf
