"""`dsdbed analyze`: read a sweep folder, write points.csv, summary.json and the plots its data
supports (latency vs RTT, the gain window over alpha and RTT, capacity vs clients; analyze_plots.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dsd.analytic import latency_model as lm
from dsd.analytic import queueing
from dsd.modes import AR, PIPELINED, SYNC, speculative_modes
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis import bootstrap, frontier, gamma_opt, paper
from orchestrator.analysis.acceptance import acceptance_histograms
from orchestrator.analysis.categories import by_category, has_categories
from orchestrator.analysis.groups import (
    GroupResult,
    ProfileFit,
    analyze_group,
    capacity_summary,
    fit_profiles,
    frame_groups,
    select,
)
from orchestrator.analysis.points import GROUP_KEYS, add_speedups, gain_window_table, point_keys, varied_group_keys
from orchestrator.analysis.out_of_sample import (
    add_compute_drift,
    add_out_of_sample,
    crossover_err_pct,
    oos_cells,
    oos_crossovers,
)
from orchestrator.analysis.predictions import CALIBRATION, read_predictions
from orchestrator.common import cpus
from orchestrator.common.files import write_json
from orchestrator.report import analyze_plots, finding_plots, plots


def read_sweep(out: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    out = Path(out)
    sweep = json.loads((out / "sweep.json").read_text())
    frames = [_read_csv(out / f"{name}.csv") for name in ("requests", "rounds", "links")]
    if frames[0].empty:
        raise ValueError(f"{out}: no finished requests to analyze")
    return sweep, *frames


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):  # merge writes no columns for none
        return pd.DataFrame()


def analyze_sweep(out: Path) -> dict:
    out = Path(out)
    sweep, requests, rounds, links = read_sweep(out)
    gamma = int(sweep["experiment"]["gamma"][0])
    group_keys = varied_group_keys(requests)
    fits = fit_profiles(sweep, requests, rounds)
    tables, groups = [], []
    for values, group_requests in frame_groups(requests, group_keys):
        group_rounds, group_links = select(rounds, group_keys, values), select(links, group_keys, values)
        points, group = analyze_group(
            sweep, dict(zip(group_keys, values)), group_requests, group_rounds, group_links, fits, gamma
        )
        tables.append(points)
        groups.append(group)
    points = add_speedups(pd.concat(tables, ignore_index=True))
    points, evidence, (cell_keys, cell_reps) = out_of_sample_and_intervals(out, requests, rounds, points, groups, gamma)
    points, evidence["cpu"] = add_point_conditions(out, points, sweep)
    points.to_csv(out / "points.csv", index=False)
    summary = {**_summary_head(sweep, gamma, group_keys, groups, fits), **evidence}
    summary["frontier"] = frontier_summary(out, sweep, points, groups, fits, (cell_keys, cell_reps), gamma)
    optimum = write_gamma_opt(out, sweep, points, summary["latency_cells"], cell_keys, cell_reps, groups, fits)
    if optimum:
        summary["gamma_opt"] = optimum
    params = {profile: fit.params for profile, fit in fits.items()}
    if len(params) > 1:
        summary["params_by_profile"] = {profile: times.to_dict() for profile, times in params.items()}
    compute = {profile: fit.compute for profile, fit in fits.items()}
    window = gain_window(points, gamma, params)
    if window is not None:
        window.to_csv(out / "gain_window.csv", index=False)
        summary["gain_window"] = window.to_dict("records")
    client_rates, capacity_rows = (
        capacity_summary(points, groups, compute) if points.clients.nunique() >= 2 else (None, None)
    )
    if capacity_rows is not None:
        summary["capacity"] = capacity_rows
    summary["plots"] = analyze_plots.sweep_plots(
        out, sweep, points, groups, params, compute, gamma, summary, client_rates
    )
    summary["plots"] += analyze_plots.link_timeline_plot(out, sweep, requests, links)
    summary["plots"] += analyze_plots.frontier_plots(out, sweep, points, groups, summary, gamma)
    if optimum:
        summary["plots"].append(optimum["plot"])
    acceptance, made = _acceptance(out, sweep, requests, rounds, gamma)
    summary["plots"] += made
    summary.update(acceptance)
    if has_categories(requests):
        summary["by_category"] = by_category(requests, rounds)
    assumed = {profile: fit.assumed for profile, fit in fits.items()}
    summary["paper"] = {
        "crossovers": paper.crossover_rows(summary["groups"], assumed, gamma),
        "capacity": paper.capacity_rows(summary.get("capacity", []), assumed, gamma, groups[0].profile),
    }
    write_json(out / "summary.json", summary)
    return summary


def frontier_summary(
    out: Path,
    sweep: dict,
    points: pd.DataFrame,
    groups: list[GroupResult],
    fits: dict[str, ProfileFit],
    cells: tuple[list[str], dict],
    gamma: int,
) -> dict:
    """summary.json's frontier (orchestrator/analysis/frontier.py): per group, client count and
    pair, the measured crossover with its interval beside the queueing model's prediction."""
    cell_keys, cell_reps = cells
    predictions = read_predictions(out)
    max_batch = int(sweep["experiment"].get("max_batch", 1))
    rows = []
    for (_, group_points), group in zip(frame_groups(points, varied_group_keys(points)), groups):

        def in_sample_ms(pair: str, clients: int, group=group) -> float:
            try:
                return 1e3 * queueing.crossover_rtt_s(
                    pair, clients, group.alpha_measured, gamma, fits[group.profile].params, max_batch
                )
            except ValueError:  # no alpha, or a batched server without a batch slope
                return math.nan

        rows += frontier.frontier_rows(
            group_points, cell_reps, cell_keys, group.group_values(), gamma, predictions, in_sample_ms
        )
    return {"what": frontier.WHAT, "max_batch": max_batch, "rows": rows, **frontier.frontier_evidence(rows)}


def gain_window(points: pd.DataFrame, gamma: int, params: dict[str, ComputeTimes]) -> pd.DataFrame | None:
    """Where DSD beats cloud AR over (alpha, RTT) (points.gain_window_table); None where the sweep
    varies no alpha or runs no cloud AR or no DSD mode."""
    dsd_modes = tuple(m for m in (SYNC, PIPELINED) if m in set(points["mode"]))
    if "alpha" not in points or AR not in set(points["mode"]) or not dsd_modes:
        return None
    return gain_window_table(points, gamma, params, dsd_modes)


def _summary_head(
    sweep: dict, gamma: int, group_keys: list[str], groups: list[GroupResult], fits: dict[str, ProfileFit]
) -> dict:
    """summary.json's first keys: what ran, and the first group's profile's fitted times."""
    main = fits[groups[0].profile]
    return {
        "experiment": sweep["experiment"]["name"],
        "launcher": sweep["launcher"],
        "shaper_backend": sweep["shaper_backend"],
        "gamma": gamma,
        "group_keys": group_keys,
        "alpha_measured": groups[0].alpha_measured if len(groups) == 1 else math.nan,
        "params": main.params.to_dict(),
        "params_source": main.params_source,
        "params_compute": main.compute.to_dict(),
        "params_compute_source": main.compute_source,
        "params_assumed": main.assumed.to_dict(),
        "harness_overhead_ms": main.overhead_ms,
        "capacity_factor_predicted": lm.capacity_factor(
            gamma, main.compute.t_draft_server_s, main.compute.t_verify_s(gamma)
        ),
        "prediction_alpha": PREDICTION_ALPHA,
        "crossovers": groups[0].crossovers if len(groups) == 1 else {},
        "groups": [g.entry() for g in groups],
    }


def _acceptance(
    out: Path, sweep: dict, requests: pd.DataFrame, rounds: pd.DataFrame, gamma: int
) -> tuple[dict, list[str]]:
    """The workload's acceptance and repetition: per-request alpha, accepted tokens per round
    beside i.i.d. acceptance (acceptance.png), distinct 4-grams of the outputs; and the plots made."""
    stats = acceptance_histograms(rounds, gamma) if len(rounds) and "mode" in rounds else {}
    if not stats:
        return {}, []
    plots.plot_acceptance(
        stats, gamma, out / "acceptance.png", f"{sweep['experiment']['name']}: acceptance over requests and rounds"
    )
    result = {
        "request_alpha_p10": float(np.percentile(stats["request_alpha"], 10)),
        "request_alpha_p50": float(np.percentile(stats["request_alpha"], 50)),
        "request_alpha_p90": float(np.percentile(stats["request_alpha"], 90)),
        "accepted_share": stats["accepted_share"],
        "accepted_share_iid": stats["geometric"],
    }
    if "distinct_4gram" in requests:
        result["distinct_4gram_p50"] = float(requests["distinct_4gram"].median())
    return {"acceptance": result}, ["acceptance.png"]


PREDICTION_ALPHA = (
    "per_token_ms_predicted, predicted_rtt_ms and the plots use the measured alpha "
    "(alpha_measured: pooled over the group's live rounds); *_at_configured_alpha use the "
    "configured one (alpha_configured)"
)


def out_of_sample_and_intervals(
    out: Path, requests: pd.DataFrame, rounds: pd.DataFrame, points: pd.DataFrame, groups: list[GroupResult], gamma: int
) -> tuple[pd.DataFrame, dict, tuple]:
    """The out-of-sample comparison with the predictions written before
    the measurements (orchestrator/analysis/predictions.py) and 95% bootstrap intervals
    (orchestrator/analysis/bootstrap.py). Adds points.csv columns, fills each group's crossovers with
    ci_low/ci_high and the out-of-sample prediction, and returns the summary's new keys and the
    latency cells' (keys, bootstrap replicates), which the optimal gamma reads."""
    predictions = read_predictions(out)
    points = add_compute_drift(add_out_of_sample(points, predictions))
    latencies = bootstrap.request_latencies(requests, rounds)
    keys = point_keys(latencies)
    points = _add_point_cis(points, latencies, keys)
    cell_keys = [k for k in keys if k != "repeat"]
    cells, cell_reps = bootstrap.cell_replicates(latencies, cell_keys)
    oos = oos_cells(points)
    cells = _cells_with_oos(bootstrap.latency_cis(cells, cell_reps, cell_keys), oos)
    oos_crossover_errs = [_fill_crossovers(group, predictions, cell_reps, cell_keys, points, gamma) for group in groups]
    evidence = {
        "out_of_sample": _out_of_sample_evidence(
            out, predictions, points, oos, [e for errs in oos_crossover_errs for e in errs]
        ),
        "in_sample": _in_sample_evidence(points),
        "bootstrap": {
            "replicates": bootstrap.N_BOOT,
            "seed": bootstrap.SEED,
            "level": bootstrap.LEVEL,
            "method": "percentile bootstrap over repeats (drawn jointly for all modes), then requests and, with several clients, clients (each drawn jointly for all cells)",
        },
        "latency_cells": cells.to_dict("records"),
    }
    return points, evidence, (cell_keys, cell_reps)


def write_gamma_opt(
    out: Path,
    sweep: dict,
    points: pd.DataFrame,
    latency_cells: list[dict],
    cell_keys: list[str],
    cell_reps: dict,
    groups: list[GroupResult],
    fits: dict[str, ProfileFit],
) -> dict:
    """gamma_opt.csv and gamma_opt.png (orchestrator/analysis/gamma_opt.py): per speculative mode, group and
    RTT the measured optimal gamma with its bootstrap set, beside the closed form's argmin. The
    summary's entry ({} where the sweep has fewer than two gammas or RTTs)."""
    # the analysis's cell statistic (bootstrap.cell_replicates), speculative modes only
    cells = pd.DataFrame(latency_cells, columns=cell_keys + ["per_token_ms"])
    cells = cells.loc[cells["mode"].isin(speculative_modes()), cell_keys + ["per_token_ms"]]
    measured = points[points["mode"].isin(speculative_modes())]
    if not gamma_opt.applies(cells):
        return {}
    predicted = measured.groupby(cell_keys, as_index=False).agg(
        per_token_ms_predicted_oos=("per_token_ms_predicted_oos", "first"), calibration=("calibration", "any")
    )
    calibration = _read_calibration(out)
    predictions = read_predictions(out)

    def oos_fit(row: dict):
        record = calibration.get(_calibration_group(predictions, row) or "all", {})
        if not record.get("predicted") or not math.isfinite(record.get("alpha", math.nan)):
            return None
        return record["alpha"], ComputeTimes.from_dict(record["params"])

    def insample_fit(row: dict):
        group = next(
            (g for g in groups if all(v == row[k] for k, v in g.group_values().items() if k in row)), groups[0]
        )
        return (group.alpha_measured, fits[group.profile].params) if math.isfinite(group.alpha_measured) else None

    table = gamma_opt.gamma_opt_table(
        cells,
        cell_reps,
        cell_keys,
        predicted[cell_keys + ["per_token_ms_predicted_oos"]]
        if predicted["per_token_ms_predicted_oos"].notna().any()
        else None,
        {"oos": oos_fit, "insample": insample_fit},
    )
    keys = [k for k in cell_keys if k != "gamma"]
    in_calibration = predicted.groupby(keys)["calibration"].any().rename("predicted_from_calibration_points")
    table = table.merge(in_calibration.reset_index(), on=keys, how="left")
    table.to_csv(out / "gamma_opt.csv", index=False)
    finding_plots.plot_gamma_opt(
        table,
        out / "gamma_opt.png",
        f"{sweep['experiment']['name']}: optimal gamma vs RTT (launcher={sweep['launcher']})",
        sweep["launcher"],
    )
    return {"what": gamma_opt.WHAT, "file": "gamma_opt.csv", "plot": "gamma_opt.png", "rows": table.to_dict("records")}


def _calibration_group(predictions: pd.DataFrame | None, row: dict) -> str | None:
    """The calibration record (calibration.json) of the group a gamma_opt row belongs to."""
    if predictions is None or "group" not in predictions:
        return None
    match = predictions
    for key in GROUP_KEYS:
        if key in row and key in match.columns:
            match = match[match[key] == row[key]]
    groups = match["group"].astype(object).fillna("").astype(str)
    return (groups.iloc[0] or "all") if len(groups) else None


def _add_point_cis(points: pd.DataFrame, latencies: pd.DataFrame, point_keys: list[str]) -> pd.DataFrame:
    """points.csv's per_token_ms_ci_low/high: each point's bootstrap interval over its requests."""
    per_point, point_reps = bootstrap.cell_replicates(latencies, point_keys)
    per_point = bootstrap.latency_cis(per_point, point_reps, point_keys)
    ci = per_point.set_index(point_keys)[["ci_low", "ci_high"]].reindex(pd.MultiIndex.from_frame(points[point_keys]))
    points["per_token_ms_ci_low"] = ci["ci_low"].to_numpy()
    points["per_token_ms_ci_high"] = ci["ci_high"].to_numpy()
    return points


def _cells_with_oos(cells: pd.DataFrame, oos: pd.DataFrame) -> pd.DataFrame:
    """The latency cells with their out-of-sample prediction and error beside the interval."""
    join = [k for k in oos.columns if k in cells.columns and k not in ("per_token_ms", "repeats")]
    return cells.merge(
        oos[join + ["predicted_ms", "err_pct"]].rename(
            columns={"predicted_ms": "per_token_ms_predicted_oos", "err_pct": "err_oos_pct"}
        ),
        on=join,
        how="left",
    )


def _fill_crossovers(
    group: GroupResult,
    predictions: pd.DataFrame | None,
    cell_reps,
    cell_keys: list[str],
    points: pd.DataFrame,
    gamma: int,
) -> list[float]:
    """Fills the group's crossover rows with their bootstrap interval and out-of-sample
    prediction; returns the out-of-sample errors of the crossovers measured inside the grid."""
    group_values = group.group_values()
    fixed = group_values | {"gamma": gamma, "clients": int(points["clients"].min())}
    cis = bootstrap.crossover_cis(cell_reps, cell_keys, fixed, sorted(points["rtt_ms"].unique()))
    predicted_oos = oos_crossovers(predictions, group_values, gamma)
    errors = []
    for name, row in group.crossovers.items():
        row.update({"ci_low": math.nan, "ci_high": math.nan, "ci_covers_grid": False, **cis.get(name, {})})
        row["predicted_rtt_ms_oos"] = predicted_oos.get(name, math.nan)
        row["oos_err_pct"] = crossover_err_pct(row["measured_rtt_ms"], row["predicted_rtt_ms_oos"])
        row["text"] = bootstrap.describe_crossover(row["measured_rtt_ms"], cis.get(name))
        if math.isfinite(row["measured_rtt_ms"]) and not row["ci_covers_grid"]:
            errors.append(row["oos_err_pct"])
    return errors


def _out_of_sample_evidence(
    out: Path, predictions: pd.DataFrame | None, points: pd.DataFrame, oos: pd.DataFrame, crossover_errs: list[float]
) -> dict:
    calibration = points["calibration"]
    errors, drift = oos["err_pct"].abs(), oos["compute_drift_pct"].abs().dropna()
    return {
        "available": predictions is not None,
        "what": "measured per-token latency (median over the non-calibration repeats of each cell's per-point "
        "p50) against the prediction written to predictions.csv from the calibration points alone, "
        "before any of them ran; one-client points; calibration points excluded",
        "latency_err_p50_pct": float(errors.median()) if len(errors) else math.nan,
        "latency_err_max_pct": float(errors.max()) if len(errors) else math.nan,
        "cells": int(len(errors)),
        "compute_drift_p50_pct": float(drift.median()) if len(drift) else math.nan,
        "compute_drift_max_pct": float(drift.max()) if len(drift) else math.nan,
        "compute_drift_what": "the same cells' server compute per pass against their mode's calibration "
        "point (points.csv compute_drift_pct): how far the machine moved after the "
        "prediction was written; an error of that size is the machine's, not the model's",
        "crossover_err_max_pct": max(crossover_errs) if crossover_errs else math.nan,
        "calibration_points": sorted(
            points.loc[calibration, "mode"].astype(str) + "@" + points.loc[calibration, "rtt_ms"].map("{:g} ms".format)
        ),
        "calibration": _read_calibration(out),
    }


def _in_sample_evidence(points: pd.DataFrame) -> dict:
    in_sample = points.loc[points["clients"] == points["clients"].min(), "latency_err_pct"].abs()
    return {
        "what": "IN-SAMPLE: the closed form with parameters fitted from all rounds, including the ones "
        "compared with (per_token_ms_predicted, latency_err_pct in points.csv)",
        "latency_err_p50_pct": float(in_sample.median()) if len(in_sample) else math.nan,
        "latency_err_max_pct": float(in_sample.max()) if len(in_sample) else math.nan,
    }


def add_point_conditions(out: Path, points: pd.DataFrame, sweep: dict) -> tuple[pd.DataFrame, dict]:
    """points.csv columns from each point's done.json: when it started and what the machine did
    meanwhile (orchestrator/common/cpus.py: busy and steal shares, load, contended); and the summary's
    CPU section (pinning as recorded in sweep.json, how many points ran under contention)."""
    rows = []
    for path in sorted((Path(out) / "points").glob("*/done.json")):
        done = json.loads(path.read_text())
        cpu = done.get("cpu") or {}
        rows.append(
            {
                **{k: done.get(k) for k in point_keys(points) if k in done},
                "measured_started_s": done.get("started_s", math.nan),
                **{k: cpu.get(k, math.nan) for k in ("cpu_busy_pct", "cpu_steal_pct", "load_avg_1m")},
                "contended": cpu.get("contended", math.nan),
            }
        )
    keys = [k for k in point_keys(points) if rows and k in rows[0]]
    if rows and keys:
        frame = pd.DataFrame(rows)
        for key in keys:
            frame[key] = frame[key].astype(points[key].dtype)
        points = points.merge(frame, on=keys, how="left")
    contended = points["contended"] if "contended" in points else pd.Series([], dtype=object)
    return points, {
        "pinning": sweep.get("cpu_pinning", {"pinned": False, "reason": "not recorded (older sweep)"}),
        "points_contended": int((contended == True).sum()),  # noqa: E712 - NaN is neither
        "points_recorded": int(contended.notna().sum()),
        "contended_when": "1-minute load above the CPU count, or more than "
        f"{cpus.STEAL_LIMIT_PCT:g}% of CPU time stolen, while the point ran",
    }


def _read_calibration(out: Path) -> dict:
    path = Path(out) / CALIBRATION
    return json.loads(path.read_text()) if path.exists() else {}
