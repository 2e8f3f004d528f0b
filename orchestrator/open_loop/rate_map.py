"""The open-loop rate map ([load] rtt_ms): per (mode, RTT) the largest arrival rate the mode
sustains under the SLO, the mode that sustains the most at each RTT, what the closed form
predicted before the points ran, and ``rate_map.png``.

Two intervals per row, for two different questions:

- ``ci_low_rps`` .. ``ci_high_rps``: the 95% bootstrap of ``figures.max_rate`` (repeats redrawn,
  then each rate's good count as binomial(measured, attainment), the crossing found again): how
  far the finite number of requests moves the interpolated crossing;
- ``met_rps`` .. ``missed_rps``: the grid's bracket, the last rate (ascending, repeats pooled)
  whose attainment met the level and the first after it that missed. The crossing lies inside it
  by construction; its width is the grid's resolution at that row.

A row whose smallest rate already misses the level is ``below_grid`` (no rate met: its largest
rate is nan, the bracket 0 .. the smallest rate); one whose largest rate still meets it is
``censored`` (the figure is a lower bound).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dsd.modes import get_mode  # noqa: E402
from orchestrator.open_loop.figures import ServingModel, max_rate  # noqa: E402
from orchestrator.spec.arrivals import SloConfig  # noqa: E402


def predict_rate_map(models: dict[float, ServingModel], slo: SloConfig, modes: list[str]) -> dict:
    """The closed form's largest rate at the level per (mode, RTT), ``models`` one per RTT (every
    edge at it). Its inputs are the pass times one request alone measures (the profile, or a
    calibration at one client), nothing from an open-loop point; written before the first point."""
    rows = [
        {
            "rtt_ms": rtt_ms,
            "mode": mode,
            "predicted_rps": model.max_rate_rps(mode, slo),
            "saturation_rps": model.saturation_rps(mode),
        }
        for rtt_ms, model in sorted(models.items())
        for mode in modes
    ]
    return {"made_unix_s": time.time(), "modes": {}, "rate_frontier": rows}


def bracket(rates: np.ndarray, attainment: np.ndarray, level: float) -> tuple[float, float]:
    """(the last rate that met the level, the first after it that missed), ascending; 0 for the
    first if even the smallest rate missed, nan for the second if none missed."""
    order = np.argsort(rates)
    r, a = np.asarray(rates, dtype=float)[order], np.asarray(attainment, dtype=float)[order]
    if not a[0] >= level:
        return 0.0, float(r[0])
    for i in range(1, len(r)):
        if a[i] < level:
            return float(r[i - 1]), float(r[i])
    return float(r[-1]), math.nan


def rate_frontier(points: pd.DataFrame, level: float, predicted: list[dict] | None = None) -> list[dict]:
    """One row per (RTT, mode) of points.csv (columns rtt_ms, mode, rate_rps, repeat,
    requests_good, requests_measured): the largest rate at the level with its bootstrap CI and
    its grid bracket, the prediction made before the points and the error against it, and
    ``best`` on the row of the mode with the highest rate at that RTT (a below-grid row counts
    as 0), with its ``margin_pct`` over the runner-up."""
    predicted_by = {(float(p["rtt_ms"]), p["mode"]): p for p in predicted or []}
    rows = []
    for (rtt_ms, mode), group in points.groupby(["rtt_ms", "mode"], sort=True):
        by_rate = group.groupby("rate_rps")[["requests_good", "requests_measured"]].sum()
        attainment = (by_rate["requests_good"] / by_rate["requests_measured"].clip(lower=1)).to_numpy()
        met_rps, missed_rps = bracket(by_rate.index.to_numpy(dtype=float), attainment, level)
        found = max_rate(group, level)
        guess = predicted_by.get((float(rtt_ms), mode), {}).get("predicted_rps")
        rate = found["max_rate_rps"]
        # below the grid the crossing is undefined; its interval is the bracket, 0 .. the smallest rate
        low, high = (
            (0.0, missed_rps) if met_rps == 0.0 else (found["max_rate_ci_low_rps"], found["max_rate_ci_high_rps"])
        )
        rows.append(
            {
                "rtt_ms": float(rtt_ms),
                "mode": mode,
                "max_rate_rps": rate,
                "ci_low_rps": low,
                "ci_high_rps": high,
                "met_rps": met_rps,
                "missed_rps": missed_rps,
                "censored": found["censored"],
                "below_grid": met_rps == 0.0,
                "rates_run": len(by_rate),
                "repeats": found["repeats"],
                "predicted_rps": guess,
                "err_pct": 100 * (rate - guess) / guess if guess and math.isfinite(rate) else math.nan,
                "best": False,
                "margin_pct": math.nan,
            }
        )
    _mark_best(rows)
    return rows


def _mark_best(rows: list[dict]) -> None:
    """Flag each RTT's highest sustainable rate and its margin over the next mode's."""
    for rtt_ms in sorted({r["rtt_ms"] for r in rows}):
        mine = sorted((r for r in rows if r["rtt_ms"] == rtt_ms), key=_sustained_rps, reverse=True)
        if not mine or _sustained_rps(mine[0]) <= 0:
            continue
        mine[0]["best"] = True
        if len(mine) > 1 and _sustained_rps(mine[1]) > 0:
            mine[0]["margin_pct"] = 100 * (_sustained_rps(mine[0]) / _sustained_rps(mine[1]) - 1)


def _sustained_rps(row: dict) -> float:
    return row["max_rate_rps"] if math.isfinite(row["max_rate_rps"]) else 0.0


def plot_rate_map(frontier: list[dict], out: Path) -> Path:
    """rate_map.png: the largest sustainable rate against RTT per mode (bootstrap 95% CI as bars,
    the closed form's prediction dashed, a below-grid row as a hollow marker at 0) over a strip
    naming the mode with the highest rate at each RTT."""
    frame = pd.DataFrame(frontier)
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, gridspec_kw={"height_ratios": [5, 1]})
    for mode, group in frame.groupby("mode", sort=False):
        m, group = get_mode(mode), group.sort_values("rtt_ms")
        rate = group["max_rate_rps"].fillna(0.0)
        ax.errorbar(
            group["rtt_ms"],
            rate,
            yerr=[(rate - group["ci_low_rps"]).clip(lower=0), (group["ci_high_rps"] - rate).clip(lower=0)],
            fmt="o-",
            color=m.color,
            capsize=3,
            label=m.label,
        )
        below = group[group["below_grid"]]
        ax.plot(below["rtt_ms"], [0.0] * len(below), "o", mfc="white", color=m.color)
        if group["predicted_rps"].notna().any():
            ax.plot(group["rtt_ms"], group["predicted_rps"], "--", color=m.color, alpha=0.7)
    ax.set_ylabel("largest rate at the SLO (requests/s)")
    ax.set_title("sustainable arrival rate per mode (dashed: predicted before the points)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    rtts = sorted(frame["rtt_ms"].unique())
    edges = _cell_edges(rtts)
    winners = [frame[(frame["rtt_ms"] == rtt_ms) & frame["best"]]["mode"].tolist()[:1] for rtt_ms in rtts]
    start = 0
    for i in range(1, len(rtts) + 1):  # one span and one label per run of the same winner
        if i < len(rtts) and winners[i] == winners[start]:
            continue
        if winners[start]:
            m = get_mode(winners[start][0])
            strip.axvspan(edges[start], edges[i], color=m.color, alpha=0.8)
            strip.text((edges[start] + edges[i]) / 2, 0.5, m.label, ha="center", va="center", fontsize=8)
        start = i
    for edge in edges[1:-1]:
        strip.axvline(edge, color="white", linewidth=0.5)
    strip.set_xlim(edges[0], edges[-1])
    strip.set_yticks([])
    strip.set_ylabel("highest", fontsize=8)
    strip.set_xlabel("RTT (ms)")
    fig.tight_layout()
    path = Path(out) / "rate_map.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell_edges(rtts: list[float]) -> list[float]:
    """Boundaries halfway between neighbouring RTTs (the strip's cells)."""
    if len(rtts) == 1:
        return [rtts[0] - 1.0, rtts[0] + 1.0]
    mids = [(a + b) / 2 for a, b in zip(rtts, rtts[1:])]
    return [rtts[0] - (mids[0] - rtts[0])] + mids + [rtts[-1] + (rtts[-1] - mids[-1])]
