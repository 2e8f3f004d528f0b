"""From traces to conclusions: per-point statistics, fitted parameters, crossovers, predictions.

Pure functions over pandas frames; the CLI does the reading and writing.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd import latency_model as lm

POINT_KEYS = ["mode", "rtt_ms", "gamma", "clients", "repeat"]
CROSSOVERS = {  # name: (mode that wins at low RTT, reference it is compared with)
    "sync_vs_ar": ("sync", "ar"),
    "pipelined_vs_colocated": ("pipelined", "colocated"),
}


def fit_alpha(rounds: pd.DataFrame) -> float:
    """Pooled maximum-likelihood alpha over live rounds: accepted successes, one failure per
    round that did not accept everything."""
    live = rounds[~rounds["stale"].astype(bool)] if "stale" in rounds else rounds
    accepted = live["accepted"].sum()
    failures = (live["accepted"] < live["proposed"]).sum()
    return float(accepted / (accepted + failures)) if accepted + failures else math.nan


def fit_params(rounds: pd.DataFrame, fallback: dict) -> tuple[dict, dict]:
    """t_draft_edge_s, t_draft_server_s, t_verify_s[gamma] and t_ar_s from the round timings
    of a network run (medians); where a column or mode is missing, the fallback's value.
    Returns (params, where each value came from)."""
    params = {k: (dict(v) if isinstance(v, dict) else v) for k, v in fallback.items()}
    source = {k: "assumed (profile or in-process measurement)" for k in params}
    if rounds.empty or "server_compute_s" not in rounds:
        return params, source
    live = rounds[~rounds["stale"].astype(bool)]
    edge = live[live["mode"].isin(["sync", "pipelined"]) & live["t_draft_end_s"].notna()]
    sync = edge[edge["mode"] == "sync"]
    if len(sync):
        params["t_draft_edge_s"] = float(((sync.t_draft_end_s - sync.t_draft_start_s) / sync.proposed).median())
        source["t_draft_edge_s"] = f"fitted: median draft time per token over {len(sync)} sync rounds"
    verify = edge[edge["server_compute_s"].notna()]
    for gamma, group in verify.groupby("gamma"):
        params["t_verify_s"][int(gamma)] = float(group["server_compute_s"].median())
    if len(verify):
        source["t_verify_s"] = f"fitted: median server compute over {len(verify)} DSD rounds"
    ar = live[(live["mode"] == "ar") & live["server_compute_s"].notna()]
    if len(ar):
        params["t_ar_s"] = float(ar["server_compute_s"].median())
        source["t_ar_s"] = f"fitted: median server compute over {len(ar)} AR steps"
    co = live[(live["mode"] == "colocated") & live["server_compute_s"].notna()]
    if len(co):
        per_round = co.groupby("gamma")["server_compute_s"].median()
        estimates = [(per_round[g] - params["t_verify_s"].get(int(g), 0.0)) / g for g in per_round.index]
        params["t_draft_server_s"] = float(max(np.median(estimates), 0.0))
        source["t_draft_server_s"] = "fitted: (co-located round compute - t_verify) / gamma, median"
    return params, source


def point_table(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per point: latency statistics over its requests, measured alpha and throughput."""
    rows = []
    # One pass over the rounds (there are many more rounds than points).
    rounds_by_point = dict(iter(rounds.groupby(POINT_KEYS, sort=False))) if len(rounds) else {}
    for key, group in requests.groupby(POINT_KEYS, sort=True):
        point = dict(zip(POINT_KEYS, key))
        per_token_ms = 1e3 * group["steady_per_token_s"]
        point_rounds = rounds_by_point.get(key, rounds.iloc[0:0])
        rows.append({
            **point,
            "requests": len(group),
            "rtt_measured_ms": group["rtt_measured_ms"].median(),
            "alpha_measured": fit_alpha(point_rounds) if len(point_rounds) else math.nan,
            "tokens_per_round": (point_rounds.loc[~point_rounds["stale"].astype(bool), "emitted"].mean()
                                 if len(point_rounds) else math.nan),
            "per_token_ms_mean": per_token_ms.mean(),
            "per_token_ms_p50": per_token_ms.quantile(0.5),
            "per_token_ms_p99": per_token_ms.quantile(0.99),
            "ttft_ms_p50": 1e3 * group["ttft_s"].quantile(0.5),
            "throughput_tok_s": group["tokens"].sum() / group["wall_s"].sum() * point["clients"],
            "tok_s_per_client": group["tokens"].sum() / group["wall_s"].sum(),
        })
    return pd.DataFrame(rows)


def predict_per_token_s(mode: str, rtt_s: float, gamma: int, alpha: float, params: dict) -> float:
    t_v = params["t_verify_s"][gamma]
    if mode == "ar":
        return params["t_ar_s"]
    if mode == "colocated":
        return lm.per_token_colocated_s(alpha, gamma, params["t_draft_server_s"], t_v)
    if mode == "sync":
        return lm.per_token_sync_dsd_s(alpha, gamma, params["t_draft_edge_s"], t_v, rtt_s)
    if mode == "pipelined":
        return lm.per_token_pipelined_dsd_s(alpha, gamma, params["t_draft_edge_s"], t_v, rtt_s)
    raise ValueError(f"unknown mode {mode!r}")


def add_predictions(points: pd.DataFrame, alpha: float, params: dict) -> pd.DataFrame:
    points = points.copy()
    points["per_token_ms_predicted"] = [
        1e3 * predict_per_token_s(row.mode, row.rtt_ms / 1e3, int(row.gamma), alpha, params)
        for row in points.itertuples()]
    points["latency_err_pct"] = 100 * (points["per_token_ms_p50"] / points["per_token_ms_predicted"] - 1)
    return points


def crossing_rtt_ms(rtt_ms: np.ndarray, diff_ms: np.ndarray) -> float:
    """The RTT where diff (mode minus reference) first turns positive, by linear interpolation.
    -inf if the mode already loses at the smallest RTT, +inf if it never loses in the grid."""
    order = np.argsort(rtt_ms)
    rtt_ms, diff_ms = np.asarray(rtt_ms)[order], np.asarray(diff_ms)[order]
    if diff_ms[0] > 0:
        return -math.inf
    for i in range(1, len(rtt_ms)):
        if diff_ms[i] > 0:
            x0, x1, y0, y1 = rtt_ms[i - 1], rtt_ms[i], diff_ms[i - 1], diff_ms[i]
            return float(x0 + (x1 - x0) * (-y0) / (y1 - y0))
    return math.inf


def measured_crossovers(points: pd.DataFrame, gamma: int, clients: int = 1) -> dict:
    """Per crossover: the median-of-repeats crossing and the range over repeats."""
    result = {}
    subset = points[(points.gamma == gamma) | (points["mode"] == "ar")]
    subset = subset[subset.clients == clients]
    for name, (mode, reference) in CROSSOVERS.items():
        ours, ref = subset[subset["mode"] == mode], subset[subset["mode"] == reference]
        if ours.empty or ref.empty:
            continue
        per_repeat = []
        for repeat, group in ours.groupby("repeat"):
            ref_rep = ref[ref.repeat == repeat].set_index("rtt_ms")["per_token_ms_p50"]
            mine = group.set_index("rtt_ms")["per_token_ms_p50"]
            common = mine.index.intersection(ref_rep.index)
            if len(common) >= 2:
                per_repeat.append(crossing_rtt_ms(common.values, (mine[common] - ref_rep[common]).values))
        med_ours = ours.groupby("rtt_ms")["per_token_ms_p50"].median()
        med_ref = ref.groupby("rtt_ms")["per_token_ms_p50"].median()
        common = med_ours.index.intersection(med_ref.index)
        if len(common) < 2:
            continue
        result[name] = {
            "rtt_ms": crossing_rtt_ms(common.values, (med_ours[common] - med_ref[common]).values),
            "rtt_ms_min": min(per_repeat) if per_repeat else math.nan,
            "rtt_ms_max": max(per_repeat) if per_repeat else math.nan,
        }
    return result


def predicted_crossovers(gamma: int, alpha: float, params: dict) -> dict:
    t_v = params["t_verify_s"][gamma]
    return {
        "sync_vs_ar": {"rtt_ms": 1e3 * lm.sync_dsd_beats_ar_rtt_s(
            alpha, gamma, params["t_draft_edge_s"], t_v, params["t_ar_s"])},
        "pipelined_vs_colocated": {"rtt_ms": 1e3 * lm.pipelined_beats_colocated_rtt_s(
            alpha, gamma, params["t_draft_edge_s"], params["t_draft_server_s"], t_v)},
    }
