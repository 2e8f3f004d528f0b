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
   deterministic launcher (sim) would shrink the interval for nothing;
3. with several clients at a point, the clients, with replacement, the SAME draw for every cell
   of that client count: each client's requests are one unit, crossed with the request draw
   (client c's request i is kept if both c and i are drawn). A client's requests are not
   independent of each other (its place in the verifier's queue, its edge and link persist from
   one request to its next), so pooling them as independent requests would overstate what a
   point measured; and client c is the same edge, link and start order in every mode and RTT of
   a sweep, so its draw is shared across them as the request draw is.

A replicate's point value is the median over the drawn (client, request) values, the way the
point's ``per_token_ms_p50`` is the median over all its requests, so with every unit drawn once
the replicate is the reported statistic and the percentile interval is built around it. A cell
with one repeat, one client and one request has nothing to redraw: its replicates are all one
value, and a crossover between two such curves gets a point for an interval, which
``crossover_cis`` flags (``ci_degenerate``) rather than presenting it as a spread; so does it
when the samples are all alike (a deterministic simulator whose clients fall into step).

The 95% interval is the 2.5 and 97.5 percentiles of the replicates (percentile bootstrap; the
order statistics themselves, not interpolated, so infinite crossings, "never wins" or "wins
everywhere" in a replicate, are handled). Repeat-to-repeat drift is the larger noise on a
shared machine (tens of percent between two repeats of one point), which a bootstrap over
requests alone would hide; with one repeat it reduces to the request bootstrap. The seed is
fixed, so the same data gives the same interval.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from dsd.modes import get_mode
from orchestrator.analysis.points import CROSSOVERS, crossing_rtt_ms, point_keys, requests_steady_per_token_s
from orchestrator.analysis import capacity

N_BOOT = 2000
SEED = 14
LEVEL = 0.95


def request_latencies(requests: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per request: its point keys, client_id, request_index and per_token_ms (the steady
    per-token time the point statistics are built from, ``requests_steady_per_token_s``)."""
    keys = point_keys(requests)
    rounds_by_point = dict(iter(rounds.groupby(keys, sort=False))) if len(rounds) else {}
    frames = []
    for key, group in requests.groupby(keys, sort=True):
        point_rounds = rounds_by_point.get(key, rounds.iloc[0:0])
        values = 1e3 * requests_steady_per_token_s(group, point_rounds)
        columns = keys + [c for c in ("client_id", "request_index") if c in group]
        frames.append(group[columns].assign(per_token_ms=values.to_numpy()))
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=keys + ["client_id", "request_index", "per_token_ms"])
    )


def cell_replicates(
    latencies: pd.DataFrame, cell_keys: list[str], n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[pd.DataFrame, dict]:
    """(cells: one row per cell with per_token_ms, the median over repeats of each point's median
    over its requests; replicates: cell tuple -> n_boot bootstrap values). Repeats, request
    indices and, per client count, clients are each drawn once per replicate for all cells (see
    the module docstring). Without a client_id column every point is one client."""
    rng = np.random.default_rng(seed)
    data = latencies.dropna(subset=["per_token_ms"])
    if data.empty:
        return pd.DataFrame(columns=cell_keys + ["per_token_ms", "repeats"]), {}
    repeat_ids = np.array(sorted(data["repeat"].unique()))
    n_requests = int(data["request_index"].max()) + 1
    drawn_repeats = rng.choice(repeat_ids, size=(n_boot, len(repeat_ids)))  # [n_boot, repeats]
    drawn_requests = rng.integers(0, n_requests, size=(n_boot, n_requests))  # [n_boot, requests]
    fallback = rng.random(size=drawn_repeats.shape)
    drawn_clients = _ClientDraws(n_boot, seed)
    rows, replicates = [], {}
    for cell, group in data.groupby(cell_keys, sort=True):
        cell = cell if isinstance(cell, tuple) else (cell,)
        boot_by_repeat, point_medians = {}, []
        for repeat, g in group.groupby("repeat"):
            values = _by_client_and_request(g, n_requests)  # [clients, requests]
            boot = _replicate_medians(values, drawn_clients.of(len(values)), drawn_requests)  # [n_boot]
            # A draw of only requests this point lacks (a failed request) falls back to its median.
            boot_by_repeat[repeat] = np.where(np.isnan(boot), np.nanmedian(values), boot)
            point_medians.append(float(np.nanmedian(values)))
        available = np.array(sorted(boot_by_repeat))
        # A drawn repeat this cell lacks (a failed point) is replaced by one it has, at random.
        substitute = available[(fallback * len(available)).astype(int)]
        slots = np.where(np.isin(drawn_repeats, available), drawn_repeats, substitute)
        medians = np.empty(slots.shape)  # [n_boot, repeats]
        for repeat, boot in boot_by_repeat.items():
            rows_b, cols = np.nonzero(slots == repeat)
            medians[rows_b, cols] = boot[rows_b]
        replicates[cell] = np.median(medians, axis=1)
        rows.append(
            {
                **dict(zip(cell_keys, cell)),
                "per_token_ms": float(np.median(point_medians)),
                "repeats": len(boot_by_repeat),
            }
        )
    return pd.DataFrame(rows), replicates


class _ClientDraws:
    """Per client count m, one [n_boot, m] draw of client slots shared by every point with m
    clients. Its own generator per m, so the repeat and request draws (and every one-client
    interval) do not depend on which client counts a sweep has; one client is always slot 0."""

    def __init__(self, n_boot: int, seed: int) -> None:
        self.n_boot, self.seed, self.draws = n_boot, seed, {}

    def of(self, m: int) -> np.ndarray:
        if m not in self.draws:
            self.draws[m] = (
                np.zeros((self.n_boot, 1), dtype=int)
                if m == 1
                else np.random.default_rng([self.seed, m]).integers(0, m, size=(self.n_boot, m))
            )
        return self.draws[m]


def _by_client_and_request(point: pd.DataFrame, n_requests: int) -> np.ndarray:
    """A point's per_token_ms as [clients, request indices], NaN where a request is missing; the
    clients in client_id order, so slot c is the same client at every point of that count."""
    if "client_id" not in point or point["client_id"].isna().all():
        point = point.assign(client_id="0")
    client_ids = sorted(point["client_id"].astype(str).unique(), key=lambda c: (len(c), c))
    values = np.full((len(client_ids), n_requests), np.nan)
    per_cell = point.groupby([point["client_id"].astype(str), "request_index"])["per_token_ms"].mean()
    slot = {c: i for i, c in enumerate(client_ids)}
    for (client, index), value in per_cell.items():
        values[slot[client], int(index)] = value
    return values


def _replicate_medians(values: np.ndarray, drawn_clients: np.ndarray, drawn_requests: np.ndarray) -> np.ndarray:
    """Per replicate, the median over the drawn clients' drawn requests. values: [clients,
    requests]; drawn_clients: [n_boot, clients]; drawn_requests: [n_boot, requests]. Chunked so a
    point with thousands of clients does not build all replicates at once."""
    n_boot = len(drawn_requests)
    out = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(values.size, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN draws: the caller's fallback
        for lo in range(0, n_boot, chunk):
            hi = min(lo + chunk, n_boot)
            picked = values[drawn_clients[lo:hi, :, None], drawn_requests[lo:hi, None, :]]  # [b, clients, requests]
            out[lo:hi] = np.nanmedian(picked.reshape(hi - lo, -1), axis=1)
    return out


def interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The percentile interval, as order statistics (no interpolation across infinities)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    return (
        float(np.percentile(values, tail, method="lower")),
        float(np.percentile(values, 100 - tail, method="higher")),
    )


def latency_cis(cells: pd.DataFrame, replicates: dict, cell_keys: list[str]) -> pd.DataFrame:
    cells = cells.copy()
    bounds = [interval(replicates[tuple(row[k] for k in cell_keys)]) for _, row in cells.iterrows()]
    cells["ci_low"] = [b[0] for b in bounds]
    cells["ci_high"] = [b[1] for b in bounds]
    return cells


def crossover_cis(
    replicates: dict,
    cell_keys: list[str],
    fixed: dict,
    rtt_grid_ms: list[float],
    pairs: dict[str, tuple[str, str]] = CROSSOVERS,
) -> dict:
    """Per crossover of pairs (name -> (mode, reference)): the 95% interval of the crossing over the
    replicates. fixed: the other cell keys (group, gamma, clients); AR is matched at any gamma.
    covers_grid: the interval reaches both ends of the swept RTTs (or beyond), i.e. the data
    cannot place the crossover; then no number should be printed for it. degenerate: every
    replicate of every cell on both curves is the same value (one repeat, client and request a
    cell, or samples that are all alike, as a deterministic simulator's clients in step): the
    interval is a point because no redrawn value differs, not a measured spread."""
    out = {}
    for name, (mode, reference) in pairs.items():
        curves = {}
        for which in (mode, reference):
            found = {}
            for cell, values in replicates.items():
                attrs = dict(zip(cell_keys, cell))
                if attrs["mode"] != which:
                    continue
                if any(
                    attrs[k] != v
                    for k, v in fixed.items()
                    if k in attrs and not (k == "gamma" and not get_mode(which).speculative)
                ):
                    continue
                found[float(attrs["rtt_ms"])] = values
            curves[which] = found
        common = sorted(set(curves[mode]) & set(curves[reference]))
        if len(common) < 2:
            continue
        diffs = np.stack([curves[mode][r] - curves[reference][r] for r in common], axis=1)  # [n_boot, rtts]
        degenerate = all(np.all(curves[m][r] == curves[m][r][0]) for m in (mode, reference) for r in common)
        crossings = np.array([crossing_rtt_ms(np.array(common), d) for d in diffs])
        low, high = interval(crossings)
        lo_grid, hi_grid = min(rtt_grid_ms), max(rtt_grid_ms)
        out[name] = {
            "ci_low": low,
            "ci_high": high,
            "ci_width_ms": 0.0 if low == high else high - low,
            "ci_covers_grid": bool(low <= lo_grid and high >= hi_grid),
            "ci_degenerate": degenerate,
            "replicates_never_cross": float(np.mean(np.isinf(crossings))),
        }
    return out


def describe_crossover(rtt_ms: float, ci: dict | None) -> str:
    """A crossover as text: the number with its interval, or what the interval allows."""
    if ci and ci.get("ci_covers_grid"):
        return "undetermined (95% CI covers the whole grid)"
    text = (
        ("never wins" if rtt_ms < 0 else "wins over the whole grid")
        if math.isinf(rtt_ms)
        else ("-" if math.isnan(rtt_ms) else f"{rtt_ms:.2f} ms")
    )
    if ci and ci.get("ci_degenerate"):
        text += " (no interval: no resampled value differs)"
    elif ci and math.isinf(rtt_ms) and ci.get("ci_low") == ci.get("ci_high") == rtt_ms:
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
    return {
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "ratio_repeats": int(points["repeat"].nunique()),
        "ratio_replicates_undefined": float(np.isnan(replicates).mean()) if len(replicates) else math.nan,
    }
