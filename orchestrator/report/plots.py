"""Plots (PNG): latency vs RTT per mode, the gain window over (alpha, RTT), capacity vs clients, and
the latency of each request under a link schedule on the schedule's time axis."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dsd.analytic import queueing  # noqa: E402
from dsd.modes import SYNC, gammaless_modes, get_mode, names, predict_per_token_s  # noqa: E402
from orchestrator.analysis import paper  # noqa: E402
from orchestrator.analysis.points import predicted_ar_boundary_rtt_ms  # noqa: E402


def _color(mode: str) -> str:
    return get_mode(mode).color


def _label(mode: str) -> str:
    return get_mode(mode).label


def plot_latency_vs_rtt(
    points: pd.DataFrame,
    gamma: int,
    alpha: float,
    params: dict,
    crossovers: dict,
    predicted: dict,
    path: Path,
    title: str,
    launcher: str,
) -> Path:
    kind = "simulated" if launcher == "sim" else "measured"
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    subset = points[(points.gamma == gamma) | points["mode"].isin(gammaless_modes())]
    rtt_grid_ms = np.linspace(0, max(subset.rtt_ms.max(), 1.0), 200)
    for mode in names():
        rows = subset[subset["mode"] == mode].groupby("rtt_ms")["per_token_ms_p50"]
        if not len(rows):
            continue
        med, lo, hi = rows.median(), rows.min(), rows.max()
        ax.errorbar(
            med.index,
            med.values,
            yerr=[med - lo, hi - med],
            fmt="o",
            color=_color(mode),
            label=f"{_label(mode)} ({kind})",
            capsize=2,
            ms=4,
        )
        ax.plot(
            rtt_grid_ms,
            [
                1e3 * predict_per_token_s(mode, alpha, gamma, r / 1e3, **params.closed_form_terms(gamma))
                for r in rtt_grid_ms
            ],
            "-",
            color=_color(mode),
            alpha=0.6,
            lw=1.2,
        )
    notes = []
    for name in ("sync_vs_ar", "pipelined_vs_colocated"):
        for source, tag, style in ((crossovers, kind[:4] + ".", "--"), (predicted, "pred.", ":")):
            rtt = source.get(name, {}).get("rtt_ms", math.nan)
            if math.isfinite(rtt) and 0 <= rtt <= rtt_grid_ms[-1]:
                ax.axvline(rtt, color="k", ls=style, lw=0.8)
            notes.append(
                f"{name.replace('_', ' ')} {tag}: "
                + (f"{rtt:.1f} ms" if math.isfinite(rtt) else ("never wins" if rtt < 0 else "wins over the whole grid"))
            )
    _finish_latency_axes(ax, title, notes)
    return _save_figure(
        fig,
        path,
        f"points: {kind} (median, range over repeats); lines: closed form with "
        "fitted alpha, t_d, t_v; dashed: crossing found in the data, dotted: predicted",
    )


def plot_latency_vs_rtt_oos(
    cells: pd.DataFrame,
    gamma: int,
    calibration: dict,
    in_sample: dict,
    crossovers: dict,
    path: Path,
    title: str,
    launcher: str,
) -> Path:
    """Latency vs RTT with its out-of-sample evidence: each cell's median with its 95% bootstrap
    interval; solid lines the closed form from the calibration points alone (written before the
    other points ran: out of sample); thin dotted lines the in-sample fit; the measured crossover
    with its interval shaded, the out-of-sample prediction dotted.
    calibration / in_sample: {"alpha": ..., "params": ...}; crossovers: summary crossover rows."""
    kind = "simulated" if launcher == "sim" else "measured"
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    subset = latency_cells_at(cells, gamma)
    rtt_max_ms = max(subset.rtt_ms.max(), 1.0)
    rtt_grid_ms = np.linspace(0, rtt_max_ms, 200)
    draw_latency_cells(ax, subset, kind)
    for mode in subset["mode"].unique():
        for fit, style, width in ((calibration, "-", 1.3), (in_sample, ":", 0.9)):
            if fit and math.isfinite(fit.get("alpha", math.nan)) or (fit and not get_mode(mode).speculative):
                ax.plot(
                    rtt_grid_ms,
                    [
                        1e3
                        * predict_per_token_s(
                            mode, fit["alpha"], gamma, r / 1e3, **fit["params"].closed_form_terms(gamma)
                        )
                        for r in rtt_grid_ms
                    ],
                    style,
                    color=_color(mode),
                    alpha=0.7,
                    lw=width,
                )
    notes = draw_crossovers(ax, crossovers, rtt_max_ms, kind)
    _finish_latency_axes(ax, title, notes)
    return _save_figure(
        fig,
        path,
        "solid: closed form from the calibration points only (out of sample); "
        "dotted: in-sample fit; dashed/shade: crossing in the data and its 95% CI",
    )


def latency_cells_at(cells: pd.DataFrame, gamma: int) -> pd.DataFrame:
    """The latency cells a plot at this gamma shows (modes without a gamma at theirs)."""
    return cells[(cells.gamma == gamma) | cells["mode"].isin(gammaless_modes())]


def draw_latency_cells(ax, cells: pd.DataFrame, kind: str) -> None:
    """Each mode's cells: the median per-token latency with its 95% bootstrap interval."""
    for mode in names():
        rows = cells[cells["mode"] == mode].sort_values("rtt_ms")
        if not len(rows):
            continue
        yerr = [np.maximum(rows.per_token_ms - rows.ci_low, 0), np.maximum(rows.ci_high - rows.per_token_ms, 0)]
        ax.errorbar(
            rows.rtt_ms,
            rows.per_token_ms,
            yerr=yerr,
            fmt="o",
            color=_color(mode),
            label=f"{_label(mode)} ({kind}, 95% CI)",
            capsize=2,
            ms=4,
        )


def draw_crossovers(ax, crossovers: dict, rtt_max_ms: float, kind: str) -> list[str]:
    """Each crossover's measured crossing (dashed) with its 95% interval shaded and its
    out-of-sample prediction (dotted); returns a note per crossover."""
    notes = []
    for name, c in crossovers.items():
        low, high = c.get("ci_low", math.nan), c.get("ci_high", math.nan)
        if c.get("ci_covers_grid"):
            notes.append(f"{name.replace('_', ' ')}: undetermined (95% CI covers the whole grid)")
            continue
        if math.isfinite(low) or math.isfinite(high):
            ax.axvspan(
                max(low, 0) if math.isfinite(low) else 0,
                high if math.isfinite(high) else rtt_max_ms,
                color="k",
                alpha=0.08,
                lw=0,
            )
        measured, predicted = c.get("measured_rtt_ms", math.nan), c.get("predicted_rtt_ms_oos", math.nan)
        for value, style in ((measured, "--"), (predicted, ":")):
            if math.isfinite(value) and 0 <= value <= rtt_max_ms:
                ax.axvline(value, color="k", ls=style, lw=0.8)
        text = c.get("text") or f"{measured:.1f} ms"
        pred = (
            f"{predicted:.1f} ms"
            if math.isfinite(predicted)
            else ("never wins" if predicted < 0 else "wins everywhere" if predicted > 0 else "-")
        )
        notes.append(f"{name.replace('_', ' ')}: {kind[:4]}. {text}; predicted before measuring: {pred}")
    return notes


def plot_latency_vs_rtt_panels(panels: list[dict], path: Path, title: str, launcher: str) -> Path:
    """Several sweeps' latency vs RTT side by side on one latency scale; a panel is
    {"title": ..., "cells": its latency cells at its gamma, "crossovers": its summary crossover rows}."""
    kind = "simulated" if launcher == "sim" else "measured"
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.8), dpi=120, sharey=True, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        cells = panel["cells"]
        draw_latency_cells(ax, cells, kind)
        notes = draw_crossovers(ax, panel["crossovers"], max(cells.rtt_ms.max(), 1.0), kind)
        _finish_latency_axes(ax, panel["title"], notes)
    fig.suptitle(title, fontsize=11)
    return _save_figure(
        fig,
        path,
        "dashed/shade: crossing in the data and its 95% CI; dotted: predicted from "
        "the calibration points before the other points ran (out of sample)",
        top=0.96,
    )


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
        ax.plot(alpha_grid, shown, "-", color=_color(mode), lw=1.5, label="predicted boundary (DSD = AR)")
        ax.fill_between(
            alpha_grid, 0, np.clip(np.nan_to_num(shown, nan=0.0), 0, rtt_top), color=_color(mode), alpha=0.08
        )
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
            ax.plot(
                *zip(*sorted(crossing)), "D--", color="k", ms=4, lw=0.8, label="crossing found in the data, per alpha"
            )
        ax.set_xlim(0, 1.0)
        ax.set_ylim(0, rtt_top)
        ax.set_xlabel("alpha (measured per group)")
        ax.set_ylabel("round-trip time (ms)")
        ax.set_title(f"{_label(mode)} vs cloud AR", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.text(
        0.01,
        0.01,
        f"t_ar={1e3 * params.t_ar_s:.2f} ms, t_verify={1e3 * params.t_verify_s(gamma):.2f} ms, "
        f"t_draft,edge={1e3 * params.t_draft_edge_s:.2f} ms (client view: compute + measured harness "
        "overhead); shaded: DSD predicted to win; "
        "points: median speedup over repeats",
        fontsize=7,
        color="0.4",
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_capacity(table: pd.DataFrame, ratios: list[dict], path: Path, title: str, predicted=None) -> Path:
    """Per-client token rate against clients per mode, the rate the capacity is read at, and
    the measured capacity ratio beside 1 + gamma*t_draft/t_verify; predicted(mode, clients)
    draws the saturated-server model as dashed lines where it covers the mode."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for mode in names():
        rows = table[table["mode"] == mode].sort_values("clients")
        if len(rows):
            ax.plot(rows.clients, rows.tok_s_per_client, "o-", color=_color(mode), label=_label(mode), ms=4)
            grid = np.linspace(rows.clients.min(), rows.clients.max(), 100)
            model = [predicted(mode, n) for n in grid] if predicted else [math.nan]
            if np.isfinite(model).any():
                ax.plot(grid, model, "--", color=_color(mode), lw=1, alpha=0.7)
    notes = []
    for ratio in ratios:
        ax.axhline(ratio["rate_tok_s_per_client"], color=_color(ratio["mode"]), ls=":", lw=0.8)
        notes.append(
            f"{_label(ratio['mode'])} / {_label(ratio['reference'])} at "
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


def plot_acceptance(stats: dict, gamma: int, path: Path, title: str) -> Path:
    """Left: alpha over requests. Right: accepted tokens per round, measured beside the i.i.d. model."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), dpi=120)
    left.hist(stats["request_alpha"], bins=np.linspace(0, 1, 21), color="tab:blue", alpha=0.8)
    left.axvline(stats["alpha"], color="k", ls="--", lw=1, label=f"pooled alpha {stats['alpha']:.2f}")
    left.set_xlabel("alpha of one request")
    left.set_ylabel("requests")
    left.legend(fontsize=8)
    k = np.arange(gamma + 1)
    right.bar(k - 0.2, stats["accepted_share"], width=0.4, color="tab:blue", label="measured")
    right.bar(k + 0.2, stats["geometric"], width=0.4, color="0.6", label=f"i.i.d. alpha={stats['alpha']:.2f}")
    right.set_xticks(k)
    right.set_xlabel(f"accepted tokens per round (gamma={gamma})")
    right.set_ylabel("share of rounds")
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.text(
        0.01,
        0.01,
        f"{len(stats['request_alpha'])} requests, {stats['rounds']} live rounds of the "
        "speculative modes; grey: truncated geometric of i.i.d. acceptance",
        fontsize=7,
        color="0.4",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path)
    plt.close(fig)
    return path


def _save_figure(fig, path: Path, note: str, top: float = 1.0, bottom: float = 0.03) -> Path:
    """A figure's footnote, layout and file."""
    fig.text(0.01, 0.01, note, fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, bottom, 1, top))
    fig.savefig(path)
    plt.close(fig)
    return path


def _finish_latency_axes(ax, title: str, notes: list[str]) -> None:
    """The labels, limits, legend and crossover notes every per-token-latency-vs-RTT plot shares."""
    ax.text(
        0.99,
        0.02,
        "\n".join(notes),
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=7,
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"},
    )
    ax.set_xlabel("round-trip time (ms)")
    ax.set_ylabel("per-token latency, steady state (ms)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


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
            g = g.sort_values("rtt_ms")
            label = (lambda text: text) if i == 0 else (lambda text: None)
            ax.errorbar(
                g.rtt_ms,
                g.gamma_best,
                yerr=[g.gamma_best - g.gamma_set_low, g.gamma_set_high - g.gamma_best],
                fmt="o",
                color=_color(mode),
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
        ax.set_title(_label(mode), fontsize=9)
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


def plot_latency_over_link(
    link_ms: list[tuple[float, float]], times: pd.DataFrame, path: Path, title: str, launcher: str
) -> Path:
    """The link's RTT over time (a schedule, or a replayed trace: ``link_ms`` as (t_s, rtt_ms) steps)
    above each point's requests (``times``: orchestrator/links/timeline.py ``request_times``), each
    drawn across the time it ran at its wall time per token, on one time axis."""
    end_s = max(float((times["t_s"] + times["wall_s"]).max()), link_ms[-1][0]) if len(times) else link_ms[-1][0]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 5.6), dpi=120, sharex=True, gridspec_kw={"height_ratios": [1, 1.6]}
    )
    steps = [(t, rtt) for t, rtt in link_ms if t <= end_s]
    top.step([t for t, _ in steps] + [end_s], [r for _, r in steps] + [steps[-1][1]], where="post", color="k", lw=0.8)
    top.set_yscale("log")
    top.set_ylabel("link RTT (ms)")
    top.grid(alpha=0.3)
    top.set_title(title, fontsize=10)
    keys = times[["mode", "gamma"]].drop_duplicates().itertuples(index=False)
    for mode, gamma in sorted(keys, key=lambda k: (names().index(k[0]) if k[0] in names() else 99, k[1])):
        mine = times[(times["mode"] == mode) & (times["gamma"] == gamma)]
        label = _label(mode) + ("" if mode in gammaless_modes() else f" (gamma={gamma})")
        bottom.hlines(
            mine["per_token_ms"], mine["t_s"], mine["t_s"] + mine["wall_s"], color=_color(mode), lw=2, label=label
        )
    bottom.set_yscale("log")
    bottom.set_xlabel(f"time since the point's link started (s; {'virtual' if launcher == 'sim' else 'wall'} time)")
    bottom.set_ylabel("request's wall time per token (ms)")
    bottom.grid(alpha=0.3, which="both")
    bottom.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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
                (j - 0.5, i - 0.5), 1.0, 1.0, color=matplotlib.colors.to_rgba(_color(row.fastest), strength), lw=0
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
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, color=_color(mode), label=f"{_label(mode)} fastest"))
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
    ax.set_xlim(-0.5, len(rtts) - 0.5)
    ax.set_ylim(-0.5, len(clients) - 0.5)
    ax.set_xticks(columns, [f"{r:g}" for r in rtts], fontsize=8)
    ax.set_yticks(range(len(clients)), [str(c) for c in clients])
    ax.set_xlabel("round-trip time (ms), the grid's values")
    ax.set_ylabel("clients sharing the server")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save_figure(
        fig,
        path,
        f"cells: the fastest mode by {kind} per-token latency (median over repeats), "
        "paler and\nnumbered by its margin over the runner-up; lines: the queueing model's RTT*(N) "
        "between the grid's columns, clipped to the grid",
        bottom=0.07,
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
