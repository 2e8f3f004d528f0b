"""95% confidence intervals for per-token latencies and crossovers: a two-level bootstrap.

The statistic the analysis reports for a cell (group, mode, RTT, gamma, clients) is the median
over repeats of each point's median over requests of the steady per-token time; a crossover is
the RTT where two cells' curves cross (``crossing_rtt_ms``). One bootstrap replicate
redraws both levels the data came from:

1. the repeats, with replacement, the SAME draw for every cell: repeat r of every mode ran
   together (modes innermost in the plan), so a slow phase of the machine touches all curves of
   that repeat alike and must stay paired when two of them are compared;
2. the request indices, with replacement, again the SAME draw for every point: request i is the
   same prompt in every mode, RTT and repeat (orchestrator/spec/workload.py), and how fast a prompt
   decodes (its realised acceptance) is shared by all of them. Resampling each point's requests
   independently would treat identical prompts as fresh data, and more repeats of a
   deterministic launcher (sim) would shrink the interval for nothing.

The 95% interval is the 2.5 and 97.5 percentiles of the replicates (percentile bootstrap; the
order statistics themselves, not interpolated, so infinite crossings, "never wins" or "wins
everywhere" in a replicate, are handled). Repeat-to-repeat drift is the larger noise on a
shared machine (tens of percent between two repeats of one point), which a bootstrap over
requests alone would hide; with one repeat it reduces to the request bootstrap. The seed is
fixed, so the same data gives the same interval.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd.modes import get_mode
from orchestrator.analysis.points import CROSSOVERS, crossing_rtt_ms, point_keys, requests_steady_per_token_s
from orchestrator.analysis import capacity

N_BOOT = 2000
SEED = 14
LEVEL = 0.95


def request_latencies(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per request: its point keys, request_index and per_token_ms (the steady per-token
    time the point statistics are built from, ``requests_steady_per_token_s``)."""
    keys = point_keys(requests)
    rounds_by_point = dict(iter(rounds.groupby(keys, sort=False))) if len(rounds) else {}
    frames = []
    for key, group in requests.groupby(keys, sort=True):
        point_rounds = rounds_by_point.get(key, rounds.iloc[0:0])
        values = 1e3 * requests_steady_per_token_s(group, point_rounds)
        frames.append(group[keys + ["request_index"]].assign(per_token_ms=values.to_numpy()))
    return (pd.concat(frames, ignore_index=True) if frames
            else pd.DataFrame(columns=keys + ["request_index", "per_token_ms"]))


def cell_replicates(latencies: pd.DataFrame, cell_keys: list[str], n_boot: int = N_BOOT,
                    seed: int = SEED) -> tuple[pd.DataFrame, dict]:
    """(cells: one row per cell with per_token_ms, the median over repeats of the per-repeat
    median over requests; replicates: cell tuple -> n_boot bootstrap values). Repeats and
    request indices are each drawn once per replicate for all cells (see the module docstring)."""
    rng = np.random.default_rng(seed)
    data = latencies.dropna(subset=["per_token_ms"])
    if data.empty:
        return pd.DataFrame(columns=cell_keys + ["per_token_ms", "repeats"]), {}
    repeat_ids = np.array(sorted(data["repeat"].unique()))
    n_requests = int(data["request_index"].max()) + 1
    drawn_repeats = rng.choice(repeat_ids, size=(n_boot, len(repeat_ids)))       # [n_boot, repeats]
    drawn_requests = rng.integers(0, n_requests, size=(n_boot, n_requests))     # [n_boot, requests]
    fallback = rng.random(size=drawn_repeats.shape)
    rows, replicates = [], {}
    for cell, group in data.groupby(cell_keys, sort=True):
        cell = cell if isinstance(cell, tuple) else (cell,)
        boot_by_repeat, point_medians = {}, []
        for repeat, g in group.groupby("repeat"):
            # A point's value per request index (the mean over its clients, who share the prompts).
            values = np.full(n_requests, np.nan)
            per_index = g.groupby("request_index")["per_token_ms"].mean()
            values[per_index.index.to_numpy(dtype=int)] = per_index.to_numpy()
            boot = np.nanmedian(values[drawn_requests], axis=1)                   # [n_boot]
            # A draw of only requests this point lacks (a failed request) falls back to its median.
            boot_by_repeat[repeat] = np.where(np.isnan(boot), np.nanmedian(values), boot)
            point_medians.append(float(np.nanmedian(values)))
        available = np.array(sorted(boot_by_repeat))
        # A drawn repeat this cell lacks (a failed point) is replaced by one it has, at random.
        substitute = available[(fallback * len(available)).astype(int)]
        slots = np.where(np.isin(drawn_repeats, available), drawn_repeats, substitute)
        medians = np.empty(slots.shape)                                           # [n_boot, repeats]
        for repeat, boot in boot_by_repeat.items():
            rows_b, cols = np.nonzero(slots == repeat)
            medians[rows_b, cols] = boot[rows_b]
        replicates[cell] = np.median(medians, axis=1)
        rows.append({**dict(zip(cell_keys, cell)), "per_token_ms": float(np.median(point_medians)),
                     "repeats": len(boot_by_repeat)})
    return pd.DataFrame(rows), replicates


def interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval, as order statistics (no interpolation across infinities)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    return (float(np.percentile(values, tail, method="lower")),
            float(np.percentile(values, 100 - tail, method="higher")))


def latency_cis(cells: pd.DataFrame, replicates: dict, cell_keys: list[str]) -> pd.DataFrame:
    cells = cells.copy()
    bounds = [interval(replicates[tuple(row[k] for k in cell_keys)]) for _, row in cells.iterrows()]
    cells["ci_low"] = [b[0] for b in bounds]
    cells["ci_high"] = [b[1] for b in bounds]
    return cells


def crossover_cis(replicates: dict, cell_keys: list[str], fixed: dict, rtt_grid_ms: list[float],
                  pairs: dict[str, tuple[str, str]] = CROSSOVERS) -> dict:
    """Per crossover of pairs (name -> (mode, reference)): the 95% interval of the crossing over the
    replicates. fixed: the other cell keys (group, gamma, clients); AR is matched at any gamma.
    covers_grid: the interval reaches both ends of the swept RTTs (or beyond), i.e. the data
    cannot place the crossover; then no number should be printed for it."""
    out = {}
    for name, (mode, reference) in pairs.items():
        curves = {}
        for which in (mode, reference):
            found = {}
            for cell, values in replicates.items():
                attrs = dict(zip(cell_keys, cell))
                if attrs["mode"] != which:
                    continue
                if any(attrs[k] != v for k, v in fixed.items()
                       if k in attrs and not (k == "gamma" and not get_mode(which).speculative)):
                    continue
                found[float(attrs["rtt_ms"])] = values
            curves[which] = found
        common = sorted(set(curves[mode]) & set(curves[reference]))
        if len(common) < 2:
            continue
        diffs = np.stack([curves[mode][r] - curves[reference][r] for r in common], axis=1)   # [n_boot, rtts]
        crossings = np.array([crossing_rtt_ms(np.array(common), d) for d in diffs])
        low, high = interval(crossings)
        lo_grid, hi_grid = min(rtt_grid_ms), max(rtt_grid_ms)
        out[name] = {"ci_low": low, "ci_high": high, "ci_width_ms": 0.0 if low == high else high - low,
                     "ci_covers_grid": bool(low <= lo_grid and high >= hi_grid),
                     "replicates_never_cross": float(np.mean(np.isinf(crossings)))}
    return out


def describe_crossover(rtt_ms: float, ci: dict | None) -> str:
    """A crossover as text: the number with its interval, or what the interval allows."""
    if ci and ci.get("ci_covers_grid"):
        return "undetermined (95% CI covers the whole grid)"
    text = ("never wins" if rtt_ms < 0 else "wins over the whole grid") if math.isinf(rtt_ms) else \
        ("-" if math.isnan(rtt_ms) else f"{rtt_ms:.2f} ms")
    if ci and math.isinf(rtt_ms) and ci.get("ci_low") == ci.get("ci_high") == rtt_ms:
        text += " (in every bootstrap replicate)"
    elif ci and not math.isnan(ci.get("ci_low", math.nan)):
        text += f" [95% CI {_bound(ci['ci_low'])} .. {_bound(ci['ci_high'])}]"
    return text


def _bound(value: float) -> str:
    if math.isinf(value):
        return "-inf" if value < 0 else "+inf"
    return f"{value:.2f}"


def capacity_ratio_interval(points: pd.DataFrame, mode: str) -> dict:
    """The capacity ratio's 95% interval over the repeats (nan with one repeat): the repeats
    redrawn jointly for every point, as above (capacity.capacity_ratio_replicates)."""
    replicates = capacity.capacity_ratio_replicates(points, mode, n_boot=N_BOOT, seed=SEED)
    low, high = interval(replicates, LEVEL)
    return {"ratio_ci_low": low, "ratio_ci_high": high, "ratio_repeats": int(points["repeat"].nunique()),
            "ratio_replicates_undefined": float(np.isnan(replicates).mean()) if len(replicates) else math.nan}
