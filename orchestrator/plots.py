"""Plots (PNG): per-token latency vs RTT per mode, measured points over predicted lines."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from orchestrator.analysis import predict_per_token_s  # noqa: E402

COLORS = {"ar": "tab:gray", "colocated": "tab:green", "sync": "tab:blue", "pipelined": "tab:orange"}
LABELS = {"ar": "cloud AR", "colocated": "co-located SD", "sync": "synchronous DSD", "pipelined": "pipelined DSD"}


def plot_latency_vs_rtt(points: pd.DataFrame, gamma: int, alpha: float, params: dict,
                        crossovers: dict, predicted: dict, path: Path, title: str,
                        launcher: str) -> Path:
    kind = "simulated" if launcher == "sim" else "measured"
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    subset = points[(points.gamma == gamma) | (points["mode"] == "ar")]
    rtt_grid_ms = np.linspace(0, max(subset.rtt_ms.max(), 1.0), 200)
    for mode in ["ar", "colocated", "sync", "pipelined"]:
        rows = subset[subset["mode"] == mode].groupby("rtt_ms")["per_token_ms_p50"]
        if not len(rows):
            continue
        med, lo, hi = rows.median(), rows.min(), rows.max()
        ax.errorbar(med.index, med.values, yerr=[med - lo, hi - med], fmt="o", color=COLORS[mode],
                    label=f"{LABELS[mode]} ({kind})", capsize=2, ms=4)
        ax.plot(rtt_grid_ms, [1e3 * predict_per_token_s(mode, r / 1e3, gamma, alpha, params) for r in rtt_grid_ms],
                "-", color=COLORS[mode], alpha=0.6, lw=1.2)
    notes = []
    for name in ("sync_vs_ar", "pipelined_vs_colocated"):
        for source, tag, style in ((crossovers, kind[:4] + ".", "--"), (predicted, "pred.", ":")):
            rtt = source.get(name, {}).get("rtt_ms", math.nan)
            if math.isfinite(rtt) and 0 <= rtt <= rtt_grid_ms[-1]:
                ax.axvline(rtt, color="k", ls=style, lw=0.8)
            notes.append(f"{name.replace('_', ' ')} {tag}: " + (f"{rtt:.1f} ms" if math.isfinite(rtt)
                         else ("never wins" if rtt < 0 else "wins over the whole grid")))
    ax.text(0.99, 0.02, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.8"})
    ax.set_xlabel("round-trip time (ms)")
    ax.set_ylabel("per-token latency, steady state (ms)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.text(0.01, 0.01, f"points: {kind} (median, range over repeats); lines: closed form with fitted "
             "alpha, t_d, t_v; dashed: crossing found in the data, dotted: predicted", fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path
