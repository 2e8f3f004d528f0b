"""`dsdbed analyze`: read a sweep folder, write points.csv, summary.json and the plots its data
supports (latency vs RTT, the gain window over alpha and RTT, capacity vs clients)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dsd import latency_model as lm
from orchestrator import analysis, capacity, plots


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


def assumed_params(sweep: dict, profile: str) -> dict:
    """The compute times the sweep ran with (profile, or measured in-process before it)."""
    costs = sweep.get("costs_by_profile", {}).get(profile) or sweep["costs"]
    return {"t_draft_edge_s": costs["t_draft_edge_s"], "t_draft_server_s": costs["t_draft_server_s"],
            "t_ar_s": costs["t_ar_s"], "t_verify_s": {int(k): v for k, v in costs["t_verify_s"].items()}}


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
    experiment = sweep["experiment"]
    gamma = int(experiment["gamma"][0])
    group_keys = analysis.varied_group_keys(requests)
    single_profile = experiment["profile"] if isinstance(experiment["profile"], str) else experiment["profile"][0]

    # Compute times are a property of the hardware: fitted once per profile over all its rounds.
    # params: what the predictions use, compute plus the harness's measured per-round overhead
    # (= compute on the sim launcher); compute: the server's and edge's compute alone, which
    # is what a saturated server's capacity depends on.
    params, sources, assumed, compute, compute_sources, overhead = {}, {}, {}, {}, {}, {}
    for profile in sorted(set(requests["profile"])) if "profile" in requests else [single_profile]:
        profile_rounds = rounds[rounds["profile"] == profile] if "profile" in rounds else rounds
        if len(profile_rounds) and (profile_rounds["clients"] == 1).any():
            # One client alone: clients sharing a server add queueing, which is not a parameter.
            profile_rounds = profile_rounds[profile_rounds["clients"] == 1]
        assumed[profile] = assumed_params(sweep, profile)
        compute[profile], compute_sources[profile] = analysis.fit_params(profile_rounds, assumed[profile])
        params[profile], sources[profile], overhead[profile] = analysis.fit_effective_params(
            profile_rounds, compute[profile])

    tables, groups = [], []
    for values, group_requests in _groups(requests, group_keys):
        group = dict(zip(group_keys, values))
        profile = group.get("profile", single_profile)
        group_rounds = _select(rounds, group_keys, values)
        spec_rounds = group_rounds[group_rounds["mode"] != "ar"] if len(group_rounds) else group_rounds
        alpha = analysis.fit_alpha(spec_rounds) if len(spec_rounds) else math.nan
        points = analysis.point_table(group_requests, group_rounds, _select(links, group_keys, values))
        points = analysis.add_predictions(points, alpha, params[profile])
        points["per_token_ms_predicted_compute_only"] = analysis.add_predictions(
            points, alpha, compute[profile])["per_token_ms_predicted"]
        points["alpha_fitted"] = alpha
        if "profile" not in points:
            points.insert(0, "profile", profile)
        tables.append(points)
        measured = analysis.measured_crossovers(points, gamma)
        predicted = analysis.predicted_crossovers(gamma, alpha, params[profile])
        groups.append({**group, "profile": profile, "alpha_fitted": alpha,
                       "crossovers": _crossover_rows(measured, predicted, set(points["mode"])),
                       "_measured": measured, "_predicted": predicted})
    points = analysis.add_speedups(pd.concat(tables, ignore_index=True))
    points.to_csv(out / "points.csv", index=False)

    main = groups[0]["profile"]
    main_params, main_compute = params[main], compute[main]
    summary = {"experiment": experiment["name"], "launcher": sweep["launcher"],
               "shaper_backend": sweep["shaper_backend"], "gamma": gamma, "group_keys": group_keys,
               "alpha_fitted": groups[0]["alpha_fitted"] if len(groups) == 1 else math.nan,
               "params": main_params, "params_source": sources[main],
               "params_compute": main_compute, "params_compute_source": compute_sources[main],
               "params_assumed": assumed[main], "harness_overhead_ms": overhead[main],
               "capacity_factor_predicted": capacity_factor(gamma, main_compute),
               "crossovers": groups[0]["crossovers"] if len(groups) == 1 else {},
               "groups": [{k: v for k, v in g.items() if not k.startswith("_")} for g in groups]}
    if len(params) > 1:
        summary["params_by_profile"] = params
    summary["plots"] = _plots(out, sweep, points, groups, params, compute, gamma, summary)
    summary.update(_acceptance(out, sweep, requests, rounds, gamma, summary["plots"]))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


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


def capacity_factor(gamma: int, params: dict) -> float:
    """REFERENCE.md claim 4 from a parameter set: the server's own draft steps are what DSD takes off it."""
    return lm.capacity_factor(gamma, params["t_draft_server_s"], params["t_verify_s"][gamma])


def _crossover_rows(measured: dict, predicted: dict, modes: set) -> dict:
    """Crossovers between modes the sweep ran."""
    return {name: {"measured_rtt_ms": measured.get(name, {}).get("rtt_ms", math.nan),
                   "measured_rtt_ms_min": measured.get(name, {}).get("rtt_ms_min", math.nan),
                   "measured_rtt_ms_max": measured.get(name, {}).get("rtt_ms_max", math.nan),
                   "predicted_rtt_ms": predicted[name]["rtt_ms"]}
            for name, pair in analysis.CROSSOVERS.items() if set(pair) <= modes}


def _plots(out: Path, sweep: dict, points: pd.DataFrame, groups: list[dict], params: dict, compute: dict,
           gamma: int, summary: dict) -> list[str]:
    """Whichever plots the sweep's data supports; fills the summary's gain window and capacity."""
    name, launcher, made = sweep["experiment"]["name"], sweep["launcher"], []
    if len(groups) == 1 and points.rtt_ms.nunique() >= 2:
        g = groups[0]
        plots.plot_latency_vs_rtt(points[points.clients == points.clients.min()], gamma, g["alpha_fitted"], params[g["profile"]], g["_measured"],
                                  g["_predicted"], out / "latency_vs_rtt.png",
                                  f"{name}: gamma={gamma}, alpha={g['alpha_fitted']:.2f}, launcher={launcher}",
                                  launcher)
        made.append("latency_vs_rtt.png")
    dsd_modes = tuple(m for m in ("sync", "pipelined") if m in set(points["mode"]))
    if "alpha" in points and "ar" in set(points["mode"]) and dsd_modes:
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
            for mode in ("sync", "pipelined"):
                ratio = capacity.capacity_ratio(rows, mode)
                if ratio:
                    summary["capacity"].append({**subset, **ratio, "ratio_predicted":
                                                capacity_factor(int(subset["gamma"]), subset_params)})
        g = groups[0]
        rtt_s = float(points.rtt_ms.iloc[0]) / 1e3

        def predicted(mode: str, clients: float) -> float:
            return capacity.predicted_tok_s_per_client(mode, clients, g["alpha_fitted"], gamma, rtt_s,
                                                       compute[g["profile"]])

        plots.plot_capacity(table, summary["capacity"], out / "capacity_vs_clients.png",
                            f"{name}: per-client token rate, saturated server (launcher={launcher})",
                            predicted if len(groups) == 1 and points.rtt_ms.nunique() == 1 else None)
        made.append("capacity_vs_clients.png")
    return made
