"""Plots (PNG): per-token latency against the RTT per mode (in sample, out of sample, and panels
side by side), the acceptance of the workload, and the latency of each request under a link
schedule on the schedule's time axis. The findings' figures are in finding_plots.py."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dsd.modes import gammaless_modes, get_mode, names, predict_per_token_s
from orchestrator.report.figure_style import mode_color, mode_label, save_figure


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
            color=mode_color(mode),
            label=f"{mode_label(mode)} ({kind})",
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
            color=mode_color(mode),
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
    return save_figure(
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
                    color=mode_color(mode),
                    alpha=0.7,
                    lw=width,
                )
    notes = draw_crossovers(ax, crossovers, rtt_max_ms, kind)
    _finish_latency_axes(ax, title, notes)
    return save_figure(
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
            color=mode_color(mode),
            label=f"{mode_label(mode)} ({kind}, 95% CI)",
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
    return save_figure(
        fig,
        path,
        "dashed/shade: crossing in the data and its 95% CI; dotted: predicted from "
        "the calibration points before the other points ran (out of sample)",
        top=0.96,
    )


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
        label = mode_label(mode) + ("" if mode in gammaless_modes() else f" (gamma={gamma})")
        bottom.hlines(
            mine["per_token_ms"], mine["t_s"], mine["t_s"] + mine["wall_s"], color=mode_color(mode), lw=2, label=label
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
