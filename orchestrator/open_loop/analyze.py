"""An open-loop sweep's analysis: points.csv (the serving figures per point), serving.json (per
mode the largest rate at the SLO's attainment with its interval, beside what prediction.json
predicted before the points ran; a rate map's per mode and RTT, ``rate_frontier``) and the
report."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from dsd.analytic import latency_model as lm
from orchestrator.common.files import jsonable, write_json
from orchestrator.open_loop.figures import max_rate, point_figures
from orchestrator.open_loop.plan import PREDICTION, map_rtts_ms, serving_model
from orchestrator.open_loop.prediction import predict_serving
from orchestrator.open_loop.rate_map import predict_rate_map, rate_frontier
from orchestrator.open_loop.report import write_serving_report
from orchestrator.open_loop.sim import SIM_MODES
from orchestrator.spec.experiment import Experiment


def analyze_serving(out: Path, experiment: Experiment, times) -> pd.DataFrame:
    """points.csv (one row per point), serving.json (per mode: the largest rate at the attainment
    level with its CI, beside what prediction.json predicted before the points ran), the plots and
    report.md."""
    out = Path(out)
    requests = pd.read_csv(out / "requests.csv") if (out / "requests.csv").stat().st_size else pd.DataFrame()
    rows = []
    for key, group in requests.groupby("point", sort=False):
        first = group.iloc[0]
        rtt = {"rtt_ms": first["rtt_ms"]} if experiment.load.rtt_ms else {}
        rows.append(
            {
                "point": key,
                "mode": first["mode"],
                **rtt,
                "rate_rps": first["rate_rps"],
                "gamma": first["gamma"],
                "repeat": first["repeat"],
                "searched": first["searched"],
                **point_figures(group),
            }
        )
    order = ["mode", "rtt_ms", "rate_rps", "repeat"] if experiment.load.rtt_ms else ["mode", "rate_rps", "repeat"]
    points = pd.DataFrame(rows).sort_values(order) if rows else pd.DataFrame()
    points.to_csv(out / "points.csv", index=False)
    summary = {
        "slo": asdict(experiment.slo) if experiment.slo else None,
        "load": jsonable(asdict(experiment.load)),
        "modes": {},
    }
    if experiment.slo is not None and not points.empty:
        prediction = _prediction(out, experiment, times)
        if experiment.load.rtt_ms:  # a rate map: a mode's figures are per RTT, in rate_frontier
            summary["rate_frontier"] = rate_frontier(
                points, experiment.slo.attainment, prediction.get("rate_frontier", [])
            )
        else:
            for mode in experiment.modes:
                summary["modes"][mode] = _mode_summary(
                    points[points["mode"] == mode], experiment.slo.attainment, prediction["modes"].get(mode, {})
                )
        summary["prediction_made_before_points"] = prediction["made_before_points"]
        gamma = experiment.gamma[0]
        summary["capacity_factor_closed_form"] = lm.capacity_factor(
            gamma, times.t_draft_server_s, times.t_verify_s(gamma)
        )
        summary["tokens_per_round"] = lm.expected_tokens_per_round(experiment.backend.alpha, gamma)
    write_json(out / "serving.json", summary)
    write_serving_report(out, points, summary)
    return points


def _prediction(out: Path, experiment: Experiment, times) -> dict:
    """prediction.json, with whether it was made before the first point; a folder without one
    (an older version's) gets the closed form now, marked as made after."""
    path = out / PREDICTION
    if path.exists():
        prediction = json.loads(path.read_text())
        first_s = [json.loads(p.read_text()).get("started_s") for p in (out / "points").glob("*/done.json")]
        first_s = [t for t in first_s if t is not None]
        prediction["made_before_points"] = not first_s or prediction["made_unix_s"] <= min(first_s)
        return prediction
    modes = [m for m in experiment.modes if m in SIM_MODES]
    if experiment.load.rtt_ms:
        models = {rtt: serving_model(experiment, times, rtt_ms=rtt) for rtt in map_rtts_ms(experiment)}
        return {**jsonable(predict_rate_map(models, experiment.slo, modes)), "made_before_points": False}
    prediction = predict_serving(serving_model(experiment, times), experiment.slo, modes, {})
    return {**jsonable(prediction), "made_before_points": False}


def _mode_summary(mine: pd.DataFrame, level: float, predicted: dict) -> dict:
    """One mode's row of serving.json: the measured largest rate and its CI; the run's prediction
    (``predicted_*``, ``rate_err_pct``) where one was made, the closed form's steady state
    (``steady_*``) beside it; the goodput and the stationarity check (the share of repeats still
    building their queue) at the evaluated rate nearest the measured largest rate."""
    measured = max_rate(mine, level) if len(mine) else {}
    rate = measured.get("max_rate_rps", math.nan)

    def err_pct(reference) -> float:
        return 100 * (rate - reference) / reference if reference else math.nan

    row = {
        **measured,
        "predicted_max_rate_rps": predicted.get("run_max_rate_rps"),
        "predicted_ci_low_rps": predicted.get("run_max_rate_ci_low_rps"),
        "predicted_ci_high_rps": predicted.get("run_max_rate_ci_high_rps"),
        "rate_err_pct": err_pct(predicted.get("run_max_rate_rps")),
        "steady_max_rate_rps": predicted.get("steady_max_rate_rps"),
        "steady_err_pct": err_pct(predicted.get("steady_max_rate_rps")),
        "saturation_rps": predicted.get("saturation_rps"),
    }
    at = mine.loc[(mine["rate_rps"] - rate).abs().idxmin()] if len(mine) and math.isfinite(rate) else None
    row["goodput_at_max_rps"] = float(at["goodput_rps"]) if at is not None else math.nan
    # the share of the repeats there whose queue was still building (each flags by chance ~4%)
    row["queue_growing_at_max"] = (
        float(mine[mine["rate_rps"] == at["rate_rps"]]["queue_growing"].mean()) if at is not None else None
    )
    return row
