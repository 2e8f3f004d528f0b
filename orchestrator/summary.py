"""`dsdbed analyze`: read a sweep folder, write points.csv, summary.json and the plots its data
supports (latency vs RTT, the gain window over alpha and RTT, capacity vs clients)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsd.modes import AR, PIPELINED, SYNC, edge_modes, speculative_modes
from dsd.times import ComputeTimes
from orchestrator import analysis, bootstrap, capacity, cpus, gamma_opt, link_timeline, paper, plots
from orchestrator import link_rows, wire_prediction
from orchestrator.predictions import (CALIBRATION, add_compute_drift, add_out_of_sample, crossover_err_pct,
                                      oos_cells, oos_crossovers, read_predictions)


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
    except (FileNotFoundError, pd.errors.EmptyDataError):     # merge writes no columns for none
        return pd.DataFrame()


def assumed_params(sweep: dict, profile: str) -> ComputeTimes:
    """The compute times the sweep ran with (profile, or measured in-process before it)."""
    return ComputeTimes.from_dict(sweep.get("costs_by_profile", {}).get(profile) or sweep["costs"])


@dataclass(frozen=True)
class ProfileFit:
    """A profile's compute times: as the sweep ran with them (assumed), fitted from its rounds'
    compute (compute: what a saturated server's capacity depends on), and as the client sees them
    (params: compute plus the harness's measured per-round overhead; what the predictions use;
    = compute on the sim launcher)."""
    assumed: ComputeTimes
    compute: ComputeTimes
    compute_source: dict
    params: ComputeTimes
    params_source: dict
    overhead_ms: dict


def fit_profiles(sweep: dict, requests: pd.DataFrame, rounds: pd.DataFrame) -> dict[str, ProfileFit]:
    """Compute times are a property of the hardware: fitted once per profile over all its rounds."""
    fits = {}
    for profile in sorted(set(requests["profile"])) if "profile" in requests else [_single_profile(sweep)]:
        profile_rounds = rounds[rounds["profile"] == profile] if "profile" in rounds else rounds
        if len(profile_rounds) and (profile_rounds["clients"] == 1).any():
            # One client alone: clients sharing a server add queueing, which is not a parameter.
            profile_rounds = profile_rounds[profile_rounds["clients"] == 1]
        assumed = assumed_params(sweep, profile)
        compute, compute_source = analysis.fit_params(profile_rounds, assumed)
        fits[profile] = ProfileFit(assumed, compute, compute_source,
                                   *analysis.fit_effective_params(profile_rounds, compute))
    return fits


def _single_profile(sweep: dict) -> str:
    profile = sweep["experiment"]["profile"]
    return profile if isinstance(profile, str) else profile[0]


def _groups(frame: pd.DataFrame, keys: list[str]):
    """(values, rows) per group of `keys`; the whole frame when the sweep varies none of them."""
    if not keys:
        yield (), frame
        return
    for values, rows in frame.groupby(keys):
        yield (values if isinstance(values, tuple) else (values,)), rows


def _select(frame: pd.DataFrame, keys: list[str], values: tuple) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = pd.Series(True, index=frame.index)
    for key, value in zip(keys, values):
        mask &= frame[key] == value
    return frame[mask]


def analyze_sweep(out: Path) -> dict:
    out = Path(out)
    sweep, requests, rounds, links = read_sweep(out)
    gamma = int(sweep["experiment"]["gamma"][0])
    group_keys = analysis.varied_group_keys(requests)
    fits = fit_profiles(sweep, requests, rounds)
    tables, groups = [], []
    for values, group_requests in _groups(requests, group_keys):
        group = dict(zip(group_keys, values))
        group_rounds, group_links = _select(rounds, group_keys, values), _select(links, group_keys, values)
        points, group = analyze_group(sweep, group, group_requests, group_rounds, group_links, fits, gamma)
        tables.append(points)
        groups.append(group)
    points = analysis.add_speedups(pd.concat(tables, ignore_index=True))
    points, evidence = out_of_sample_and_intervals(out, requests, rounds, points, groups, gamma)
    cell_keys, cell_reps = evidence.pop("_cell_replicates")
    points, evidence["cpu"] = add_point_conditions(out, points, sweep)
    points.to_csv(out / "points.csv", index=False)
    summary = {**_summary_head(sweep, gamma, group_keys, groups, fits), **evidence}
    optimum = write_gamma_opt(out, sweep, points, summary["latency_cells"], cell_keys, cell_reps, groups, fits)
    if optimum:
        summary["gamma_opt"] = optimum
    params = {profile: fit.params for profile, fit in fits.items()}
    if len(params) > 1:
        summary["params_by_profile"] = {profile: times.to_dict() for profile, times in params.items()}
    compute = {profile: fit.compute for profile, fit in fits.items()}
    summary["plots"] = _plots(out, sweep, points, groups, params, compute, gamma, summary)
    summary["plots"] += _link_timeline_plot(out, sweep, requests, links)
    if optimum:
        summary["plots"].append(optimum["plot"])
    summary.update(_acceptance(out, sweep, requests, rounds, gamma, summary["plots"]))
    assumed = {profile: fit.assumed for profile, fit in fits.items()}
    summary["paper"] = {"crossovers": paper.crossover_rows(summary["groups"], assumed, gamma),
                        "capacity": paper.capacity_rows(summary.get("capacity", []), assumed, gamma,
                                                        groups[0]["profile"])}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def analyze_group(sweep: dict, group: dict, requests: pd.DataFrame, rounds: pd.DataFrame, links: pd.DataFrame,
                  fits: dict[str, ProfileFit], gamma: int) -> tuple[pd.DataFrame, dict]:
    """One group's points.csv rows (statistics, predictions at the measured and configured alpha)
    and its summary entry (alphas and crossovers; keys with _ are for the plots, not the JSON)."""
    profile = group.get("profile", _single_profile(sweep))
    fit = fits[profile]
    spec_rounds = rounds[rounds["mode"].isin(speculative_modes())] if len(rounds) else rounds
    alpha = analysis.fit_alpha(spec_rounds) if len(spec_rounds) else math.nan
    points = analysis.point_table(requests, rounds, links)
    points = link_rows.add_link_columns(points, links, analysis.point_keys(requests))
    points = analysis.add_predictions(points, alpha, fit.params)
    points = wire_prediction.add_wire_prediction(points, wire_prediction.experiment_vocab(sweep["experiment"]),
                                                 wire_prediction.experiment_features(sweep["experiment"]))
    points["per_token_ms_predicted_compute_only"] = analysis.add_predictions(
        points, alpha, fit.compute)["per_token_ms_predicted"]
    points["alpha_measured_group"] = alpha
    alpha_configured = configured_alpha(sweep["experiment"], group)
    points = add_configured_alpha(points, alpha_configured, fit.params)
    if "profile" not in points:
        points.insert(0, "profile", profile)
    measured = analysis.measured_crossovers(points, gamma)
    predicted = analysis.predicted_crossovers(gamma, alpha, fit.params)
    crossovers = _crossover_rows(measured, predicted, set(points["mode"]))
    if not math.isnan(alpha_configured):
        at_configured = analysis.predicted_crossovers(gamma, alpha_configured, fit.params)
        for name, row in crossovers.items():
            row["predicted_rtt_ms_at_configured_alpha"] = at_configured[name]["rtt_ms"]
    return points, {**group, "profile": profile, "alpha_measured": alpha, "alpha_configured": alpha_configured,
                    "crossovers": crossovers, "_measured": measured, "_predicted": predicted}


def _summary_head(sweep: dict, gamma: int, group_keys: list[str], groups: list[dict],
                  fits: dict[str, ProfileFit]) -> dict:
    """summary.json's first keys: what ran, and the first group's profile's fitted times."""
    main = fits[groups[0]["profile"]]
    return {"experiment": sweep["experiment"]["name"], "launcher": sweep["launcher"],
            "shaper_backend": sweep["shaper_backend"], "gamma": gamma, "group_keys": group_keys,
            "alpha_measured": groups[0]["alpha_measured"] if len(groups) == 1 else math.nan,
            "params": main.params.to_dict(), "params_source": main.params_source,
            "params_compute": main.compute.to_dict(), "params_compute_source": main.compute_source,
            "params_assumed": main.assumed.to_dict(), "harness_overhead_ms": main.overhead_ms,
            "capacity_factor_predicted": capacity.capacity_factor(gamma, main.compute),
            "prediction_alpha": PREDICTION_ALPHA,
            "crossovers": groups[0]["crossovers"] if len(groups) == 1 else {},
            "groups": [{k: v for k, v in g.items() if not k.startswith("_")} for g in groups]}


def _acceptance(out: Path, sweep: dict, requests: pd.DataFrame, rounds: pd.DataFrame, gamma: int,
                made: list[str]) -> dict:
    """The workload's acceptance and repetition: per-request alpha, accepted tokens per round
    beside i.i.d. acceptance (acceptance.png), distinct 4-grams of the outputs."""
    stats = plots.acceptance_histograms(rounds, gamma) if len(rounds) and "mode" in rounds else {}
    if not stats:
        return {}
    plots.plot_acceptance(stats, gamma, out / "acceptance.png",
                          f"{sweep['experiment']['name']}: acceptance over requests and rounds")
    made.append("acceptance.png")
    result = {"request_alpha_p10": float(np.percentile(stats["request_alpha"], 10)),
              "request_alpha_p50": float(np.percentile(stats["request_alpha"], 50)),
              "request_alpha_p90": float(np.percentile(stats["request_alpha"], 90)),
              "accepted_share": stats["accepted_share"], "accepted_share_iid": stats["geometric"]}
    if "distinct_4gram" in requests:
        result["distinct_4gram_p50"] = float(requests["distinct_4gram"].median())
    return {"acceptance": result}


PREDICTION_ALPHA = ("per_token_ms_predicted, predicted_rtt_ms and the plots use the measured alpha "
                    "(alpha_measured: pooled over the group's live rounds); *_at_configured_alpha use the "
                    "configured one (alpha_configured)")


def configured_alpha(experiment: dict, group: dict) -> float:
    """The alpha a group was configured with (synthetic backend); nan for a real model pair."""
    if experiment["backend"]["kind"] != "synthetic":
        return math.nan
    # a one-value alpha list is not a group key, but it is what ran (not the backend's default)
    alphas = experiment.get("alpha") or [experiment["backend"]["alpha"]]
    return float(group.get("alpha", alphas[0]))


def add_configured_alpha(points: pd.DataFrame, alpha_configured: float, params: ComputeTimes) -> pd.DataFrame:
    """alpha_configured beside alpha_measured, and the closed form at it beside the one at the
    measured alpha (per_token_ms_predicted)."""
    points = points.copy()
    points.insert(list(points.columns).index("alpha_measured"), "alpha_configured", alpha_configured)
    points["per_token_ms_predicted_at_configured_alpha"] = (
        math.nan if math.isnan(alpha_configured) else
        analysis.add_predictions(points, alpha_configured, params)["per_token_ms_predicted"])
    return points


def out_of_sample_and_intervals(out: Path, requests: pd.DataFrame, rounds: pd.DataFrame, points: pd.DataFrame,
                                groups: list[dict], gamma: int) -> tuple[pd.DataFrame, dict]:
    """The out-of-sample comparison with the predictions written before
    the measurements (orchestrator/predictions.py) and 95% bootstrap intervals
    (orchestrator/bootstrap.py). Adds points.csv columns, fills each group's crossovers with
    ci_low/ci_high and the out-of-sample prediction, and returns the summary's new keys."""
    predictions = read_predictions(out)
    points = add_compute_drift(add_out_of_sample(points, predictions))
    latencies = bootstrap.request_latencies(requests, rounds)
    point_keys = analysis.point_keys(latencies)
    points = _add_point_cis(points, latencies, point_keys)
    cell_keys = [k for k in point_keys if k != "repeat"]
    cells, cell_reps = bootstrap.cell_replicates(latencies, cell_keys)
    oos = oos_cells(points)
    cells = _cells_with_oos(bootstrap.latency_cis(cells, cell_reps, cell_keys), oos)
    oos_crossover_errs = [_fill_crossovers(group, predictions, cell_reps, cell_keys, points, gamma)
                          for group in groups]
    evidence = {
        "out_of_sample": _out_of_sample_evidence(out, predictions, points, oos,
                                                 [e for errs in oos_crossover_errs for e in errs]),
        "in_sample": _in_sample_evidence(points),
        "bootstrap": {"replicates": bootstrap.N_BOOT, "seed": bootstrap.SEED, "level": bootstrap.LEVEL,
                      "method": "percentile bootstrap over repeats (drawn jointly for all modes) then requests"},
        "latency_cells": cells.to_dict("records"),
        "_cell_replicates": (cell_keys, cell_reps),         # for the optimal gamma; not in the JSON
    }
    return points, evidence


def write_gamma_opt(out: Path, sweep: dict, points: pd.DataFrame, latency_cells: list[dict], cell_keys: list[str],
                    cell_reps: dict, groups: list[dict], fits: dict[str, ProfileFit]) -> dict:
    """gamma_opt.csv and gamma_opt.png (orchestrator/gamma_opt.py): per speculative mode, group and
    RTT the measured optimal gamma with its bootstrap set, beside the closed form's argmin. The
    summary's entry ({} where the sweep has fewer than two gammas or RTTs)."""
    # the analysis's cell statistic (bootstrap.cell_replicates), speculative modes only
    cells = pd.DataFrame(latency_cells, columns=cell_keys + ["per_token_ms"])
    cells = cells.loc[cells["mode"].isin(speculative_modes()), cell_keys + ["per_token_ms"]]
    measured = points[points["mode"].isin(speculative_modes())]
    if not gamma_opt.applies(cells):
        return {}
    predicted = measured.groupby(cell_keys, as_index=False).agg(
        per_token_ms_predicted_oos=("per_token_ms_predicted_oos", "first"),
        calibration=("calibration", "any"))
    calibration = _read_calibration(out)
    predictions = read_predictions(out)

    def oos_fit(row: dict):
        record = calibration.get(_calibration_group(predictions, row) or "all", {})
        if not record.get("predicted") or not math.isfinite(record.get("alpha", math.nan)):
            return None
        return record["alpha"], ComputeTimes.from_dict(record["params"])

    def insample_fit(row: dict):
        group = next((g for g in groups if all(g[k] == row[k] for k in analysis.GROUP_KEYS if k in g and k in row)),
                     groups[0])
        return (group["alpha_measured"], fits[group["profile"]].params) if math.isfinite(group["alpha_measured"]) \
            else None

    table = gamma_opt.gamma_opt_table(cells, cell_reps, cell_keys, predicted[cell_keys + ["per_token_ms_predicted_oos"]]
                                      if predicted["per_token_ms_predicted_oos"].notna().any() else None,
                                      {"oos": oos_fit, "insample": insample_fit})
    keys = [k for k in cell_keys if k != "gamma"]
    in_calibration = predicted.groupby(keys)["calibration"].any().rename("predicted_from_calibration_points")
    table = table.merge(in_calibration.reset_index(), on=keys, how="left")
    table.to_csv(out / "gamma_opt.csv", index=False)
    plots.plot_gamma_opt(table, out / "gamma_opt.png",
                         f"{sweep['experiment']['name']}: optimal gamma vs RTT (launcher={sweep['launcher']})",
                         sweep["launcher"])
    return {"what": gamma_opt.WHAT, "file": "gamma_opt.csv", "plot": "gamma_opt.png",
            "rows": table.to_dict("records")}


def _calibration_group(predictions: pd.DataFrame | None, row: dict) -> str | None:
    """The calibration record (calibration.json) of the group a gamma_opt row belongs to."""
    if predictions is None or "group" not in predictions:
        return None
    match = predictions
    for key in analysis.GROUP_KEYS:
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
    return cells.merge(oos[join + ["predicted_ms", "err_pct"]].rename(
        columns={"predicted_ms": "per_token_ms_predicted_oos", "err_pct": "err_oos_pct"}), on=join, how="left")


def _fill_crossovers(group: dict, predictions: pd.DataFrame | None, cell_reps, cell_keys: list[str],
                     points: pd.DataFrame, gamma: int) -> list[float]:
    """Fills the group's crossover rows with their bootstrap interval and out-of-sample
    prediction; returns the out-of-sample errors of the crossovers measured inside the grid."""
    group_values = {k: group[k] for k in analysis.GROUP_KEYS if k in group}
    fixed = group_values | {"gamma": gamma, "clients": int(points["clients"].min())}
    cis = bootstrap.crossover_cis(cell_reps, cell_keys, fixed, sorted(points["rtt_ms"].unique()))
    group["_cis"] = cis
    predicted_oos = oos_crossovers(predictions, group_values, gamma)
    errors = []
    for name, row in group["crossovers"].items():
        row.update({"ci_low": math.nan, "ci_high": math.nan, "ci_covers_grid": False, **cis.get(name, {})})
        row["predicted_rtt_ms_oos"] = predicted_oos.get(name, math.nan)
        row["oos_err_pct"] = crossover_err_pct(row["measured_rtt_ms"], row["predicted_rtt_ms_oos"])
        row["text"] = bootstrap.describe_crossover(row["measured_rtt_ms"], cis.get(name))
        if math.isfinite(row["measured_rtt_ms"]) and not row["ci_covers_grid"]:
            errors.append(row["oos_err_pct"])
    return errors


def _out_of_sample_evidence(out: Path, predictions: pd.DataFrame | None, points: pd.DataFrame,
                            oos: pd.DataFrame, crossover_errs: list[float]) -> dict:
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
        "calibration_points": sorted(points.loc[calibration, "mode"].astype(str) + "@" +
                                     points.loc[calibration, "rtt_ms"].map("{:g} ms".format)),
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


def _calibration_fit(summary: dict) -> dict | None:
    """A one-group sweep's calibration alpha and parameters (None where nothing was predicted)."""
    record = summary.get("out_of_sample", {}).get("calibration", {})
    fit = next(iter(record.values())) if len(record) == 1 else None
    if not fit or not fit.get("predicted"):
        return None
    return {"alpha": fit["alpha"], "params": ComputeTimes.from_dict(fit["params"])}


def add_point_conditions(out: Path, points: pd.DataFrame, sweep: dict) -> tuple[pd.DataFrame, dict]:
    """points.csv columns from each point's done.json: when it started and what the machine did
    meanwhile (orchestrator/cpus.py: busy and steal shares, load, contended); and the summary's
    CPU section (pinning as recorded in sweep.json, how many points ran under contention)."""
    rows = []
    for path in sorted((Path(out) / "points").glob("*/done.json")):
        done = json.loads(path.read_text())
        cpu = done.get("cpu") or {}
        rows.append({**{k: done.get(k) for k in analysis.point_keys(points) if k in done},
                     "measured_started_s": done.get("started_s", math.nan),
                     **{k: cpu.get(k, math.nan) for k in ("cpu_busy_pct", "cpu_steal_pct", "load_avg_1m")},
                     "contended": cpu.get("contended", math.nan)})
    keys = [k for k in analysis.point_keys(points) if rows and k in rows[0]]
    if rows and keys:
        frame = pd.DataFrame(rows)
        for key in keys:
            frame[key] = frame[key].astype(points[key].dtype)
        points = points.merge(frame, on=keys, how="left")
    contended = points["contended"] if "contended" in points else pd.Series([], dtype=object)
    return points, {"pinning": sweep.get("cpu_pinning", {"pinned": False, "reason": "not recorded (older sweep)"}),
                    "points_contended": int((contended == True).sum()),  # noqa: E712 - NaN is neither
                    "points_recorded": int(contended.notna().sum()),
                    "contended_when": "1-minute load above the CPU count, or more than "
                                      f"{cpus.STEAL_LIMIT_PCT:g}% of CPU time stolen, while the point ran"}


def _read_calibration(out: Path) -> dict:
    path = Path(out) / CALIBRATION
    return json.loads(path.read_text()) if path.exists() else {}


def _crossover_rows(measured: dict, predicted: dict, modes: set) -> dict:
    """Crossovers between modes the sweep ran."""
    return {name: {"measured_rtt_ms": measured.get(name, {}).get("rtt_ms", math.nan),
                   "measured_rtt_ms_min": measured.get(name, {}).get("rtt_ms_min", math.nan),
                   "measured_rtt_ms_max": measured.get(name, {}).get("rtt_ms_max", math.nan),
                   "predicted_rtt_ms": predicted[name]["rtt_ms"]}
            for name, pair in analysis.CROSSOVERS.items() if set(pair) <= modes}


def _link_timeline_plot(out: Path, sweep: dict, requests: pd.DataFrame, links: pd.DataFrame) -> list[str]:
    """With a link schedule (or a replayed trace): the link's RTT and every request's per-token
    latency over the run's time (orchestrator/link_timeline.py)."""
    experiment = sweep["experiment"]
    link_ms = link_timeline.schedule_rtt_ms(experiment)
    times = link_timeline.request_times(requests, links, int(experiment.get("warmup_requests", 0))) \
        if link_ms else pd.DataFrame()
    if times.empty:
        return []
    plots.plot_latency_over_link(link_ms, times, out / "latency_over_link.png",
                                 f"{experiment['name']}: the link and each request's latency "
                                 f"(launcher={sweep['launcher']})", sweep["launcher"])
    return ["latency_over_link.png"]


def _plots(out: Path, sweep: dict, points: pd.DataFrame, groups: list[dict], params: dict[str, ComputeTimes],
           compute: dict[str, ComputeTimes], gamma: int, summary: dict) -> list[str]:
    """Whichever plots the sweep's data supports; fills the summary's gain window and capacity."""
    name, launcher, made = sweep["experiment"]["name"], sweep["launcher"], []
    calibration = _calibration_fit(summary) if len(groups) == 1 else None
    if calibration is not None and points.rtt_ms.nunique() >= 2:
        g = groups[0]
        cells = pd.DataFrame(summary["latency_cells"])
        cells = cells[cells.clients == cells.clients.min()]
        plots.plot_latency_vs_rtt_oos(
            cells, gamma, calibration, {"alpha": g["alpha_measured"], "params": params[g["profile"]]},
            g["crossovers"], out / "latency_vs_rtt.png",
            f"{name}: gamma={gamma}, alpha={calibration['alpha']:.2f} (calibration), launcher={launcher}", launcher)
        made.append("latency_vs_rtt.png")
    elif len(groups) == 1 and points.rtt_ms.nunique() >= 2:
        g = groups[0]
        plots.plot_latency_vs_rtt(points[points.clients == points.clients.min()], gamma, g["alpha_measured"], params[g["profile"]], g["_measured"],
                                  g["_predicted"], out / "latency_vs_rtt.png",
                                  f"{name}: gamma={gamma}, alpha={g['alpha_measured']:.2f}, launcher={launcher}",
                                  launcher)
        made.append("latency_vs_rtt.png")
    dsd_modes = tuple(m for m in (SYNC, PIPELINED) if m in set(points["mode"]))
    if "alpha" in points and AR in set(points["mode"]) and dsd_modes:
        window = analysis.gain_window_table(points, gamma, params, dsd_modes)
        window.to_csv(out / "gain_window.csv", index=False)
        summary["gain_window"] = window.to_dict("records")
        plots.plot_gain_window(points, groups, params, gamma, dsd_modes, out / "gain_window.png",
                               f"{name}: where DSD beats cloud AR (gamma={gamma}, launcher={launcher})", launcher)
        made.append("gain_window.png")
    if points.clients.nunique() >= 2:
        table = capacity.capacity_table(points, analysis.GROUP_KEYS)
        summary["capacity"] = []
        subset_keys = [k for k in table.columns if k not in ("mode", "clients", "tok_s_per_client")]
        for values, rows in _groups(table, subset_keys):
            subset = dict(zip(subset_keys, values))
            subset_params = compute[subset.get("profile", groups[0]["profile"])]
            factor = {"ratio_predicted": capacity.capacity_factor(int(subset["gamma"]), subset_params)}
            for mode in edge_modes():
                ratio = capacity.capacity_ratio(rows, mode)
                if ratio:
                    interval = bootstrap.capacity_ratio_interval(_select(points, subset_keys, values), mode)
                    summary["capacity"].append({**subset, **ratio, **interval, **factor})
        g = groups[0]
        rtt_s = float(points.rtt_ms.iloc[0]) / 1e3

        def predicted(mode: str, clients: float) -> float:
            return capacity.predicted_tok_s_per_client(mode, clients, g["alpha_measured"], gamma, rtt_s,
                                                       compute[g["profile"]])

        plots.plot_capacity(table, summary["capacity"], out / "capacity_vs_clients.png",
                            f"{name}: per-client token rate, saturated server (launcher={launcher})",
                            predicted if len(groups) == 1 and points.rtt_ms.nunique() == 1 else None)
        made.append("capacity_vs_clients.png")
    return made
