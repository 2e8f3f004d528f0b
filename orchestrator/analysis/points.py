"""From traces to conclusions: per-point statistics, crossovers, predictions (the parameters fitted
from the rounds: fits.py).

Pure functions over pandas frames; the CLI does the reading and writing.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd.analytic import latency_model as lm
from dsd.modes import (
    AR,
    CROSSOVERS,
    PIPELINED,
    SYNC,
    edge_modes,
    gammaless_modes,
    predict_per_token_s,
)
from dsd.costs.compute_times import ComputeTimes, steady_per_token_s
from netem.measure import percentile
from orchestrator.analysis import capacity
from orchestrator.records import request_stats
from orchestrator.analysis.fits import cache_hit_rate, cached_rounds, fit_alpha
from orchestrator.analysis.rounds import rounds_with_receipts

POINT_KEYS = ["mode", "rtt_ms", "gamma", "clients", "repeat"]
# Point keys only in sweeps that vary them; the link's keys (orchestrator/links/keys.py) make groups of
# their own, each with its crossovers over RTT.
GROUP_KEYS = [
    "profile",
    "alpha",
    "jitter_ms",
    "delay_distribution",
    "correlation_pct",
    "loss_pct",
    "rate_mbit",
    "delay_up_ms",
]
# Every sweep's rows carry its sampling setting (orchestrator/spec/sampling.py); a swept one is a group.
SAMPLING_KEYS = ["temperature", "top_k", "top_p", "sampling_seed"]
GROUP_KEYS += SAMPLING_KEYS


def varied_group_keys(frame: pd.DataFrame) -> list[str]:
    """The group keys of a sweep: profile and alpha where present, sampling keys where they vary."""
    return [k for k in GROUP_KEYS if k in frame.columns and (k not in SAMPLING_KEYS or frame[k].nunique() > 1)]


def point_keys(frame: pd.DataFrame) -> list[str]:
    return [k for k in GROUP_KEYS if k in frame.columns] + POINT_KEYS


def point_table(requests: pd.DataFrame, rounds: pd.DataFrame, links: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per point: latency statistics over its requests, measured alpha, t_draft, t_verify
    and RTT (the edge's probe; the link's own measurement where links.csv has one), throughput."""
    rows = []
    keys = point_keys(requests)
    # One pass over the rounds (there are many more rounds than points).
    rounds_by_point = dict(iter(rounds.groupby(keys, sort=False))) if len(rounds) else {}
    link_rtt_ms = _link_rtt_ms(links, keys)
    for key, group in requests.groupby(keys, sort=True):
        point = dict(zip(keys, key))
        point_rounds = rounds_by_point.get(key, rounds.iloc[0:0])
        per_token_ms = 1e3 * requests_steady_per_token_s(group, point_rounds)
        rows.append(
            {
                **point,
                "requests": len(group),
                "rtt_configured_ms": point["rtt_ms"],
                # the edge's RTT probe; NaN on the sim launcher, whose link is only configured
                "rtt_measured_ms": group["rtt_probe_ms"].median() if "rtt_probe_ms" in group else math.nan,
                "rtt_link_measured_ms": link_rtt_ms.get(key, math.nan),
                # what delayed the point's link (kernel-netem, nfqueue, app-delay, none): every row says
                **({"shaper": ",".join(sorted(set(group["shaper"].astype(str))))} if "shaper" in group else {}),
                "alpha_measured": fit_alpha(point_rounds) if len(point_rounds) else math.nan,
                "tokens_per_round": (
                    point_rounds.loc[~point_rounds["stale"].astype(bool), "emitted"].mean()
                    if len(point_rounds)
                    else math.nan
                ),
                **cache_figures(point_rounds),
                "per_token_ms_mean": per_token_ms.mean(),
                "per_token_ms_p50": per_token_ms.quantile(0.5),
                "per_token_ms_p99": per_token_ms.quantile(0.99),
                "ttft_ms_p50": 1e3 * group["ttft_s"].quantile(0.5),
                **user_latency(group, point_rounds),
                "throughput_tok_s": group["tokens"].sum() / group["wall_s"].sum() * point["clients"],
                "tok_s_per_client": group["tokens"].sum() / group["wall_s"].sum(),
                "tok_s_per_client_overlap": capacity.overlap_tok_s_per_client(point_rounds),
                **measured_compute_ms(point_rounds),
            }
        )
    return pd.DataFrame(rows)


def cache_figures(rounds: pd.DataFrame) -> dict:
    """A cached point's hit rate (complete hits), its hits part-drafted by the verdict, the edge's
    own estimate of its hit rate, and its median branches per block; {} for other modes."""
    cached = cached_rounds(rounds)
    if cached.empty:
        return {}
    hit = cached["cache_hit"].astype(bool)
    return {
        "cache_hit_rate": cache_hit_rate(rounds),
        "cache_partial_hit_rate": float((hit & (cached["cache_depth"] < cached["proposed"])).mean()),
        "cache_hit_predicted": float(cached["cache_hit_predicted"].mean()),
        "cache_branches_p50": float(cached["cache_branches"].median()),
    }


def user_latency(requests: pd.DataFrame, rounds: pd.DataFrame) -> dict:
    """Latency as the point's users feel it: per-token latency p50/p99 over every token of its
    requests together (request_stats.token_latencies_ms: a stall's tokens are a few among many,
    so it moves the p99, not the p50), time to first token p99, the longest gap between arrivals in
    any request, and how many requests were given up at their deadline (requests.csv gave_up)."""
    pooled = [
        ms
        for arrivals in request_stats.request_arrivals(rounds).values()
        for ms in request_stats.token_latencies_ms(arrivals)
    ]
    gave_up = requests["gave_up"].fillna("").astype(str).ne("") if "gave_up" in requests else pd.Series(False)
    return {
        "token_latency_ms_p50": percentile(pooled, 50),
        "token_latency_ms_p99": percentile(pooled, 99),
        "ttft_ms_p99": 1e3 * requests["ttft_s"].quantile(0.99),
        "longest_gap_ms_max": (requests["longest_gap_ms"].max() if "longest_gap_ms" in requests else math.nan),
        "requests_gave_up": int(gave_up.sum()),
    }


def requests_steady_per_token_s(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.Series:
    """Each request's steady-state time per token. Where rounds carry receipt times (network
    launchers): over its steady window (``steady_windows``), from the receipt before the window
    to the window's last, over the tokens the window received. Elsewhere the request's own
    figure (first to last receipt). Both are dsd.costs.compute_times.steady_per_token_s."""
    fallback = requests["steady_per_token_s"]
    windows = steady_windows(rounds)
    if windows is None:
        return fallback
    values = {
        key: steady_per_token_s(t_start_s, window["t_receive_s"].iloc[-1], int(window["emitted"].sum()))
        for key, (t_start_s, window) in windows.items()
    }
    measured = [
        values.get((str(c), int(r)), math.nan) for c, r in zip(requests["client_id"], requests["request_index"])
    ]
    return pd.Series(measured, index=requests.index).fillna(fallback)


def steady_windows(rounds: pd.DataFrame) -> dict | None:
    """Per (client_id, request_index): (the first emitting round's receipt time, the rounds after
    it up to the last one that emitted all it could, accepted + 1). The steady state of the closed
    form: the first round (prefill, the round trip to open) and the final round, usually cut short
    by max_new_tokens (it would charge a whole round for a few tokens), stay out. None where no
    round carries receipt times (the sim launcher); requests without such a round are left out."""
    live = rounds_with_receipts(rounds, emitting_only=True)
    if live is None:
        return None
    return {key: (float(first["t_receive_s"]), window) for key, (first, window) in _windows(live).items()}


def steady_window_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds of every request's steady window (``steady_windows``) in every point, with or
    without receipt times: live rounds that emitted, each request's first and final cut-short
    rounds out. Empty where no request has one."""
    live = rounds[~rounds["stale"].astype(bool) & (rounds["emitted"] > 0)] if len(rounds) else rounds
    points = live.groupby("point") if "point" in live else [(None, live)]
    frames = [window for _, point_rounds in points for _, window in _windows(point_rounds).values()]
    return pd.concat(frames) if frames else rounds.iloc[:0]


def _windows(live: pd.DataFrame) -> dict:
    """(client_id, request_index) -> (first round, window rounds) over one point's live emitting rounds."""
    windows = {}
    for (client, request), g in live.groupby(["client_id", "request_index"]):
        g = g.sort_values("round_index")
        full = np.flatnonzero((g["emitted"] == g["accepted"] + 1).to_numpy()[1:]) + 1
        if len(full):
            windows[str(client), int(request)] = (g.iloc[0], g.iloc[1 : full[-1] + 1])
    return windows


def _link_rtt_ms(links: pd.DataFrame | None, keys: list[str]) -> dict:
    """Median over a point's edges of the RTT the launcher measured on the shaped link."""
    if links is None or links.empty or "rtt_measured_p50_ms" not in links:
        return {}
    return links.groupby(keys)["rtt_measured_p50_ms"].median().to_dict()


def measured_compute_ms(rounds: pd.DataFrame) -> dict:
    """A point's compute as its rounds timed it (medians; NaN on the sim launcher, which keeps no
    clocks): the edge's draft step per token and the server's compute per round, which is
    t_verify for DSD, t_ar for AR and gamma*t_draft + t_verify for co-located SD."""
    out = {"t_draft_ms_measured": math.nan, "t_verify_ms_measured": math.nan, "server_compute_ms_p50": math.nan}
    if rounds.empty or "server_compute_s" not in rounds:
        return out
    live = rounds[~rounds["stale"].astype(bool)]
    drafted = live[live["t_draft_end_s"].notna() & (live["proposed"] > 0)]
    if len(drafted):
        out["t_draft_ms_measured"] = 1e3 * float(
            ((drafted.t_draft_end_s - drafted.t_draft_start_s) / drafted.proposed).median()
        )
    if live["server_compute_s"].notna().any():
        out["server_compute_ms_p50"] = 1e3 * float(live["server_compute_s"].median())
        if live["mode"].isin(edge_modes()).all():
            out["t_verify_ms_measured"] = out["server_compute_ms_p50"]
    return out


def add_predictions(points: pd.DataFrame, alpha: float, times: ComputeTimes) -> pd.DataFrame:
    points = points.copy()
    points["per_token_ms_predicted"] = [
        1e3
        * predict_per_token_s(
            row.mode, alpha, int(row.gamma), row.rtt_ms / 1e3, **times.closed_form_terms(int(row.gamma))
        )
        for row in points.itertuples()
    ]
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


def measured_crossovers(
    points: pd.DataFrame, gamma: int, clients: int = 1, pairs: dict[str, tuple[str, str]] = CROSSOVERS
) -> dict:
    """Per crossover of pairs (name -> (mode, reference)): the median-of-repeats crossing and the
    range over repeats."""
    result = {}
    subset = points[(points.gamma == gamma) | points["mode"].isin(gammaless_modes())]
    subset = subset[subset.clients == clients]
    for name, (mode, reference) in pairs.items():
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


def predicted_crossovers(gamma: int, alpha: float, times: ComputeTimes) -> dict:
    return {
        "sync_vs_ar": {
            "rtt_ms": 1e3
            * lm.sync_dsd_beats_ar_rtt_s(alpha, gamma, times.t_draft_edge_s, times.t_verify_s(gamma), times.t_ar_s)
        },
        "pipelined_vs_colocated": {
            "rtt_ms": 1e3
            * lm.pipelined_beats_colocated_rtt_s(
                alpha, gamma, times.t_draft_edge_s, times.t_draft_server_s, times.t_verify_s(gamma)
            )
        },
        **(
            {
                "cached_vs_colocated": {
                    "rtt_ms": 1e3
                    * lm.cached_beats_colocated_rtt_s(
                        alpha,
                        gamma,
                        times.t_draft_edge_s,
                        times.t_draft_server_s,
                        times.t_verify_s(gamma),
                        times.cache_hit_rate,
                        times.cache_fill_s or 0.0,
                    )
                }
            }
            if times.cache_hit_rate is not None
            else {}
        ),
    }


# --- the gain window: where DSD beats cloud AR over (alpha, RTT) -------------------------------


def add_speedups(points: pd.DataFrame) -> pd.DataFrame:
    """speedup_vs_ar: cloud AR's per-token latency (p50) at the same RTT, clients, repeat and
    group, over the point's own. > 1: the mode wins."""
    points = points.copy()
    keys = [k for k in point_keys(points) if k not in ("mode", "gamma")]
    ar = points[points["mode"] == AR].set_index(keys)["per_token_ms_p50"]
    ar = ar[~ar.index.duplicated()]
    reference = [
        ar.get(tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]], math.nan) for _, row in points.iterrows()
    ]
    points["speedup_vs_ar"] = np.asarray(reference, dtype=float) / points["per_token_ms_p50"]
    return points


def predicted_ar_boundary_rtt_ms(mode: str, alpha: float, gamma: int, times: ComputeTimes) -> float:
    """The gain window's edge: the RTT at which `mode` (sync or pipelined DSD) ties cloud AR."""
    t_v = times.t_verify_s(gamma)
    if mode == SYNC:
        rtt_s = lm.sync_dsd_beats_ar_rtt_s(alpha, gamma, times.t_draft_edge_s, t_v, times.t_ar_s)
        return 1e3 * rtt_s if rtt_s >= 0 else -math.inf
    if mode == PIPELINED:
        return 1e3 * lm.pipelined_beats_ar_rtt_s(alpha, gamma, times.t_draft_edge_s, t_v, times.t_ar_s)
    raise ValueError(f"the gain window compares sync or pipelined DSD with AR, not {mode!r}")


def predicted_ar_boundary_alpha(mode: str, rtt_ms: float, gamma: int, times: ComputeTimes) -> float:
    """The other view of the same edge: at this RTT, the alpha at which `mode` ties cloud AR
    (the boundary RTT rises with alpha). nan if it loses even at alpha = 1."""

    def boundary(alpha: float) -> float:
        return predicted_ar_boundary_rtt_ms(mode, alpha, gamma, times)

    if boundary(1.0) < rtt_ms:
        return math.nan
    lo, hi = 0.0, 1.0  # boundary(lo) < rtt_ms <= boundary(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if boundary(mid) < rtt_ms else (lo, mid)
    return hi


def gain_window_table(
    points: pd.DataFrame,
    gamma: int,
    times_by_profile: dict[str, ComputeTimes],
    modes: tuple[str, ...] = (SYNC, PIPELINED),
) -> pd.DataFrame:
    """Per profile, mode and RTT: the alpha at which DSD ties cloud AR, measured (interpolated
    over the swept alphas, medians over repeats, at the measured alphas) and predicted."""
    rows = []
    for profile, by_profile in points.groupby("profile"):
        times = times_by_profile[profile]
        for mode in modes:
            mine = by_profile[(by_profile["mode"] == mode) & (by_profile.gamma == gamma)]
            for rtt_ms, at_rtt in mine.groupby("rtt_ms"):
                per_alpha = at_rtt.groupby("alpha_measured_group")["speedup_vs_ar"].median()
                # crossing_rtt_ms works for any x: where speedup - 1 first turns positive.
                measured = (
                    crossing_rtt_ms(per_alpha.index.values, per_alpha.values - 1.0) if len(per_alpha) >= 2 else math.nan
                )
                rows.append(
                    {
                        "profile": profile,
                        "mode": mode,
                        "rtt_ms": rtt_ms,
                        "alpha_boundary_measured": measured,
                        "alpha_boundary_predicted": predicted_ar_boundary_alpha(mode, rtt_ms, gamma, times),
                    }
                )
    return pd.DataFrame(rows)
