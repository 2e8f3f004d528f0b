"""The serving sweep's plots and report.md: latency vs rate and goodput vs rate per mode, and the
largest rate at the attainment level beside its prediction (a rate map's per RTT, rate_map.png)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dsd.modes import get_mode  # noqa: E402
from orchestrator.open_loop.rate_map import plot_rate_map  # noqa: E402


def plot_latency_vs_rate(points: pd.DataFrame, out: Path) -> Path:
    """TTFT and TPOT p50 and p90 per mode against the arrival rate (medians over repeats)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("ttft", "tpot")):
        for mode, group in points.groupby("mode"):
            by_rate = group.groupby("rate_rps")[[f"{metric}_p50_ms", f"{metric}_p90_ms"]].median()
            m = get_mode(mode)
            ax.plot(by_rate.index, by_rate[f"{metric}_p50_ms"], "o-", color=m.color, label=f"{m.label} p50")
            ax.plot(by_rate.index, by_rate[f"{metric}_p90_ms"], "s--", color=m.color, alpha=0.6, label=f"{m.label} p90")
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = out / "latency_vs_rate.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_goodput_vs_rate(points: pd.DataFrame, summary: dict, out: Path) -> Path:
    """Goodput and throughput per mode against the rate; the measured largest rate at the level
    as a vertical line, the run's prediction dashed, the closed form's steady state dotted."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, group in points.groupby("mode"):
        by_rate = group.groupby("rate_rps")[["goodput_rps", "throughput_rps"]].median()
        m = get_mode(mode)
        ax.plot(by_rate.index, by_rate["goodput_rps"], "o-", color=m.color, label=f"{m.label} goodput")
        ax.plot(by_rate.index, by_rate["throughput_rps"], ":", color=m.color, alpha=0.5)
        row = summary.get("modes", {}).get(mode, {})
        if row.get("max_rate_rps") is not None and math.isfinite(row["max_rate_rps"]):
            ax.axvline(row["max_rate_rps"], color=m.color, alpha=0.5)
        for key, style in (("predicted_max_rate_rps", "--"), ("steady_max_rate_rps", ":")):
            if row.get(key) is not None and math.isfinite(row[key]):
                ax.axvline(row[key], color=m.color, linestyle=style, alpha=0.8)
    ax.set_xlabel("arrival rate (requests/s)")
    ax.set_ylabel("requests/s (goodput solid, throughput dotted)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "goodput_vs_rate.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_serving_report(out: Path, points: pd.DataFrame, summary: dict) -> Path:
    out = Path(out)
    lines = ["# Serving under load", ""]
    lines += _slo_lines(summary)
    if summary.get("rate_frontier"):
        lines += _rate_map_lines(summary["rate_frontier"], out)
    elif not points.empty:
        lines += [
            f"![latency vs rate]({plot_latency_vs_rate(points, out).name})",
            f"![goodput vs rate]({plot_goodput_vs_rate(points, summary, out).name})",
            "",
        ]
    if not points.empty:
        columns = [
            "mode",
            *(["rtt_ms"] if "rtt_ms" in points else []),
            "rate_rps",
            "repeat",
            "requests_measured",
            "requests_refused",
            "attainment",
            "throughput_rps",
            "goodput_rps",
            "ttft_p50_ms",
            "ttft_p90_ms",
            "tpot_p50_ms",
            "tpot_p90_ms",
            "queue_p50_ms",
            "queue_growing",
        ]
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for _, row in points[columns].iterrows():
            lines.append("| " + " | ".join(_f(v) if isinstance(v, float) else str(v) for v in row) + " |")
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _slo_lines(summary: dict) -> list[str]:
    """The SLO, and per mode the largest rate that meets it, measured beside predicted."""
    lines = []
    if summary.get("slo"):
        slo = summary["slo"]
        bounds = ", ".join(f"{k} <= {slo[k]:g}" for k in ("ttft_ms", "tpot_ms", "e2e_ms") if slo[k])
        lines += [f"SLO: {bounds}; attainment level {slo['attainment']:.0%}.", ""]
    if summary.get("slo") and summary["modes"]:
        lines += [
            "| mode | largest rate at the level (95% CI), req/s | predicted for this run (95% CI) | error | "
            "steady state (closed form) | error | attainment there (95% CI; requests, at req/s) | goodput there |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, row in summary["modes"].items():
            lines.append(
                f"| {mode} | {_f(row.get('max_rate_rps'))} ({_f(row.get('max_rate_ci_low_rps'))} .. "
                f"{_f(row.get('max_rate_ci_high_rps'))}){' (censored)' if row.get('censored') else ''} | "
                f"{_f(row.get('predicted_max_rate_rps'))} ({_f(row.get('predicted_ci_low_rps'))} .. "
                f"{_f(row.get('predicted_ci_high_rps'))}) | {_f(row.get('rate_err_pct'), '%')} | "
                f"{_f(row.get('steady_max_rate_rps'))} | {_f(row.get('steady_err_pct'), '%')} | "
                f"{_f(row.get('attainment_at_max'))} ({_f(row.get('attainment_ci_low'))} .. "
                f"{_f(row.get('attainment_ci_high'))}; {row.get('attainment_requests', '-')}, at "
                f"{_f(row.get('attainment_rate_rps'))}) | {_f(row.get('goodput_at_max_rps'))} |"
            )
        lines += [
            "",
            "Predicted for this run: the virtual-time model on this sweep's own arrivals, made before "
            "its first point (network launchers; on the sim the run is that model). Steady state: the "
            "closed-form queueing model (docs/serving.md).",
            "",
        ]
    return lines


def _rate_map_lines(frontier: list[dict], out: Path) -> list[str]:
    """The rate map's table (per RTT and mode) and rate_map.png."""
    lines = [
        "| RTT (ms) | mode | largest rate at the level, req/s (bootstrap 95% CI) | grid bracket (met .. missed) | "
        "predicted before the points | error | highest at this RTT (margin) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in frontier:
        state = " (censored)" if row["censored"] else " (below the grid)" if row["below_grid"] else ""
        best = f"yes (+{_f(row['margin_pct'], '%')})" if row["best"] else ""
        lines.append(
            f"| {row['rtt_ms']:g} | {row['mode']} | {_f(row['max_rate_rps'])} ({_f(row['ci_low_rps'])} .. "
            f"{_f(row['ci_high_rps'])}){state} | {_f(row['met_rps'])} .. {_f(row['missed_rps'])} | "
            f"{_f(row['predicted_rps'])} | {_f(row['err_pct'], '%')} | {best} |"
        )
    return lines + [
        "",
        "Predicted: the closed-form queueing model (docs/serving.md) per RTT, from the pass times "
        "alone, written before the first point.",
        "",
        f"![rate map]({plot_rate_map(frontier, out).name})",
        "",
    ]


def _f(value, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.3g}{unit}"
