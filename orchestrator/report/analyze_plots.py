"""The plots `dsdbed analyze` draws for a sweep folder: whichever its data supports, drawn from
what the analysis computed (the summary's latency cells, gain window, capacity rows and map);
each function returns the files it made."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dsd.modes import PIPELINED, SYNC
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis import frontier
from orchestrator.analysis.capacity import predicted_tok_s_per_client
from orchestrator.analysis.groups import GroupResult
from orchestrator.links import timeline as link_timeline
from orchestrator.report import finding_plots, plots


def sweep_plots(
    out: Path,
    sweep: dict,
    points: pd.DataFrame,
    groups: list[GroupResult],
    params: dict[str, ComputeTimes],
    compute: dict[str, ComputeTimes],
    gamma: int,
    summary: dict,
    client_rates: pd.DataFrame | None,
) -> list[str]:
    """Latency vs RTT, the gain window and capacity vs clients, where the sweep supports them."""
    made = _latency_vs_rtt_plot(out, sweep, points, groups, params, gamma, summary)
    if "gain_window" in summary:
        name, launcher = sweep["experiment"]["name"], sweep["launcher"]
        dsd_modes = tuple(m for m in (SYNC, PIPELINED) if m in set(points["mode"]))
        finding_plots.plot_gain_window(
            points,
            groups,
            params,
            gamma,
            dsd_modes,
            out / "gain_window.png",
            f"{name}: where DSD beats cloud AR (gamma={gamma}, launcher={launcher})",
            launcher,
        )
        made.append("gain_window.png")
    if client_rates is not None:
        made += _capacity_plot(out, sweep, points, groups, compute, gamma, summary, client_rates)
    return made


def _latency_vs_rtt_plot(
    out: Path,
    sweep: dict,
    points: pd.DataFrame,
    groups: list[GroupResult],
    params: dict[str, ComputeTimes],
    gamma: int,
    summary: dict,
) -> list[str]:
    """latency_vs_rtt.png for a one-group sweep over two RTTs or more: against the calibration's
    out-of-sample prediction where one was written, else against the in-sample fit."""
    if len(groups) != 1 or points.rtt_ms.nunique() < 2:
        return []
    name, launcher, g = sweep["experiment"]["name"], sweep["launcher"], groups[0]
    calibration = _calibration_fit(summary)
    if calibration is not None:
        cells = pd.DataFrame(summary["latency_cells"])
        cells = cells[cells.clients == cells.clients.min()]
        plots.plot_latency_vs_rtt_oos(
            cells,
            gamma,
            calibration,
            {"alpha": g.alpha_measured, "params": params[g.profile]},
            g.crossovers,
            out / "latency_vs_rtt.png",
            f"{name}: gamma={gamma}, alpha={calibration['alpha']:.2f} (calibration), launcher={launcher}",
            launcher,
        )
    else:
        plots.plot_latency_vs_rtt(
            points[points.clients == points.clients.min()],
            gamma,
            g.alpha_measured,
            params[g.profile],
            g.measured,
            g.predicted,
            out / "latency_vs_rtt.png",
            f"{name}: gamma={gamma}, alpha={g.alpha_measured:.2f}, launcher={launcher}",
            launcher,
        )
    return ["latency_vs_rtt.png"]


def _capacity_plot(
    out: Path,
    sweep: dict,
    points: pd.DataFrame,
    groups: list[GroupResult],
    compute: dict[str, ComputeTimes],
    gamma: int,
    summary: dict,
    client_rates: pd.DataFrame,
) -> list[str]:
    """capacity_vs_clients.png, with the saturated-server model where the sweep has one group and one RTT."""
    name, launcher, g = sweep["experiment"]["name"], sweep["launcher"], groups[0]
    rtt_s = float(points.rtt_ms.iloc[0]) / 1e3

    def predicted(mode: str, clients: float) -> float:
        return predicted_tok_s_per_client(mode, clients, g.alpha_measured, gamma, rtt_s, compute[g.profile])

    finding_plots.plot_capacity(
        client_rates,
        summary["capacity"],
        out / "capacity_vs_clients.png",
        f"{name}: per-client token rate, saturated server (launcher={launcher})",
        predicted if len(groups) == 1 and points.rtt_ms.nunique() == 1 else None,
    )
    return ["capacity_vs_clients.png"]


def _calibration_fit(summary: dict) -> dict | None:
    """A one-group sweep's calibration alpha and parameters (None where nothing was predicted)."""
    record = summary.get("out_of_sample", {}).get("calibration", {})
    fit = next(iter(record.values())) if len(record) == 1 else None
    if not fit or not fit.get("predicted"):
        return None
    return {"alpha": fit["alpha"], "params": ComputeTimes.from_dict(fit["params"])}


def link_timeline_plot(out: Path, sweep: dict, requests: pd.DataFrame, links: pd.DataFrame) -> list[str]:
    """With a link schedule (or a replayed trace): the link's RTT and every request's per-token
    latency over the run's time (orchestrator/links/timeline.py)."""
    experiment = sweep["experiment"]
    link_ms = link_timeline.schedule_rtt_ms(experiment)
    times = (
        link_timeline.request_times(requests, links, int(experiment.get("warmup_requests", 0)))
        if link_ms
        else pd.DataFrame()
    )
    if times.empty:
        return []
    plots.plot_latency_over_link(
        link_ms,
        times,
        out / "latency_over_link.png",
        f"{experiment['name']}: the link and each request's latency (launcher={sweep['launcher']})",
        sweep["launcher"],
    )
    return ["latency_over_link.png"]


def frontier_plots(
    out: Path, sweep: dict, points: pd.DataFrame, groups: list[GroupResult], summary: dict, gamma: int
) -> list[str]:
    """regime_map.png and frontier.png, for a one-group sweep over two client counts or more."""
    if len(groups) != 1 or points["clients"].nunique() < 2 or points["rtt_ms"].nunique() < 2:
        return []
    name, launcher = sweep["experiment"]["name"], sweep["launcher"]
    rows = pd.DataFrame(summary["frontier"]["rows"])
    regime = frontier.regime_cells(pd.DataFrame(summary["latency_cells"]), gamma)
    finding_plots.plot_regime_map(
        regime,
        rows,
        out / "regime_map.png",
        f"{name}: the fastest mode over RTT and clients (gamma={gamma}, launcher={launcher})",
        launcher,
    )
    finding_plots.plot_frontier(
        rows,
        out / "frontier.png",
        f"{name}: crossover RTT against clients (gamma={gamma}, launcher={launcher})",
        launcher,
    )
    return ["regime_map.png", "frontier.png"]
