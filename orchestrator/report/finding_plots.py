"""Plots (PNG) of what the sweep found beside the report's findings sections: the gain window
over (alpha, RTT), capacity against clients, the optimal gamma against the RTT, and the map over
RTT and clients (the fastest mode per cell, and the crossover RTT*(N) against the client count)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dsd.analytic import queueing
from dsd.modes import SYNC, names
from orchestrator.analysis import paper
from orchestrator.analysis.points import predicted_ar_boundary_rtt_ms
from orchestrator.report.figure_style import mode_color, mode_label, save_figure


def plot_gain_window(
    points: pd.DataFrame,
    groups: list,
    params_by_profile: dict,
    gamma: int,
    modes: tuple[str, ...],
    path: Path,
    title: str,
    launcher: str,
) -> Path:
    """Over (alpha, RTT): each point a win (DSD faster than cloud AR) or a loss, over the
    predicted boundary RTT(alpha) where DSD ties AR; one panel per DSD mode."""
    kind = "simulated" if launcher == "sim" else "measured"
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.6), dpi=120, squeeze=False)
    params = params_by_profile[groups[0].profile]
    alpha_grid = np.linspace(0.02, 1.0, 300)
    rtt_top = max(points.rtt_ms.max(), 1.0) * 1.1
    for ax, mode in zip(axes[0], modes):
        boundary = np.array([predicted_ar_boundary_rtt_ms(mode, a, gamma, params) for a in alpha_grid])
        shown = np.where(np.isfinite(boundary), boundary, np.nan)
        ax.plot(alpha_grid, shown, "-", color=mode_color(mode), lw=1.5, label="predicted boundary (DSD = AR)")
        ax.fill_between(
            alpha_grid, 0, np.clip(np.nan_to_num(shown, nan=0.0), 0, rtt_top), color=mode_color(mode), alpha=0.08
        )
        _draw_wins_and_losses(ax, points, groups, mode, gamma, kind)
        ax.set_xlim(0, 1.0)
        ax.set_ylim(0, rtt_top)
        ax.set_xlabel("alpha (measured per group)")
        ax.set_ylabel("round-trip time (ms)")
        ax.set_title(f"{mode_label(mode)} vs cloud AR", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    return save_figure(
        fig,
        path,
        f"t_ar={1e3 * params.t_ar_s:.2f} ms, t_verify={1e3 * params.t_verify_s(gamma):.2f} ms, "
        f"t_draft,edge={1e3 * params.t_draft_edge_s:.2f} ms (client view: compute + measured harness "
        "overhead); shaded: DSD predicted to win; "
        "points: median speedup over repeats",
    )


def _draw_wins_and_losses(ax, points: pd.DataFrame, groups: list, mode: str, gamma: int, kind: str) -> None:
    """A gain-window panel's points: each (alpha, RTT) cell's median speedup over cloud AR as a win
    or a loss, and for synchronous DSD the crossing found in the data per alpha."""
    mine = points[(points["mode"] == mode) & (points.gamma == gamma)]
    cells = mine.groupby(["alpha_measured_group", "rtt_ms"])["speedup_vs_ar"].median().reset_index()
    win, lose = cells[cells.speedup_vs_ar > 1], cells[~(cells.speedup_vs_ar > 1)]
    ax.scatter(
        win.alpha_measured_group,
        win.rtt_ms,
        marker="o",
        color="tab:green",
        s=28,
        zorder=3,
        label=f"DSD faster ({kind})",
    )
    ax.scatter(
        lose.alpha_measured_group,
        lose.rtt_ms,
        marker="x",
        color="tab:red",
        s=28,
        zorder=3,
        label=f"cloud AR faster ({kind})",
    )
    crossing = (
        [(g.alpha_measured, g.measured.get("sync_vs_ar", {}).get("rtt_ms", math.nan)) for g in groups]
        if mode == SYNC
        else []
    )
    crossing = [(a, r) for a, r in crossing if math.isfinite(r)]
    if crossing:
        ax.plot(*zip(*sorted(crossing)), "D--", color="k", ms=4, lw=0.8, label="crossing found in the data, per alpha")


def plot_capacity(table: pd.DataFrame, ratios: list[dict], path: Path, title: str, predicted=None) -> Path:
    """Per-client token rate against clients per mode, the rate the capacity is read at, and
    the measured capacity ratio beside 1 + gamma*t_draft/t_verify; predicted(mode, clients)
    draws the saturated-server model as dashed lines where it covers the mode."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for mode in names():
        rows = table[table["mode"] == mode].sort_values("clients")
        if len(rows):
            ax.plot(rows.clients, rows.tok_s_per_client, "o-", color=mode_color(mode), label=mode_label(mode), ms=4)
            grid = np.linspace(rows.clients.min(), rows.clients.max(), 100)
            model = [predicted(mode, n) for n in grid] if predicted else [math.nan]
            if np.isfinite(model).any():
                ax.plot(grid, model, "--", color=mode_color(mode), lw=1, alpha=0.7)
    notes = []
    for ratio in ratios:
        ax.axhline(ratio["rate_tok_s_per_client"], color=mode_color(ratio["mode"]), ls=":", lw=0.8)
        notes.append(
            f"{mode_label(ratio['mode'])} / {mode_label(ratio['reference'])} at "
            f"{ratio['rate_tok_s_per_client']:.1f} tok/s per client: {ratio['clients_dsd']:.2f} / "
            f"{ratio['clients_reference']:.2f} clients = {ratio['ratio_measured']:.2f} "
            f"[{paper.ratio_interval(ratio)}] (predicted {ratio['ratio_predicted']:.2f})"
        )
    if notes:
        ax.text(
            0.99,
            0.98,
            "\n".join(notes),
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"},
        )
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("tokens/s per client, while all run")
    fig.text(
        0.01,
        0.01,
        "dashed: max(own critical path, n x server work per round), measured alpha, fitted times",
        fontsize=7,
        color="0.4",
    )
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_gamma_opt(table: pd.DataFrame, path: Path, title: str, launcher: str) -> Path:
    """The optimal gamma against the RTT (orchestrator/analysis/gamma_opt.py), one panel per mode: the
    measured best swept gamma with the set of gammas chosen in >= 2.5% of the bootstrap
    replicates as its bar; the out-of-sample grid argmin and the closed form's unrestricted
    argmin (calibrated: out of sample; dotted: in sample) as lines. Several groups (alpha,
    profile, link, clients): each group's curves in the same styles, labelled once."""
    kind = "simulated" if launcher == "sim" else "measured"
    modes = [m for m in names() if m in set(table["mode"])]
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.4), dpi=120, squeeze=False)
    group_keys = [k for k in table.columns if k not in _GAMMA_OPT_VALUE_COLUMNS and k not in ("mode", "rtt_ms")]
    for ax, mode in zip(axes[0], modes):
        rows = table[table["mode"] == mode]
        groups = rows.groupby(group_keys) if group_keys else [((), rows)]
        for i, (_, g) in enumerate(groups):
            _draw_gamma_opt_group(ax, g, mode, kind, i == 0)
        ax.set_title(mode_label(mode), fontsize=9)
        ax.set_xlabel("RTT (ms)")
        ax.set_ylabel("gamma")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# gamma_opt.csv's value columns: everything else but mode and rtt_ms is a group key
_GAMMA_OPT_VALUE_COLUMNS = {
    "gamma_best",
    "per_token_ms_measured_best",
    "gammas_swept",
    "gamma_shares",
    "gamma_set",
    "gamma_set_low",
    "gamma_set_high",
    "gamma_best_predicted_grid_oos",
    "per_token_ms_predicted_grid_oos",
    "per_token_ms_measured_at_predicted",
    "penalty_ms",
    "penalty_pct",
    "predicted_in_set",
    "gamma_model_oos",
    "per_token_ms_model_oos",
    "gamma_model_insample",
    "per_token_ms_model_insample",
    "predicted_from_calibration_points",
}


def _draw_gamma_opt_group(ax, g: pd.DataFrame, mode: str, kind: str, labelled: bool) -> None:
    """One group's optimal-gamma curves in a mode's panel (labelled for the legend once)."""
    g = g.sort_values("rtt_ms")
    label = (lambda text: text) if labelled else (lambda text: None)
    ax.errorbar(
        g.rtt_ms,
        g.gamma_best,
        yerr=[g.gamma_best - g.gamma_set_low, g.gamma_set_high - g.gamma_best],
        fmt="o",
        color=mode_color(mode),
        capsize=3,
        ms=5,
        label=label(f"{kind} best (bar: gammas in >= 2.5% of replicates)"),
    )
    ax.plot(
        g.rtt_ms,
        g.gamma_best_predicted_grid_oos,
        "s-",
        mfc="none",
        color="k",
        lw=0.8,
        ms=7,
        label=label("closed form, swept gammas (out of sample)"),
    )
    ax.plot(
        g.rtt_ms,
        g.gamma_model_oos,
        "--",
        color="0.35",
        lw=1.2,
        label=label("closed form, gamma 1..64 (calibrated, out of sample)"),
    )
    ax.plot(
        g.rtt_ms,
        g.gamma_model_insample,
        ":",
        color="0.35",
        lw=1.0,
        label=label("closed form, gamma 1..64 (in sample)"),
    )


# The pairs the map's figures draw (orchestrator/analysis/frontier.py rows hold more): the question,
# pipelined DSD against co-located SD, and synchronous DSD against cloud AR.
_MAP_PAIRS = {
    "pipelined_vs_colocated": ("-", "k"),
    "cached_vs_colocated": ("-.", "tab:red"),
    "sync_vs_ar": ("--", "tab:blue"),
}


def plot_regime_map(regime: pd.DataFrame, frontier: pd.DataFrame, path: Path, title: str, launcher: str) -> Path:
    """A heatmap over (RTT, clients): each cell coloured by its fastest mode, paler the smaller its
    margin over the runner-up (written in the cell); the predicted crossovers RTT*(N) of the map's
    pairs drawn over it. One column per RTT of the grid, equally wide (grids are dense near 0 ms,
    where a linear axis would crowd the cells), and one row per client count; a predicted RTT
    between two of the grid's is placed between their columns by linear interpolation."""
    kind = "simulated" if launcher == "sim" else "measured"
    rtts = np.array(sorted(regime["rtt_ms"].unique()), dtype=float)
    clients = sorted(int(c) for c in regime["clients"].unique())
    columns = np.arange(len(rtts), dtype=float)
    fig, ax = plt.subplots(figsize=(max(6.5, 2.5 + 0.55 * len(rtts)), 1.6 + 0.55 * len(clients)), dpi=120)
    for row in regime.itertuples():
        i, j = clients.index(int(row.clients)), int(np.searchsorted(rtts, row.rtt_ms))
        strength = 0.35 + 0.65 * min(max(row.margin_pct, 0) / 50, 1) if math.isfinite(row.margin_pct) else 1.0
        ax.add_patch(
            plt.Rectangle(
                (j - 0.5, i - 0.5), 1.0, 1.0, color=matplotlib.colors.to_rgba(mode_color(row.fastest), strength), lw=0
            )
        )
        ax.text(
            j,
            i,
            f"+{row.margin_pct:.0f}%" if math.isfinite(row.margin_pct) else "",
            ha="center",
            va="center",
            fontsize=6.5,
        )
    for mode in [m for m in names() if m in set(regime["fastest"])]:
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, color=mode_color(mode), label=f"{mode_label(mode)} fastest"))
    _draw_predicted_crossovers(ax, regime, frontier, rtts, clients)
    ax.set_xlim(-0.5, len(rtts) - 0.5)
    ax.set_ylim(-0.5, len(clients) - 0.5)
    ax.set_xticks(columns, [f"{r:g}" for r in rtts], fontsize=8)
    ax.set_yticks(range(len(clients)), [str(c) for c in clients])
    ax.set_xlabel("round-trip time (ms), the grid's values")
    ax.set_ylabel("clients sharing the server")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(
        fig,
        path,
        f"cells: the fastest mode by {kind} per-token latency (median over repeats), "
        "paler and\nnumbered by its margin over the runner-up; lines: the queueing model's RTT*(N) "
        "between the grid's columns, clipped to the grid",
        bottom=0.07,
    )


def _draw_predicted_crossovers(ax, regime: pd.DataFrame, frontier: pd.DataFrame, rtts, clients: list[int]) -> None:
    """The map's pairs' predicted RTT*(N) over its cells, where the two modes of a pair both win
    somewhere (a boundary between two regions), placed between the grid's columns."""
    columns = np.arange(len(rtts), dtype=float)
    winners = set(regime["fastest"])
    for pair, (style, color) in _MAP_PAIRS.items():
        rows = frontier[frontier["pair"] == pair].sort_values("clients") if len(frontier) else frontier
        if len(rows) and set(queueing.FRONTIER_PAIRS[pair]) <= winners:  # a boundary between two regions
            ys = [clients.index(int(c)) for c in rows["clients"]]
            predicted = rows["predicted_ms"].to_numpy(dtype=float)
            xs = np.where(
                predicted > rtts[-1],
                len(rtts) - 0.5,
                np.where(predicted < rtts[0], -0.5, np.interp(predicted, rtts, columns)),
            )
            ax.plot(
                xs,
                ys,
                style,
                color=color,
                lw=1.4,
                marker="|",
                ms=10,
                label=f"{pair.replace('_', ' ')}: predicted RTT*(N)",
            )


def plot_frontier(frontier: pd.DataFrame, path: Path, title: str, launcher: str) -> Path:
    """RTT*(N) against the client count for the map's pairs: measured with its 95% bootstrap
    interval (never-wins at the axis' bottom, wins-everywhere at its top, as triangles) beside the
    predicted curve (solid where written before the points ran, dotted in sample)."""
    kind = "simulated" if launcher == "sim" else "measured"
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    finite = frontier[["crossover_ms", "predicted_ms", "ci_high_ms"]].to_numpy(dtype=float).ravel()
    finite = finite[np.isfinite(finite)]
    top = max(float(finite.max()) * 1.1 if len(finite) else 1.0, 1.0)
    for pair, (_, color) in _MAP_PAIRS.items():
        rows = frontier[frontier["pair"] == pair].sort_values("clients")
        if rows.empty:
            continue
        measured = rows["crossover_ms"].to_numpy(dtype=float)
        inside = np.isfinite(measured)
        low = np.clip(rows["ci_low_ms"].to_numpy(dtype=float), 0, top)
        high = np.clip(rows["ci_high_ms"].to_numpy(dtype=float), 0, top)
        ax.errorbar(
            rows["clients"][inside],
            measured[inside],
            yerr=[np.maximum(measured[inside] - low[inside], 0), np.maximum(high[inside] - measured[inside], 0)],
            fmt="o",
            color=color,
            capsize=3,
            ms=5,
            label=f"{pair.replace('_', ' ')} ({kind}, 95% CI)",
        )
        for sign, marker, y in ((-1, "v", 0.0), (1, "^", top)):
            at = np.isinf(measured) & (np.sign(measured) == sign)
            ax.plot(rows["clients"][at], [y] * int(at.sum()), marker, color=color, ms=7, ls="none")
        oos = rows["in_or_out_of_sample"] == "out_of_sample"
        ax.plot(rows["clients"], np.clip(rows["predicted_ms"].to_numpy(dtype=float), 0, top), ":", color=color, lw=1)
        ax.plot(
            rows["clients"][oos],
            np.clip(rows["predicted_ms"][oos].to_numpy(dtype=float), 0, top),
            "-",
            color=color,
            lw=1.4,
            label=f"{pair.replace('_', ' ')} predicted before measuring",
        )
    ax.set_xlabel("clients sharing the server")
    ax.set_ylabel("crossover RTT, RTT*(N) (ms)")
    ax.set_ylim(0, top)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.text(
        0.01,
        0.01,
        "below a curve its first mode is at least as fast; triangles: never wins (bottom), wins over "
        "the whole grid (top);\ndotted: the queueing model in sample (dsd.analytic.queueing)",
        fontsize=7,
        color="0.4",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path
