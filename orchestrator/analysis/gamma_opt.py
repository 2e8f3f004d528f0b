"""The optimal gamma against the RTT: measured beside the closed form's argmin.

Per speculative mode, group (profile, alpha, link, sampling, clients) and RTT of a sweep with two
gammas or more and two RTTs or more:

    measured        the swept gamma with the least per-token latency (the analysis's cell
                    statistic, orchestrator/analysis/bootstrap.py); its uncertainty is the share of the
                    bootstrap replicates (paired: the same repeats and requests drawn for every
                    cell) in which each gamma is the argmin, and the set of gammas chosen in at
                    least SHARE_MIN of them
    predicted, oos  the argmin over the swept gammas of predictions.csv, written from the
                    calibration points alone before the other points ran (out of sample); the
                    penalty is the MEASURED latency at that gamma over the measured best
    model, oos      the closed form's argmin over 1..GAMMA_SEARCH_MAX with the calibrated alpha and
                    parameters (calibration.json): where the grid lies relative to the optimum
    model, in sample  the same with the alpha and parameters fitted from all rounds

Pure functions over frames; orchestrator/report/analyze.py reads and writes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd.modes import predict_per_token_s
from dsd.costs.compute_times import ComputeTimes, fit_verify_line

SHARE_MIN = 0.025  # a gamma chosen in fewer replicates is outside the set
GAMMA_SEARCH_MAX = 64  # the unrestricted argmin searches 1..this
WHAT = (
    "per speculative mode, group and RTT: gamma_best, the swept gamma with the least per-token latency "
    "(median over repeats of the per-point median over requests); gamma_shares / gamma_set: the share of "
    "2000 paired bootstrap replicates (repeats, then requests) choosing each gamma, and the gammas chosen in "
    f">= {100 * SHARE_MIN:g}% of them. OUT OF SAMPLE: gamma_best_predicted_grid_oos (argmin over the swept "
    "gammas of predictions.csv, written from the calibration points before the others ran; except where "
    "predicted_from_calibration_points) with penalty_ms/pct, the measured latency at that gamma over the "
    f"measured best; gamma_model_oos, the closed form's argmin over 1..{GAMMA_SEARCH_MAX} with the calibrated "
    "alpha and parameters (calibration.json). IN SAMPLE: gamma_model_insample, the same with the alpha and "
    "parameters fitted from all rounds"
)


def applies(cells: pd.DataFrame) -> bool:
    """A sweep says something about the optimal gamma with two gammas and two RTTs or more."""
    return len(cells) > 0 and cells["gamma"].nunique() >= 2 and cells["rtt_ms"].nunique() >= 2


def argmin_table(cells: pd.DataFrame, keys: list[str], value: str = "per_token_ms") -> pd.DataFrame:
    """Per combination of keys: gamma_best (the gamma with the least value; a tie goes to the
    smaller gamma) and value_best, the value there. NaN values are skipped."""
    rows = []
    for values, group in cells.dropna(subset=[value]).groupby(keys, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        best = group.sort_values(["gamma"]).loc[lambda g: g[value] == g[value].min()].iloc[0]
        rows.append({**dict(zip(keys, values)), "gamma_best": int(best["gamma"]), f"{value}_best": float(best[value])})
    return pd.DataFrame(rows, columns=keys + ["gamma_best", f"{value}_best"])


def replicate_shares(
    replicates: dict, cell_keys: list[str], keys: list[str], share_min: float = SHARE_MIN
) -> pd.DataFrame:
    """Per combination of keys (cell_keys without gamma): in how many bootstrap replicates each
    gamma is the argmin (gamma_shares, "g:share" by gamma), and the set of gammas chosen in at
    least share_min of them (gamma_set, its ends gamma_set_low/high). replicates: cell tuple (in
    cell_keys order) -> [n_boot] values, drawn jointly for all cells."""
    by_key: dict[tuple, dict[int, np.ndarray]] = {}
    for cell, values in replicates.items():
        attrs = dict(zip(cell_keys, cell))
        by_key.setdefault(tuple(attrs[k] for k in keys), {})[int(attrs["gamma"])] = values
    rows = []
    for key, curves in sorted(by_key.items()):
        gammas = sorted(curves)
        stacked = np.stack([curves[g] for g in gammas], axis=1)  # [n_boot, gammas]
        stacked = np.where(np.isnan(stacked), np.inf, stacked)
        chosen = np.asarray(gammas)[np.argmin(stacked, axis=1)]  # [n_boot]
        shares = {g: float(np.mean(chosen == g)) for g in gammas}
        kept = [g for g in gammas if shares[g] >= share_min]
        rows.append(
            {
                **dict(zip(keys, key)),
                "gammas_swept": len(gammas),
                "gamma_shares": " ".join(f"{g}:{s:.3f}" for g, s in shares.items() if s > 0),
                "gamma_set": " ".join(map(str, kept)),
                "gamma_set_low": min(kept),
                "gamma_set_high": max(kept),
            }
        )
    return pd.DataFrame(rows)


def model_argmin(per_token_s, gamma_max: int = GAMMA_SEARCH_MAX) -> tuple[int, float]:
    """(gamma, seconds per token) minimising per_token_s(gamma) over 1..gamma_max; the smaller
    gamma on a tie. per_token_s: gamma -> seconds (a closed form at fixed alpha, RTT, times)."""
    values = [(per_token_s(g), g) for g in range(1, gamma_max + 1)]
    best_s, best_gamma = min(values)
    return best_gamma, best_s


def times_for_any_gamma(times: ComputeTimes) -> ComputeTimes:
    """t_verify for every gamma from one line: the least-squares line through the fitted table
    (dsd.costs.compute_times.fit_verify_line; flat with one gamma in it), else the times' own line. Never the
    table for its gammas and an assumed line for the others: on loopback the client-view table
    carries ~1 ms of harness overhead the profile's line does not, and the argmin then jumps to
    the untabled gammas (seen: 3, 5, 7 on a grid of 1, 2, 4, 8)."""
    table = times.verify_table_s
    if not table:
        return times
    base_s, per_position_s = fit_verify_line(table) if len(table) >= 2 else (next(iter(table.values())), 0.0)
    return times.replace(t_verify_base_s=base_s, t_verify_per_position_s=per_position_s, t_verify_by_gamma_s=())


def model_gamma_s(mode: str, rtt_ms: float, alpha: float, times: ComputeTimes) -> tuple[int, float]:
    """The closed form's unrestricted argmin for one mode and RTT: (gamma, ms per token)."""
    times = times_for_any_gamma(times)
    gamma, seconds = model_argmin(
        lambda g: predict_per_token_s(mode, alpha, g, rtt_ms / 1e3, **times.closed_form_terms(g))
    )
    return gamma, 1e3 * seconds


def gamma_opt_table(
    cells: pd.DataFrame, replicates: dict, cell_keys: list[str], predicted_cells: pd.DataFrame | None, model_fits: dict
) -> pd.DataFrame:
    """One row per mode x group x RTT (the rows of gamma_opt.csv).

    cells: the measured cells (cell_keys + per_token_ms), speculative modes only; replicates:
    their bootstrap values; predicted_cells: cell keys + per_token_ms_predicted_oos (None without
    predictions.csv); model_fits: {"oos" | "insample": fn(row dict) -> (alpha, ComputeTimes) or None}."""
    keys = [k for k in cell_keys if k != "gamma"]
    measured = argmin_table(cells, keys).rename(columns={"per_token_ms_best": "per_token_ms_measured_best"})
    shares = replicate_shares(
        {
            c: v
            for c, v in replicates.items()
            if dict(zip(cell_keys, c))["gamma"] in set(cells["gamma"])
            and dict(zip(cell_keys, c))["mode"] in set(cells["mode"])
        },
        cell_keys,
        keys,
    )
    table = measured.merge(shares, on=keys, how="left")
    lookup = cells.set_index(cell_keys)["per_token_ms"]
    if predicted_cells is not None and len(predicted_cells):
        grid = argmin_table(predicted_cells, keys, "per_token_ms_predicted_oos").rename(
            columns={
                "gamma_best": "gamma_best_predicted_grid_oos",
                "per_token_ms_predicted_oos_best": "per_token_ms_predicted_grid_oos",
            }
        )
        table = table.merge(grid, on=keys, how="left")
    else:
        table["gamma_best_predicted_grid_oos"] = math.nan
        table["per_token_ms_predicted_grid_oos"] = math.nan
    rows = []
    for row in table.to_dict("records"):
        predicted_gamma = row["gamma_best_predicted_grid_oos"]
        at_predicted = (
            float(lookup.get(tuple(row[k] if k != "gamma" else int(predicted_gamma) for k in cell_keys), math.nan))
            if pd.notna(predicted_gamma)
            else math.nan
        )
        row["per_token_ms_measured_at_predicted"] = at_predicted
        row["penalty_ms"] = at_predicted - row["per_token_ms_measured_best"]
        row["penalty_pct"] = 100 * row["penalty_ms"] / row["per_token_ms_measured_best"]
        row["predicted_in_set"] = (
            pd.notna(predicted_gamma) and str(int(predicted_gamma)) in str(row.get("gamma_set", "")).split()
        )
        for label, fit_for in model_fits.items():
            fit = fit_for(row)
            gamma, ms = model_gamma_s(row["mode"], float(row["rtt_ms"]), *fit) if fit else (math.nan, math.nan)
            row[f"gamma_model_{label}"], row[f"per_token_ms_model_{label}"] = gamma, ms
        rows.append(row)
    return pd.DataFrame(rows)
