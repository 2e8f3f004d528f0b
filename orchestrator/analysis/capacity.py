"""Multi-tenant capacity from traces: each client's token rate while all of a point's clients
ran, and how many clients a saturated server sustains at one per-client rate. Shared by the
capacity sweep's analysis and benchmarks/capacity.py. Pure functions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dsd.analytic import latency_model as lm
from dsd.modes import COLOCATED, SYNC
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis.rounds import rounds_with_receipts


def overlap_window(receipts: list[np.ndarray]) -> tuple[float, float]:
    """The time when every client was running: from the last client's first receipt to the
    first client's last one (empty, end <= start, if they never overlapped)."""
    return max(float(r[0]) for r in receipts), min(float(r[-1]) for r in receipts)


def overlap_counts(receipts: list[np.ndarray], emitted: list[np.ndarray]) -> tuple[float, int, int]:
    """(window_s, rounds, tokens) received inside the overlap window, all clients together.
    Saturated, a client's round time is n_clients * window_s / rounds."""
    start_s, end_s = overlap_window(receipts)
    rounds = tokens = 0
    for times, counts in zip(receipts, emitted):
        inside = (times > start_s) & (times <= end_s)
        rounds += int(inside.sum())
        tokens += int(np.asarray(counts)[inside].sum())
    return max(end_s - start_s, 0.0), rounds, tokens


def overlap_tok_s_per_client(rounds: pd.DataFrame) -> float:
    """Each client's token rate while all of the point's clients ran at once (the capacity
    measure: a saturated server shares itself between exactly these clients)."""
    live = rounds_with_receipts(rounds, emitting_only=True)
    if live is None:
        return math.nan
    clients = [g.sort_values("t_receive_s") for _, g in live.groupby("client_id")]
    if not clients or any(len(c) < 2 for c in clients):
        return math.nan
    window_s, _, tokens = overlap_counts(
        [c["t_receive_s"].to_numpy() for c in clients], [c["emitted"].to_numpy() for c in clients]
    )
    return tokens / (len(clients) * window_s) if window_s > 0 else math.nan


def capacity_at(clients: np.ndarray, per_token_s: np.ndarray, target_s: float) -> float:
    """The largest client count whose per-client time per token is within target_s, linearly
    interpolated between measured counts (saturated, time per token grows linearly with the
    clients, so this is exact there). nan if even the smallest count misses the target; the
    largest count if it meets it (a lower bound)."""
    order = np.argsort(clients)
    n, y = np.asarray(clients, dtype=float)[order], np.asarray(per_token_s, dtype=float)[order]
    if not len(n) or not y[0] <= target_s:
        return math.nan
    for i in range(1, len(n)):
        if not y[i] <= target_s:
            return float(n[i - 1] + (n[i] - n[i - 1]) * (target_s - y[i - 1]) / (y[i] - y[i - 1]))
    return float(n[-1])


def predicted_tok_s_per_client(
    mode: str, clients: int, alpha: float, gamma: int, rtt_s: float, times: ComputeTimes
) -> float:
    """Each of n clients' token rate against a server that runs one sequence per pass: a client
    round takes its own critical path or, saturated, n times the server's work per round,
    whichever is longer (queueing before saturation left out). nan for modes it does not cover."""
    e, t_v = lm.expected_tokens_per_round(alpha, gamma), times.t_verify_s(gamma)
    if mode == COLOCATED:
        return e / (clients * (gamma * times.t_draft_server_s + t_v))
    if mode == SYNC:
        return e / max(gamma * times.t_draft_edge_s + rtt_s + t_v, clients * t_v)
    return math.nan


def client_rates(points: pd.DataFrame, group_keys: list[str]) -> pd.DataFrame:
    """Per group, mode and client count: each client's token rate while all ran (median over
    repeats)."""
    keys = [k for k in group_keys if k in points.columns] + ["mode", "gamma", "rtt_ms", "clients"]
    return points.groupby(keys)["tok_s_per_client_overlap"].median().rename("tok_s_per_client").reset_index()


def capacity_ratio(
    table: pd.DataFrame, dsd_mode: str = SYNC, reference: str = COLOCATED, rate_tok_s: float | None = None
) -> dict:
    """Clients sustained at one per-client token rate, DSD over co-located SD. The rate defaults
    to what DSD gives each client at its largest measured count (where the server is most
    surely saturated), so the DSD count is measured and the co-located one interpolated."""
    mine, ref = table[table["mode"] == dsd_mode], table[table["mode"] == reference]
    if mine.empty or ref.empty:
        return {}
    rate_tok_s, n_dsd, n_ref = _clients_at_rate(
        mine.clients.values, mine.tok_s_per_client.values, ref.clients.values, ref.tok_s_per_client.values, rate_tok_s
    )
    return {
        "mode": dsd_mode,
        "reference": reference,
        "rate_tok_s_per_client": rate_tok_s,
        "clients_dsd": n_dsd,
        "clients_reference": n_ref,
        "ratio_measured": _ratio(n_dsd, n_ref),
    }


def capacity_ratio_replicates(
    points: pd.DataFrame,
    dsd_mode: str = SYNC,
    reference: str = COLOCATED,
    rate_tok_s: float | None = None,
    *,
    n_boot: int,
    seed: int,
) -> np.ndarray:
    """Bootstrap replicates of capacity_ratio over the repeats of one subset's points: each
    replicate draws the repeats with replacement, the same draw for every (mode, clients) point
    (repeat r of all of them ran in one pass over the machine), takes each point's median over
    the drawn repeats, and recomputes the ratio, its rate included. Empty with fewer than two
    repeats or without both modes; nan where a replicate's ratio is undefined."""
    wide = points[points["mode"].isin([dsd_mode, reference])].pivot_table(
        index=["mode", "clients"], columns="repeat", values="tok_s_per_client_overlap", aggfunc="median"
    )
    modes = wide.index.get_level_values("mode")
    mine, ref = np.asarray(modes == dsd_mode), np.asarray(modes == reference)
    if wide.shape[1] < 2 or not mine.any() or not ref.any():
        return np.array([])
    clients = wide.index.get_level_values("clients").to_numpy(dtype=float)
    rates_by_repeat = wide.to_numpy(dtype=float)
    n_repeats = rates_by_repeat.shape[1]
    rng = np.random.default_rng(seed)
    replicates = np.empty(n_boot)
    for b in range(n_boot):
        drawn = rates_by_repeat[:, rng.integers(0, n_repeats, n_repeats)]
        rates = np.array([np.median(row[~np.isnan(row)]) if (~np.isnan(row)).any() else math.nan for row in drawn])
        _, n_dsd, n_ref = _clients_at_rate(clients[mine], rates[mine], clients[ref], rates[ref], rate_tok_s)
        replicates[b] = _ratio(n_dsd, n_ref)
    return replicates


def _clients_at_rate(
    dsd_clients: np.ndarray,
    dsd_tok_s: np.ndarray,
    ref_clients: np.ndarray,
    ref_tok_s: np.ndarray,
    rate_tok_s: float | None,
) -> tuple[float, float, float]:
    """(rate, clients DSD sustains at it, clients the reference sustains); capacity_at converts."""
    if rate_tok_s is None:
        rate_tok_s = float(dsd_tok_s[np.argmax(dsd_clients)])
    return (
        rate_tok_s,
        capacity_at(dsd_clients, 1 / dsd_tok_s, 1 / rate_tok_s),
        capacity_at(ref_clients, 1 / ref_tok_s, 1 / rate_tok_s),
    )


def _ratio(n_dsd: float, n_ref: float) -> float:
    return n_dsd / n_ref if n_ref and math.isfinite(n_ref) else math.nan


def backlogged_gaps_s(starts_s: np.ndarray, ends_s: np.ndarray, ready_s: np.ndarray) -> np.ndarray:
    """The device's idle gaps between passes while work was waiting: for passes in order of
    start, start[k+1] - end[k] wherever pass k+1's earliest job had been submitted by end[k]
    (ready[k+1] <= end[k]). That is the serving harness's own hand-off from one pass to the
    next, not idleness for want of work; a capacity prediction takes it as a measured input."""
    order = np.argsort(starts_s)
    starts, ends, ready = (np.asarray(a, dtype=float)[order] for a in (starts_s, ends_s, ready_s))
    waiting = ready[1:] <= ends[:-1]
    return np.maximum(starts[1:] - ends[:-1], 0.0)[waiting]


def fit_cost_line(sizes: np.ndarray, times_s: np.ndarray) -> tuple[float, float]:
    """(t(1), s) of t(b) = t(1) * (1 + s * (b - 1)) through the mean time of each batch size,
    least squares weighted by how many passes had that size; (nan, nan) with fewer than two
    sizes. In the form t(b) = a + c * b: t(1) = a + c, s = c / (a + c). Means, not medians: a
    throughput prediction adds up passes, and a pass slowed by a host stall takes its time too."""
    sizes, times_s = np.asarray(sizes), np.asarray(times_s, dtype=float)
    distinct = np.unique(sizes)
    if len(distinct) < 2:
        return math.nan, math.nan
    means = np.array([times_s[sizes == b].mean() for b in distinct])
    weights = np.array([np.sqrt((sizes == b).sum()) for b in distinct])
    c, a = np.polyfit(distinct.astype(float), means, 1, w=weights)
    return float(a + c), float(c / (a + c))
