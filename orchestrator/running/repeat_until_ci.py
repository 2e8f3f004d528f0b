"""Repeats until CI: after the planned grid, add repeats of the points that bracket a crossover
until its 95% interval is narrower than a target or the budget of extra points is spent.

Experiment keys: ``adaptive_budget_points`` (extra points at most; 0, the default, turns this
off), ``adaptive_ci_target_pct`` (an interval is narrow enough when its width is at most this
share of the crossover) and ``adaptive_crossovers`` (the crossovers served; empty: every one).
Each step takes the located crossover (finite, interval not covering
the whole grid... or covering it: those need data most) whose interval is widest relative to
the crossover, and runs one more repeat of both of its modes at every grid RTT inside its
interval and the nearest one on either side. The extra points are ordinary point folders
(repeat numbers after the planned ones), so the merged tables, the analysis and resume treat
them like the rest: a resumed sweep re-reads what is on disk and goes on from there. They are
never calibration points, and they are out of sample: predictions.csv was written before them
(their predictions are the same mode and RTT's, as for any repeat).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import replace

import pandas as pd

from dsd.modes import gammaless_modes
from orchestrator.analysis.points import CROSSOVERS, GROUP_KEYS, crossing_rtt_ms, point_keys
from orchestrator.analysis import bootstrap
from orchestrator.records.sweep_folder import merge
from orchestrator.spec.plan import Point, plan_points


def crossover_state(requests: pd.DataFrame, rounds: pd.DataFrame, gamma: int) -> list[dict]:
    """Per (group, crossover): the measured crossing (median-of-repeats curves), its 95%
    interval, and its width relative to the crossing."""
    latencies = bootstrap.request_latencies(requests, rounds)
    keys = [k for k in point_keys(latencies) if k != "repeat"]
    clients = int(latencies["clients"].min())
    cells, replicates = bootstrap.cell_replicates(latencies, keys)
    group_keys = [k for k in GROUP_KEYS if k in keys]
    rtt_grid_ms = sorted(latencies["rtt_ms"].unique())
    states = []
    groups = cells.groupby(group_keys) if group_keys else [((), cells)]
    for values, group_cells in groups:
        group = dict(zip(group_keys, values if isinstance(values, tuple) else (values,)))
        fixed = {**group, "gamma": gamma, "clients": clients}
        cis = bootstrap.crossover_cis(replicates, keys, fixed, rtt_grid_ms)
        for name, ci in cis.items():
            mode, reference = CROSSOVERS[name]
            mine = group_cells[
                (group_cells["mode"] == mode) & (group_cells.gamma == gamma) & (group_cells.clients == clients)
            ].set_index("rtt_ms")["per_token_ms"]
            ref = group_cells[
                (group_cells["mode"] == reference)
                & (group_cells.clients == clients)
                & ((group_cells.gamma == gamma) | group_cells["mode"].isin(gammaless_modes()))
            ]
            ref = ref.groupby("rtt_ms")["per_token_ms"].median()
            common = mine.index.intersection(ref.index)
            measured = (
                crossing_rtt_ms(common.values, (mine[common] - ref[common]).values) if len(common) >= 2 else math.nan
            )
            width = ci["ci_high"] - ci["ci_low"] if ci["ci_low"] != ci["ci_high"] else 0.0
            relative = (
                math.inf
                if ci["ci_covers_grid"]
                else width / abs(measured)
                if math.isfinite(measured) and measured
                else math.nan
            )
            states.append({"group": group, "name": name, "measured_rtt_ms": measured, **ci, "width_relative": relative})
    return states


def bracketing_rtts(rtt_grid_ms: list[float], low: float, high: float) -> list[float]:
    """The grid RTTs inside [low, high] and the nearest one outside on either side."""
    grid = sorted(rtt_grid_ms)
    inside = [r for r in grid if low <= r <= high]
    below = [r for r in grid if r < low]
    above = [r for r in grid if r > high]
    return sorted(set(inside + below[-1:] + above[:1]))


def next_points(experiment, states: list[dict], target_pct: float, taken: set[str]) -> list[Point]:
    """One more repeat of the worst crossover's bracketing points; [] when every crossover that
    may lie in the grid is narrow enough. A crossover measured "never" (or "always") whose
    interval still has a finite end may lie in the grid, so it is open too."""
    served = experiment.adaptive_crossovers or tuple(CROSSOVERS)
    open_ = [
        s
        for s in states
        if s["name"] in served and may_cross_in_grid(s) and not (s["width_relative"] <= target_pct / 100)
    ]
    if not open_:
        return []
    worst = max(open_, key=lambda s: s["width_relative"] if not math.isnan(s["width_relative"]) else -1)
    mode, reference = CROSSOVERS[worst["name"]]
    rtts = set(bracketing_rtts(list(experiment.rtt_ms), worst["ci_low"], worst["ci_high"]))
    gamma, clients = experiment.gamma[0], min(experiment.clients)
    repeat = experiment.repeats
    while any(key.endswith(f"_r{repeat}") for key in taken):
        repeat += 1
    # Copies of the planned repeat-0 points of those cells: the same sampling, link and group.
    return [
        replace(p, repeat=repeat)
        for p in plan_points(experiment)
        if p.repeat == 0
        and p.mode in (mode, reference)
        and p.rtt_ms in rtts
        and p.clients == clients
        and (p.gamma == gamma or p.mode in gammaless_modes())
        and in_group(p, worst["group"])
    ]


def may_cross_in_grid(state: dict) -> bool:
    return state["ci_covers_grid"] or any(math.isfinite(state[k]) for k in ("measured_rtt_ms", "ci_low", "ci_high"))


def in_group(point: Point, group: dict) -> bool:
    """Whether the point has the group's values (read back from the traces: a key the sweep does
    not vary is None on the point and empty or nan in the traces)."""
    for key, value in group.items():
        mine = getattr(point, key)
        if mine is None:
            if not (value is None or value == "" or (isinstance(value, float) and math.isnan(value))):
                return False
        elif isinstance(mine, numbers.Real):
            if not (isinstance(value, numbers.Real) and math.isclose(float(mine), float(value), abs_tol=1e-9)):
                return False
        elif mine != value:
            return False
    return True


def run_repeats_until_ci(experiment, out_dir, run_one, gamma: int, on_point_added=None) -> list[Point]:
    """After the planned grid: run_one(point) runs (and records) one point. Returns the extra
    points run now (those of an earlier, resumed, run are on disk and count against the budget);
    on_point_added(point) is called after each."""
    budget = experiment.adaptive_budget_points
    planned = {p.key for p in plan_points(experiment)}
    ran = []
    for _ in range(budget + 1):  # bounded: each step spends at least one point
        merge(out_dir)
        on_disk = {p.name for p in (out_dir / "points").iterdir() if (p / "done.json").exists()}
        extra_done = on_disk - planned
        requests = _read(out_dir / "requests.csv")
        rounds = _read(out_dir / "rounds.csv")
        if requests.empty:
            break
        states = crossover_state(requests, rounds, gamma)
        points = next_points(experiment, states, experiment.adaptive_ci_target_pct, on_disk)
        if not points or len(extra_done) + len(points) > budget:
            break
        for point in points:
            run_one(point)
            ran.append(point)
            if on_point_added:
                on_point_added(point)
    merge(out_dir)
    return ran


def _read(path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()
