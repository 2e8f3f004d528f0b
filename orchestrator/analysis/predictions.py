"""Calibrate, then predict, then measure: the out-of-sample test of the closed form.

A sweep's first points in every (profile, alpha) group are its calibration points (the first
repeat of AR, co-located SD and synchronous DSD at the grid's smallest RTT and client count,
``orchestrator.spec.plan.is_calibration``), measured on the same testbed and link backend as the
rest. From their rounds alone we fit what the closed form needs, as the client sees it:

    alpha            the one whose E(alpha, gamma) is the tokens per round of their speculative
                     rounds' steady windows (each request's first and final rounds out, as in
                     the per-token statistic; ``_steady_alpha``)
    t_ar             mean gap between AR tokens at the client
    t_verify(gamma)  mean (receive - send - RTT - queue) of the sync rounds
    t_draft,edge     mean (send - previous receipt) / gamma of the sync rounds
    t_draft,server   (mean co-located round - t_verify) / gamma
    overhead         the harness's per-round cost, client view minus compute (reported)

(``fit_effective_params``; on the sim launcher, which keeps no receipt times, the compute
costs it ran with). Then, before any other point of the group runs, every planned point's
per-token latency and the group's crossovers are predicted and appended to OUT/predictions.csv
with the time of prediction; the fit goes to OUT/calibration.json. Rows once written are never
changed: a resumed sweep keeps them, and a group whose other points were measured before any
prediction existed (a folder from an older version) gets none rather than a post-hoc one.

The analysis then compares every non-calibration point with its prediction (out_of_sample.py):
the out-of-sample error, the headline of summary.json, points.csv, the plot and the report.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dsd.analytic import queueing
from dsd.analytic.latency_model import expected_tokens_per_round
from dsd.modes import AR, COLOCATED, SYNC, get_mode, predict_per_token_s, speculative_modes
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis.fits import (
    cache_fill_s,
    cache_hit_rate,
    fit_alpha_tokens_per_round,
    fit_effective_params,
    fit_params,
)
from orchestrator.analysis.points import (
    CROSSOVERS,
    predicted_crossovers,
    steady_window_rounds,
)
from orchestrator.analysis.wire import add_wire_prediction, experiment_features, experiment_vocab
from orchestrator.common.csv_rows import read_whole_rows
from orchestrator.common.files import write_atomic, write_json
from orchestrator.records.sweep_folder import experiment_record, point_done
from orchestrator.spec.plan import Point, calibration_unit, is_calibration
from services.wire_size import FeatureWire

PREDICTIONS = "predictions.csv"
CALIBRATION = "calibration.json"


# --- before the measurements ---------------------------------------------------------------------


def calibrate(rounds: pd.DataFrame, assumed: ComputeTimes) -> dict:
    """The closed form's inputs from the calibration rounds alone (assumed: the compute times
    the sweep ran with, used where the rounds say nothing).

    Each request (request i is the same prompt in every calibration point) is fitted on its own
    and every parameter is the median over requests: the statistic the predictions are compared
    with is a median over requests too, and a calibration point is short, so a single host stall
    (seen here: one 216 ms co-located round among 116 of 18 ms, load average 9 on 2 CPUs) would
    otherwise move every prediction of its mode. alpha is pooled over all rounds (acceptance
    counts do not stall). Returns alpha, params and params_compute (ComputeTimes), their sources
    and the harness overhead."""
    spec = rounds[rounds["mode"].isin(speculative_modes())] if len(rounds) else rounds
    alpha, alpha_source = _steady_alpha(spec)
    by_request = list(rounds.groupby("request_index")) if "request_index" in rounds and len(rounds) else []
    if len(by_request) < 2:
        compute, compute_sources = fit_params(rounds, assumed)
        params, sources, overhead = fit_effective_params(rounds, compute)
    else:
        compute, params, overhead = _fit_per_request(rounds, [r for _, r in by_request], assumed)
        _, compute_sources = fit_params(rounds, assumed)
        _, sources, _ = fit_effective_params(rounds, compute)
        note = f" (per request; median over {len(by_request)} requests)"
        sources = {k: v + note for k, v in sources.items()}
        compute_sources = {k: v + note for k, v in compute_sources.items()}
    hit_rate = cache_hit_rate(rounds)  # pooled over the requests, as alpha is: hits do not stall
    if hit_rate is not None:
        pooled = {"cache_hit_rate": hit_rate, "cache_fill_s": cache_fill_s(rounds)}
        params, compute = params.replace(**pooled), compute.replace(**pooled)
    return {
        "alpha": alpha,
        "alpha_source": alpha_source,
        "params": params,
        "params_source": sources,
        "params_compute": compute,
        "params_compute_source": compute_sources,
        "harness_overhead_ms": overhead,
    }


def _steady_alpha(spec: pd.DataFrame) -> tuple[float, str]:
    """alpha for the predictions: the one whose E(alpha, gamma) equals the tokens per round of
    the rounds the per-token statistic counts (``fit_alpha_tokens_per_round`` over each
    request's steady window, ``steady_windows``: neither its first round nor its final,
    cut-short one). The closed form predicts the steady state through E, and the first round's
    acceptance need not be the rest's (a prompt boundary; a stratified sequence's first draws).
    The pooled maximum-likelihood alpha, first rounds included, reads the steady window's tokens per
    round low enough to put speculative predictions a percent or two slow."""
    if spec.empty:
        return math.nan, "no speculative calibration rounds"
    window = steady_window_rounds(spec)
    what = "the requests' steady windows (first and final rounds out, as in the per-token statistic)"
    if window.empty:
        window, what = spec, "all of them (no request has a steady window)"
    alpha = fit_alpha_tokens_per_round(window)
    return alpha, (
        f"tokens per round: E(alpha, gamma) = the mean emitted over {len(window)} speculative "
        f"calibration rounds, {what}"
    )


def _fit_per_request(
    rounds: pd.DataFrame, requests: list[pd.DataFrame], assumed: ComputeTimes
) -> tuple[ComputeTimes, ComputeTimes, dict]:
    """(compute, params, overhead_ms): each the median over the requests' own fits."""
    fits = []
    for request_rounds in requests:
        request_compute, _ = fit_params(request_rounds, assumed)
        fits.append((request_compute, *fit_effective_params(request_rounds, request_compute)))
    compute = _median_times([f[0] for f in fits])
    params = _median_times([f[1] for f in fits])
    # t_draft_server is derived, not measured: take the median of the measured co-located
    # round (gamma*t_draft_server + t_verify in each request's fit) and derive it again, so the
    # co-located prediction is that median round over E (no clip at 0: in the client view
    # t_verify carries DSD's message overhead, which a co-located round does not pay).
    co_gammas = sorted({int(g) for g in rounds.loc[rounds["mode"] == COLOCATED, "gamma"]})
    estimates = []
    for gamma in co_gammas:
        co_round_s = np.median(
            [gamma * f[1].t_draft_server_s + f[1].t_verify_s(gamma) for f in fits if gamma in f[1].verify_table_s]
        )
        estimates.append((co_round_s - params.t_verify_s(gamma)) / gamma)
    if estimates:
        params = params.replace(t_draft_server_s=float(np.median(estimates)))
    overhead = {k: float(np.median([f[3][k] for f in fits if k in f[3]])) for k in set().union(*(f[3] for f in fits))}
    return compute, params, overhead


def _median_times(fits: list[ComputeTimes]) -> ComputeTimes:
    """Every fitted time the median over the fits; the table per gamma of the first fit."""

    def median(name: str) -> float:
        return float(np.median([getattr(f, name) for f in fits]))

    table = {
        g: float(np.median([f.verify_table_s[g] for f in fits if g in f.verify_table_s]))
        for g in fits[0].verify_table_s
    }
    return fits[0].replace(
        t_draft_edge_s=median("t_draft_edge_s"),
        t_draft_server_s=median("t_draft_server_s"),
        t_ar_s=median("t_ar_s"),
        t_verify_by_gamma_s=table,
    )


def prediction_rows(
    points: list[Point], calibration: dict, is_cal, now_s: float, wire: WireTerms | None = None, max_batch: int = 1
) -> list[dict]:
    """One row per planned point: its predicted per-token latency, and its group's predicted
    crossovers at its gamma and client count (every pair of dsd.analytic.queueing.FRONTIER_PAIRS); a point
    with a rate cap with the closed form's serialisation term (``wire``: what a round puts on the
    wire, orchestrator.analysis.wire). A point with more than one client is predicted by the
    queueing model (dsd.analytic.queueing: the calibration's times and the batch curve, its batch_slope,
    with the server's max_batch); one that cannot be (no batch curve) gets NaN."""
    alpha, params = calibration["alpha"], calibration["params"]
    utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now_s)) + f".{int(now_s % 1 * 1e6):06d}Z"
    rows = []
    for point in points:
        gamma_known = params.knows_gamma(point.gamma)
        ok = gamma_known and (not get_mode(point.mode).speculative or math.isfinite(alpha))
        crossable = gamma_known and math.isfinite(alpha)
        # NOTE: takes the calibration for one client's; a grid whose smallest client count is above one
        # calibrates with queueing already in its times, which these predictions then count twice.
        if point.clients > 1:
            per_token_ms, crossover_ms = _queueing_prediction(point, alpha, params, max_batch, ok, crossable)
        else:
            per_token_ms = (
                1e3
                * predict_per_token_s(
                    point.mode, alpha, point.gamma, point.rtt_ms / 1e3, **params.closed_form_terms(point.gamma)
                )
                if ok
                else math.nan
            )
            crossovers = predicted_crossovers(point.gamma, alpha, params) if crossable else {}
            crossover_ms = {name: crossovers.get(name, {}).get("rtt_ms", math.nan) for name in CROSSOVERS}
            crossover_ms |= {
                name: _queueing_crossover_ms(name, 1, alpha, point.gamma, params, 1) if crossable else math.nan
                for name in queueing.FRONTIER_PAIRS
                if name not in CROSSOVERS
            }
        if wire is not None and (point.rate_mbit or 0) > 0 and ok:
            per_token_ms += wire.ms_per_token(point, point.mode, alpha)
            crossover_ms = (
                wire.capped_crossovers(point, alpha, crossover_ms)
                if point.clients == 1
                else dict.fromkeys(crossover_ms, math.nan)
            )
        rows.append(
            {
                "point": point.key,
                **point.columns(),
                "group": point.group,
                "calibration": is_cal(point),
                "alpha_calibrated": alpha,
                "per_token_ms_predicted": per_token_ms,
                **{f"crossover_{name}_rtt_ms": value for name, value in crossover_ms.items()},
                "predicted_at_s": now_s,
                "predicted_utc": utc,
            }
        )
    return rows


def _queueing_prediction(
    point: Point, alpha: float, params: ComputeTimes, max_batch: int, ok: bool, crossable: bool
) -> tuple[float, dict[str, float]]:
    """(per-token ms, crossover name -> RTT ms) of a point with several clients (dsd.analytic.queueing);
    NaN where the times cannot answer (a batched server without a batch slope)."""
    try:
        per_token_ms = (
            1e3
            * queueing.per_token_s(point.mode, point.clients, alpha, point.gamma, point.rtt_ms / 1e3, params, max_batch)
            if ok
            else math.nan
        )
    except ValueError:
        per_token_ms = math.nan
    return per_token_ms, {
        name: _queueing_crossover_ms(name, point.clients, alpha, point.gamma, params, max_batch)
        if crossable
        else math.nan
        for name in queueing.FRONTIER_PAIRS
    }


def _queueing_crossover_ms(
    name: str, clients: int, alpha: float, gamma: int, params: ComputeTimes, max_batch: int
) -> float:
    """dsd.analytic.queueing's RTT*(N) in ms; NaN where the times cannot answer (no batch slope for a
    batched server, a client-view co-located round of no time)."""
    try:
        return 1e3 * queueing.crossover_rtt_s(name, clients, alpha, gamma, params, max_batch)
    except ValueError:
        return math.nan


@dataclass(frozen=True)
class WireTerms:
    """The serialisation term for predictions made before a capped point runs: the bytes a round
    of each mode carries, predicted (orchestrator.analysis.wire) where the wire schema says, else
    as the calibration points (uncapped) measured them; the cap itself only delays them."""

    vocab: int | None
    features: FeatureWire | None
    measured_bytes: dict[str, tuple[float, float]]  # mode -> (up, down) per round, calibration

    def ms_per_token(self, point: Point, mode: str, alpha: float) -> float:
        up, down = self.measured_bytes.get(mode, (math.nan, math.nan))
        tokens = expected_tokens_per_round(alpha, point.gamma) if get_mode(mode).speculative else 1.0
        row = {
            **point.columns(),
            "mode": mode,
            "tokens_per_round": tokens,
            "per_token_ms_predicted": 0.0,
            "wire_bytes_per_round_up": up,
            "wire_bytes_per_round_down": down,
        }
        value = add_wire_prediction(pd.DataFrame([row]), self.vocab, self.features)["serialisation_ms_per_token"]
        return float(value.iloc[0])

    def capped_crossovers(self, point: Point, alpha: float, uncapped_ms: dict[str, float]) -> dict[str, float]:
        """sync DSD's crossover with cloud AR moved by the cap: sync's per-token time grows by
        RTT / E, so a term of s_sync - s_ar ms a token takes E times as much RTT from the window;
        the pipelined modes' crossovers with co-located SD are not predicted under a cap (NaN)."""
        out = {name: math.nan for name in uncapped_ms}
        if "sync_vs_ar" in uncapped_ms:
            extra_ms = self.ms_per_token(point, SYNC, alpha) - self.ms_per_token(point, AR, alpha)
            out["sync_vs_ar"] = uncapped_ms["sync_vs_ar"] - extra_ms * expected_tokens_per_round(alpha, point.gamma)
        return out


def wire_terms(experiment, links: pd.DataFrame) -> WireTerms:
    """The sweep's WireTerms from its experiment and its calibration points' links.csv rows."""
    record = experiment_record(experiment)
    measured = {}
    if not links.empty and {"wire_bytes_per_round_up", "wire_bytes_per_round_down"} <= set(links):
        for mode, rows in links.groupby("mode"):
            measured[mode] = (
                float(rows["wire_bytes_per_round_up"].mean()),
                float(rows["wire_bytes_per_round_down"].mean()),
            )
    return WireTerms(experiment_vocab(record), experiment_features(record), measured)


class Predictor:
    """The sweep's predict hook (``run_sweep(predict=...)``): called with a calibration unit's
    planned points (``orchestrator.spec.plan.calibration_unit``) once its calibration points are done
    and before any other of its points runs."""

    def __init__(self, experiment, out_dir: Path, assumed_for) -> None:
        """assumed_for(point) -> the ComputeTimes the point's group runs with."""
        self.experiment, self.out_dir, self.assumed_for = experiment, Path(out_dir), assumed_for

    def __call__(self, unit_points: list[Point]) -> None:
        group = unit_points[0].group
        repeat = calibration_unit(unit_points[0], self.experiment)[1]
        if _already_predicted(read_predictions(self.out_dir), group, {p.repeat for p in unit_points}):
            return  # resume: the original predictions stand
        calibration_points = [p for p in unit_points if is_calibration(p, self.experiment)]
        measured_first = [
            p.key for p in unit_points if not is_calibration(p, self.experiment) and point_done(self.out_dir, p)
        ]
        if measured_first:
            self._record(
                group,
                repeat,
                {
                    "predicted": False,
                    "reason": (
                        f"{len(measured_first)} point(s) of this group were measured before any prediction "
                        "was written (a folder from an older version); no post-hoc predictions"
                    ),
                },
            )
            return
        rounds = _read_points_csv(self.out_dir, calibration_points, "rounds")
        calibration = calibrate(rounds, self.assumed_for(unit_points[0]))
        wire = wire_terms(self.experiment, _read_points_csv(self.out_dir, calibration_points, "links"))
        now_s = time.time()
        rows = prediction_rows(
            unit_points,
            calibration,
            lambda p: is_calibration(p, self.experiment),
            now_s,
            wire,
            self.experiment.max_batch,
        )
        append_predictions(self.out_dir, rows)
        self._record(
            group,
            repeat,
            {
                "predicted": True,
                "predicted_at_s": now_s,
                "calibration_points": [p.key for p in calibration_points],
                **calibration,
                "params": calibration["params"].to_dict(),
                "params_compute": calibration["params_compute"].to_dict(),
            },
        )

    def _record(self, group: str, repeat: int | None, entry: dict) -> None:
        """calibration.json: per group its first calibration's record; a later repeat's (calibrate =
        "every_repeat") under the group's "by_repeat"."""
        record = _read_json(self.out_dir / CALIBRATION)
        key = group or "all"
        previous = record.setdefault(key, {})
        if repeat:
            previous.setdefault("by_repeat", {})[str(repeat)] = entry
        else:
            record[key] = entry | {k: v for k, v in previous.items() if k == "by_repeat"}
        write_json(self.out_dir / CALIBRATION, record)


def _already_predicted(existing: pd.DataFrame | None, group: str, repeats: set[int]) -> bool:
    if existing is None:
        return False
    rows = existing[existing["group"].astype(object).fillna("").astype(str) == group]
    return bool(rows["repeat"].isin(repeats).any())  # every row has its point's repeat


def append_predictions(out_dir: Path, rows: list[dict]) -> None:
    """Append rows to predictions.csv; the bytes already there stay exactly as they were."""
    path = Path(out_dir) / PREDICTIONS
    old = path.read_text() if path.exists() else ""
    frame = pd.DataFrame(rows)
    text = old + frame.to_csv(index=False, header=not old)
    write_atomic(path, text)


def read_predictions(out_dir: Path) -> pd.DataFrame | None:
    path = Path(out_dir) / PREDICTIONS
    if not path.exists() or path.stat().st_size == 0:
        return None
    return pd.read_csv(path, keep_default_na=True)


def _read_points_csv(out_dir: Path, points: list[Point], name: str) -> pd.DataFrame:
    frames = []
    for point in points:
        path = Path(out_dir) / "points" / point.key / f"{name}.csv"
        if path.exists() and path.stat().st_size > 0:
            frame, _ = read_whole_rows(path.read_bytes())
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
