"""The map over RTT x clients: for every client count, where each pair of modes crosses (RTT*(N)),
measured with its 95% bootstrap interval beside the prediction; and the fastest mode of every
(RTT, clients) cell. Pure functions over the analysis's frames.

The prediction of a client count is the one predictions.csv holds (dsd.analytic.queueing, written before
the points of that count ran, from the calibration points and the batch curve): out of sample for
every count above the calibration's (the smallest). At the calibration's count, or for a folder
without predictions, it is the queueing model with the group's in-sample fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from dsd.analytic import queueing
from dsd.modes import gammaless_modes
from orchestrator.analysis import bootstrap
from orchestrator.analysis.points import measured_crossovers
from orchestrator.analysis.out_of_sample import crossover_err_pct, oos_crossovers

IN_SAMPLE, OUT_OF_SAMPLE = "in_sample", "out_of_sample"
# Out-of-sample crossovers predicted below this are left out of the error summary: a few ms of
# difference there is a large percentage of nothing.
ERR_FLOOR_MS = 10.0
# A DSD mode's measured edge draft step at N clients over its step at the calibration's count:
# above this the edges slowed each other (on a testbed whose edges share CPUs, pipelined edges
# draft at once), so the row measures the testbed's edge sharing, not a deployment's edges.
EDGE_DRAFT_INFLATED_RATIO = 1.25
WHAT = (
    "per client count N and pair of modes: the RTT below which the first mode is at least as fast per "
    "token as the second (crossover_ms, from the median-of-repeats cells as summary crossovers are), its "
    "95% bootstrap interval (ci_low_ms, ci_high_ms; repeats, requests and clients drawn jointly for every "
    "cell of every client count; ci_degenerate: a point, no resampled value differs, not a spread), and the "
    "queueing model's prediction (predicted_ms, dsd.analytic.queueing: mean-value analysis); in_or_out_of_sample says whether "
    "that prediction was written before any point of that N ran; edge_draft_step_ratio: the DSD mode's measured "
    "edge draft step at N over its step at the smallest N, and edge_draft_inflated above "
    f"{EDGE_DRAFT_INFLATED_RATIO}: the edges slowed each other (they share CPUs on this testbed), so that row "
    "measures the testbed, not a deployment's edges"
)


def frontier_rows(
    points: pd.DataFrame,
    cell_reps: dict,
    cell_keys: list[str],
    group_values: dict,
    gamma: int,
    predictions: pd.DataFrame | None,
    in_sample_ms: Callable[[str, int], float],
) -> list[dict]:
    """One row per (client count, pair) the group's points measure both modes of. points: the
    group's; in_sample_ms(pair, clients): the fallback prediction (the group's in-sample fit)."""
    rtt_grid = sorted(points["rtt_ms"].unique())
    calibration_clients = int(points["clients"].min())
    rows = []
    for clients in sorted(int(c) for c in points["clients"].unique()):
        measured = measured_crossovers(points, gamma, clients, queueing.FRONTIER_PAIRS)
        fixed = group_values | {"gamma": gamma, "clients": clients}
        cis = bootstrap.crossover_cis(cell_reps, cell_keys, fixed, rtt_grid, queueing.FRONTIER_PAIRS)
        predicted = oos_crossovers(predictions, group_values, gamma, clients, queueing.FRONTIER_PAIRS)
        for pair in queueing.FRONTIER_PAIRS:
            if pair not in measured:
                continue
            ci = cis.get(pair, {})
            written_before = not math.isnan(predicted.get(pair, math.nan))
            predicted_ms = predicted[pair] if written_before else in_sample_ms(pair, clients)
            crossover_ms = measured[pair]["rtt_ms"]
            draft_ratio = edge_draft_step_ratio(points, queueing.FRONTIER_PAIRS[pair][0], clients, calibration_clients)
            rows.append(
                {
                    **group_values,
                    "clients": clients,
                    "pair": pair,
                    "crossover_ms": crossover_ms,
                    "ci_low_ms": ci.get("ci_low", math.nan),
                    "ci_high_ms": ci.get("ci_high", math.nan),
                    "ci_covers_grid": bool(ci.get("ci_covers_grid", False)),
                    "ci_degenerate": bool(ci.get("ci_degenerate", False)),
                    "predicted_ms": predicted_ms,
                    "in_or_out_of_sample": OUT_OF_SAMPLE
                    if written_before and clients > calibration_clients
                    else IN_SAMPLE,
                    "err_pct": crossover_err_pct(crossover_ms, predicted_ms),
                    "edge_draft_step_ratio": draft_ratio,
                    "edge_draft_inflated": bool(draft_ratio > EDGE_DRAFT_INFLATED_RATIO),
                }
            )
    return rows


def edge_draft_step_ratio(points: pd.DataFrame, mode: str, clients: int, calibration_clients: int) -> float:
    """The mode's median measured edge draft step (t_draft_ms_measured) over the points of this
    client count, divided by the same at the calibration's count; nan where either is unmeasured
    (a mode that drafts on the server, or points without the column)."""
    if "t_draft_ms_measured" not in points:
        return math.nan

    def median_step_ms(n: int) -> float:
        steps = points.loc[(points["mode"] == mode) & (points["clients"] == n), "t_draft_ms_measured"].dropna()
        return float(steps.median()) if len(steps) else math.nan

    base_ms = median_step_ms(calibration_clients)
    return median_step_ms(clients) / base_ms if base_ms > 0 else math.nan


def frontier_evidence(rows: list[dict]) -> dict:
    """The out-of-sample error of the frontier: |measured / predicted - 1| over the rows predicted
    before their points ran whose crossover lies inside the grid with an interval that places it,
    and whose prediction is at least ERR_FLOOR_MS."""
    errors = [
        r["err_pct"]
        for r in rows
        if r["in_or_out_of_sample"] == OUT_OF_SAMPLE
        and math.isfinite(r["crossover_ms"])
        and not r["ci_covers_grid"]
        and math.isfinite(r["predicted_ms"])
        and r["predicted_ms"] >= ERR_FLOOR_MS
    ]
    return {
        "err_p50_pct": float(np.median(errors)) if errors else math.nan,
        "err_max_pct": float(max(errors)) if errors else math.nan,
        "err_rows": len(errors),
        "err_floor_ms": ERR_FLOOR_MS,
        "edge_draft_inflated_rows": [
            f"{r['pair']} at N = {r['clients']}" for r in rows if r.get("edge_draft_inflated")
        ],
    }


def regime_cells(cells: pd.DataFrame, gamma: int) -> pd.DataFrame:
    """Per (clients, RTT) cell: the fastest mode by the cells' per-token latency, the runner-up,
    and the margin, how much slower the runner-up is (percent). cells: the summary's latency cells
    of one group; modes without a gamma are matched at any."""
    at_gamma = cells[(cells["gamma"] == gamma) | cells["mode"].isin(gammaless_modes())]
    rows = []
    for (clients, rtt_ms), cell in at_gamma.groupby(["clients", "rtt_ms"]):
        ranked = cell.sort_values("per_token_ms")
        best = ranked.iloc[0]
        second = ranked.iloc[1] if len(ranked) > 1 else None
        rows.append(
            {
                "clients": int(clients),
                "rtt_ms": float(rtt_ms),
                "fastest": best["mode"],
                "per_token_ms": float(best["per_token_ms"]),
                "runner_up": second["mode"] if second is not None else "",
                "margin_pct": 100 * (second["per_token_ms"] / best["per_token_ms"] - 1)
                if second is not None
                else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=["clients", "rtt_ms", "fastest", "per_token_ms", "runner_up", "margin_pct"])
