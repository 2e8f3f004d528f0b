"""Open-loop serving sweeps: the experiment's modes x [load] rates x repeats, each point one
arrival process served by one verifier and the experiment's edges, then a rate search.

    OUT/sweep.json, OUT/points/<key>/requests.csv (one row per request), done.json   as a sweep's
    OUT/prediction.json                        written before the first point (serving_prediction.py)
    OUT/requests.csv, OUT/points.csv, OUT/serving.json, OUT/*.png, OUT/report.md

A point's key is ``{mode}_rate{rate}rps_g{gamma}_r{repeat}``; its folder, resume, retries and
failure rows are the sweep's (orchestrator/sweep.py). Every mode at one (rate, repeat) gets the
same arrivals on the same edges (orchestrator/load.py, seeded by the experiment's seed and the
repeat). Per request (requests.csv): arrival time, its edge and link, whether it was admitted
and if not why (``refused_reason``; a refused request is a row, never dropped), queue time at
the verifier, TTFT, TPOT, e2e, tokens and ``slo_met``.

Launchers: ``sim`` serves on virtual time (orchestrator/serving_sim.py: seconds); ``loopback``,
``netns`` and ``compose`` run the services, one edge run per request, each posted ahead of its
arrival with the arrival as its start time (``start_at_unix_s``; containers read the host's
clock), so the edges issue requests at their arrival times whether or not earlier ones finished.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd

from dsd import latency_model as lm
from orchestrator import link_keys
from orchestrator.experiment import Experiment
from orchestrator.http_client import call
from orchestrator.load import Arrival, schedule
from orchestrator.serving_analysis import ServingModel, add_slo, max_rate, next_search_rate, point_figures
from orchestrator.serving_prediction import predict_serving
from orchestrator.serving_sim import SIM_MODES, ServingSetup, simulate_serving
from orchestrator.sweep import add_facts, host_facts, merge, prepare_out_dir, point_done, record_point

SERVING_LAUNCHERS = ("sim", "loopback", "netns", "compose")
PREDICTION = "prediction.json"
POST_LEAD_S = 2.0              # a run is posted this long before its arrival (connect, Hello)
RUN_PROBE_INTERVAL_MS = 3_600_000.0    # one request per run: no pings during it


@dataclass(frozen=True)
class ServingPoint:
    mode: str
    rate_rps: float | None         # None: a replayed trace's own rate
    gamma: int
    repeat: int
    searched: bool = False         # added by the rate search (not on the grid)

    @property
    def key(self) -> str:
        rate = "trace" if self.rate_rps is None else f"rate{self.rate_rps:.6g}rps"
        return f"{self.mode}_{rate}_g{self.gamma}_r{self.repeat}"

    def columns(self) -> dict:
        return {"mode": self.mode, "rate_rps": self.rate_rps, "gamma": self.gamma, "repeat": self.repeat,
                "searched": self.searched}


def plan_serving(experiment: Experiment) -> list[ServingPoint]:
    """The grid: repeats outermost, then rates, modes innermost (modes at one rate run together)."""
    rates = experiment.load.rate_rps or (None,)
    gamma = experiment.gamma[0]
    return [ServingPoint(mode, rate, gamma, repeat) for repeat in range(experiment.repeats) for rate in rates
            for mode in experiment.modes]


def check_serving(experiment: Experiment, launcher: str) -> None:
    """What an open-loop experiment cannot run, refused before anything starts."""
    if launcher not in SERVING_LAUNCHERS:
        raise ValueError(f"experiment key 'launcher': open-loop load ([load]) runs on {SERVING_LAUNCHERS}, "
                         f"got {launcher!r}")
    if launcher == "sim":
        bad = [m for m in experiment.modes if m not in SIM_MODES]
        if bad:
            raise ValueError(f"experiment key 'modes': the serving sim runs {SIM_MODES}, not {bad} "
                             "(use a network launcher)")
    if len(experiment.gamma) != 1 or experiment.alpha or isinstance(experiment.profile, tuple):
        raise ValueError("experiment key 'gamma': one gamma, one alpha and one profile with [load] "
                         "(the sweep's axes are mode and rate)")
    if experiment.load.arrival == "trace" and experiment.load.search_iterations:
        raise ValueError("experiment key 'load.search_iterations': no rate search with a trace (it has one rate)")


def edge_rtts_ms(experiment: Experiment) -> tuple[float, ...]:
    """Each edge's RTT: the experiment's first rtt_ms, or its [link] per-edge entries."""
    from orchestrator.sweep import Point

    axes = link_keys.link_axes(experiment)[0]
    base = Point(experiment.modes[0], gamma=experiment.gamma[0], clients=1, repeat=0, **axes)
    specs = link_keys.edge_specs(experiment.link, base, experiment.edges)
    return tuple(s.rtt_ms if s.rtt_ms is not None else s.delay_up_ms + s.delay_down_ms for s in specs)


def arrivals_for(experiment: Experiment, point: ServingPoint) -> list[Arrival]:
    seed = (experiment.load.seed if experiment.load.seed >= 0 else experiment.seed) * 1009 + point.repeat
    return schedule(experiment.load, point.rate_rps, experiment.edges, experiment.max_new_tokens, seed)


def serving_model(experiment: Experiment, times, gap_s: float = 0.0) -> ServingModel:
    """The prediction's inputs for this experiment (share per edge from the assignment)."""
    n = experiment.edges
    load = experiment.load
    if load.assignment == "weighted":
        weights = [load.weights[i % len(load.weights)] for i in range(n)]
        shares = tuple(w / sum(weights) for w in weights)
    else:
        shares = (1.0 / n,) * n
    lengths = [a.max_tokens for a in arrivals_for(experiment, ServingPoint(experiment.modes[0],
                                                                           (load.rate_rps or (None,))[0],
                                                                           experiment.gamma[0], 0))]
    tokens = round(sum(lengths) / len(lengths)) if lengths else experiment.max_new_tokens
    return ServingModel(times, experiment.gamma[0], experiment.backend.alpha, tokens, experiment.prompt_tokens,
                        edge_rtts_ms(experiment), shares, gap_s)


# ---- one point -------------------------------------------------------------------------------

def sim_setup(experiment: Experiment, mode: str, times) -> ServingSetup:
    return ServingSetup(mode, experiment.gamma[0], experiment.backend.alpha, times, edge_rtts_ms(experiment),
                        experiment.prompt_tokens, experiment.max_batch, experiment.load.max_sessions or 256)


def sim_seed(experiment: Experiment, repeat: int) -> int:
    return experiment.seed * 7919 + repeat


def run_sim_point(experiment: Experiment, point: ServingPoint, times) -> tuple:
    rows = simulate_serving(sim_setup(experiment, point.mode, times), arrivals_for(experiment, point),
                            seed=sim_seed(experiment, point.repeat))
    return [], finish_rows(pd.DataFrame(rows), experiment).to_dict("records"), [], {}


def write_prediction(out: Path, experiment: Experiment, times, launcher: str,
                     repeats: dict[str, int] | None = None) -> None:
    """OUT/prediction.json before the first point: the closed form's steady state per mode and, on
    a network launcher, the virtual-time model on the sweep's own arrival schedules (on the sim
    launcher that would be the run itself), each mode's over its ``repeats`` realisations (the
    experiment's repeats by default). A resumed sweep keeps the one it has."""
    path = Path(out) / PREDICTION
    if experiment.slo is None or path.exists():
        return
    modes = [m for m in experiment.modes if m in SIM_MODES]
    runs = {}
    if launcher != "sim" and experiment.load.arrival != "trace":
        for mode in modes:
            def schedules(rate_rps, mode=mode):
                return [(arrivals_for(experiment, ServingPoint(mode, rate_rps, experiment.gamma[0], r)),
                         sim_seed(experiment, r)) for r in range((repeats or {}).get(mode, experiment.repeats))]
            runs[mode] = (sim_setup(experiment, mode, times), schedules)
    prediction = predict_serving(serving_model(experiment, times), experiment.slo, modes, runs)
    path.write_text(json.dumps(_jsonable(prediction), indent=2))


def finish_rows(requests: pd.DataFrame, experiment: Experiment) -> pd.DataFrame:
    return add_slo(requests, experiment.slo)


def run_net_point(experiment: Experiment, point: ServingPoint, testbed, prompts: list[list[int]],
                  timeout_s: float = 900.0) -> tuple:
    """One open-loop point on a network testbed: each request a run on its edge, posted
    POST_LEAD_S before its arrival and started at it (the edge's start_at_unix_s), from a pool of
    posting threads, so a slow answer never delays a later arrival."""
    arrivals = arrivals_for(experiment, point)
    links = testbed.shape(link_keys.edge_specs(experiment.link, _link_point(experiment), len(testbed.edges)))
    attempt = os.urandom(3).hex()
    t0_unix_s = time.time() + POST_LEAD_S + 1.0
    runs = {}

    def post(a: Arrival) -> str:
        edge = testbed.edges[a.edge]
        run_id = f"serve-{point.key}-{attempt}-{a.index}"
        call("POST", f"{edge.control_url}/runs", token=edge.token, body={
            "run_id": run_id, "client_id": f"req{a.index}", "mode": point.mode, "gamma": point.gamma,
            "prompts": [prompts[a.index % len(prompts)]], "max_new_tokens": a.max_tokens,
            "verifier_url": testbed.verifier_url, "app_delay_ms": testbed.app_delay_ms(a.edge),
            "probe_count": 0, "probe_interval_ms": RUN_PROBE_INTERVAL_MS, "seed": experiment.seed + a.index,
            "start_at_unix_s": t0_unix_s + a.arrival_s, "stop_at_eos": False,
            **({"transport": experiment.transport} if experiment.transport != "ws" else {})})
        return run_id

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = {}
        for a in arrivals:                  # bounded: one post per arrival
            wait_s = t0_unix_s + a.arrival_s - POST_LEAD_S - time.time()
            if wait_s > 0:
                time.sleep(wait_s)
            futures[a.index] = pool.submit(post, a)
        for index, future in futures.items():
            try:
                runs[index] = (future.result(timeout=60), None)
            except Exception as exc:  # noqa: BLE001 - a post refused is the request's row
                runs[index] = (None, f"not posted: {type(exc).__name__}: {exc}")
    _wait_idle(testbed, t0_unix_s + (arrivals[-1].arrival_s if arrivals else 0.0) + timeout_s)
    rows = [_net_row(testbed, a, runs[a.index], t0_unix_s, links) for a in arrivals]
    return [], finish_rows(pd.DataFrame(rows), experiment).to_dict("records"), \
        [asdict(link) for link in links], {"t0_unix_s": t0_unix_s}


def _link_point(experiment: Experiment):
    from orchestrator.sweep import Point

    return Point(experiment.modes[0], gamma=experiment.gamma[0], clients=1, repeat=0,
                 **link_keys.link_axes(experiment)[0])


def _wait_idle(testbed, deadline_unix_s: float) -> None:
    """Until no edge has a run going (bounded by the deadline)."""
    while time.time() < deadline_unix_s:
        time.sleep(0.5)
        testbed.check()
        busy = [json.loads(call("GET", f"{e.control_url}/health", token=e.token))["runs"].get("running", 0)
                for e in testbed.edges]
        if not any(busy):
            return
    raise TimeoutError("open-loop runs unfinished at the point's deadline")


def _net_row(testbed, a: Arrival, posted: tuple, t0_unix_s: float, links) -> dict:
    """A request's row from its run's traces; a run that failed (a refusal by admission among
    them) is a row with its reason."""
    run_id, error = posted
    link = links[a.edge]
    row = {"request_index": a.index, "edge": a.edge, "arrival_s": a.arrival_s, "warmup": a.warmup,
           "link_rtt_configured_ms": link.rtt_configured_ms, "max_tokens": a.max_tokens, "admitted": False,
           "refused_reason": error or "", "start_lag_s": math.nan, "queue_s": math.nan, "ttft_s": math.nan,
           "tpot_s": math.nan, "e2e_s": math.nan, "tokens": 0, "rounds": 0, "server_passes": 0,
           "run_id": run_id or ""}
    if run_id is None:
        return row
    edge = testbed.edges[a.edge]
    try:
        requests = pd.read_csv(StringIO(call("GET", f"{edge.control_url}/runs/{run_id}/requests.csv",
                                             token=edge.token).decode()))
        rounds = pd.read_csv(StringIO(call("GET", f"{edge.control_url}/runs/{run_id}/rounds.csv",
                                           token=edge.token).decode()))
    except Exception as exc:  # noqa: BLE001 - recorded as the row's reason
        row["refused_reason"] = f"no trace: {type(exc).__name__}: {exc}"
        return row
    if requests.empty:
        row["refused_reason"] = "no request row"
        return row
    r = requests.iloc[0]
    if isinstance(r.get("error"), str) and r["error"]:
        row["refused_reason"] = refusal_reason(r["error"])
        return row
    live = rounds[rounds["emitted"] > 0] if len(rounds) else rounds
    lag_s = float(r["t_start_s"]) - (t0_unix_s + a.arrival_s)
    tokens = int(r["tokens"])
    first_s, last_s = (float(live["t_receive_s"].min()), float(live["t_receive_s"].max())) if len(live) \
        else (math.nan, math.nan)
    row.update(admitted=True, start_lag_s=lag_s, tokens=tokens, rounds=int(r["rounds"]),
               queue_s=float(rounds["server_queue_s"].fillna(0).sum()) if len(rounds) else 0.0,
               server_passes=len(rounds),
               ttft_s=lag_s + float(r["ttft_s"]), e2e_s=lag_s + float(r["wall_s"]),
               tpot_s=(last_s - first_s) / (tokens - 1) if tokens > 1 else math.nan)
    return row


def refusal_reason(error: str) -> str:
    """A run's error as a refusal reason: the verifier limit it names, else the error itself."""
    for limit in ("max_sessions_per_connection", "max_sessions", "max_inflight_per_connection",
                  "max_tokens_per_connection"):
        if limit in error:
            return f"limit {limit}"
    return error.strip().splitlines()[0][:300]


# ---- the sweep -------------------------------------------------------------------------------

def run_serving(experiment: Experiment, out: Path, resume: bool = False, launcher: str | None = None,
                progress=None, plan: list[ServingPoint] | None = None, open_step: float = 1.0) -> pd.DataFrame:
    """Run the grid (or ``plan``: points of its own, e.g. each mode at its own rates over its own
    realisations), then the rate search, into ``out``; analyse it. The search runs each new rate
    over the realisations (repeats) its mode's planned points ran, so every rate of a mode pools
    the same ones; ``open_step`` is its step while no bracket is open (``next_search_rate``).
    Returns points.csv's table."""
    from orchestrator.run import choose_launcher

    launcher = choose_launcher(launcher or experiment.launcher)
    check_serving(experiment, launcher)
    out = Path(out)
    times = serving_times(experiment, out)
    facts = {**host_facts(), "launcher": launcher, "costs": times.to_dict(), "serving": True,
             "edge_rtt_ms": list(edge_rtts_ms(experiment))}
    prepare_out_dir(out, experiment, resume, facts)
    write_prediction(out, experiment, times, launcher)
    testbed = None
    try:
        if launcher == "sim":
            def run_point(point):
                return run_sim_point(experiment, point, times)
        else:
            testbed = open_serving_testbed(experiment, launcher, out / "services")
            if launcher == "compose":       # project, image, engine, adopted or brought up
                add_facts(out, _jsonable({"testbed": testbed.facts()}))
            prompts = _prompts(experiment)

            def run_point(point):
                return run_net_point(experiment, point, testbed, prompts)
        plan = plan or plan_serving(experiment)
        for point in plan:
            _record(out, point, run_point, experiment, testbed, progress)
        for mode in experiment.modes:
            repeats = sorted({p.repeat for p in plan if p.mode == mode}) or range(experiment.repeats)
            for _ in range(experiment.load.search_iterations if experiment.slo else 0):
                rate = next_search_rate(_mode_points(out, experiment, mode), experiment.slo.attainment,
                                        open_step=open_step)
                if rate is None:
                    break
                for repeat in repeats:
                    point = ServingPoint(mode, round(rate, 4), experiment.gamma[0], repeat, searched=True)
                    _record(out, point, run_point, experiment, testbed, progress)
    finally:
        if testbed is not None:
            testbed.close()
    merge(out)
    return analyze_serving(out, experiment, times)


def serving_times(experiment: Experiment, out: Path):
    """The compute times an open-loop sweep runs and predicts with (recorded ones on resume)."""
    from orchestrator.run import times_for

    return times_for(experiment.for_group(experiment.profiles()[0], experiment.alphas()[0]), Path(out))


def _record(out: Path, point: ServingPoint, run_point, experiment, testbed, progress) -> dict:
    if point_done(out, point):
        return {}
    done = record_point(out, point, run_point, experiment, testbed.heal if testbed is not None else None)
    if progress:
        progress(point, done)
    return done


def _mode_points(out: Path, experiment: Experiment, mode: str) -> pd.DataFrame:
    rows = []
    for done_path in sorted((out / "points").glob(f"{mode}_*/done.json")):
        path = done_path.parent / "requests.csv"
        if path.exists() and path.stat().st_size:
            requests = pd.read_csv(path)
            rows.append({"rate_rps": float(requests["rate_rps"].iloc[0]), **point_figures(requests)})
    return pd.DataFrame(rows)


def _prompts(experiment: Experiment) -> list[list[int]]:
    from orchestrator.workload import load_prompts

    return load_prompts(experiment.backend, experiment.workload, 64, experiment.prompt_tokens, experiment.seed)


def open_serving_testbed(experiment: Experiment, launcher: str, work_dir: Path):
    """The services for an open-loop run: every edge of the experiment, the verifier's admission
    limit from [load] max_sessions (a flag on loopback and netns, DSD_MAX_SESSIONS on compose)."""
    from orchestrator import leftovers
    from orchestrator.launchers.services_config import ServicesConfig
    from orchestrator.run import launcher_errors

    profile = experiment.hardware_profile(experiment.profile) if experiment.profile else None
    max_sessions = experiment.load.max_sessions
    extra = ("--max-sessions", str(max_sessions)) if max_sessions and launcher != "compose" else ()
    config = ServicesConfig(experiment.backend, profile, n_edges=experiment.edges, max_batch=experiment.max_batch,
                            batch_window_ms=experiment.batch_window_ms, work_dir=str(work_dir),
                            extra_verifier_args=extra)
    with launcher_errors(launcher, "to start"):
        if launcher == "loopback":
            from orchestrator.launchers.loopback import LoopbackTestbed
            return LoopbackTestbed(config)
        leftovers.refuse_if_any(services=launcher == "netns")
        if launcher == "compose":
            from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed
            # a project that is up is used if it matches (admission limit included), and left up
            return ComposeTestbed(ComposeConfig.from_services(
                config, adopt="auto", max_sessions=max_sessions or ComposeConfig.max_sessions))
        from orchestrator.launchers.netns import NetnsTestbed
        return NetnsTestbed(config)


# ---- analysis --------------------------------------------------------------------------------

def analyze_serving(out: Path, experiment: Experiment, times) -> pd.DataFrame:
    """points.csv (one row per point), serving.json (per mode: the largest rate at the attainment
    level with its CI, beside what prediction.json predicted before the points ran), the plots and
    report.md."""
    out = Path(out)
    requests = pd.read_csv(out / "requests.csv") if (out / "requests.csv").stat().st_size else pd.DataFrame()
    rows = []
    for key, group in requests.groupby("point", sort=False):
        first = group.iloc[0]
        rows.append({"point": key, "mode": first["mode"], "rate_rps": first["rate_rps"], "gamma": first["gamma"],
                     "repeat": first["repeat"], "searched": first["searched"], **point_figures(group)})
    points = pd.DataFrame(rows).sort_values(["mode", "rate_rps", "repeat"]) if rows else pd.DataFrame()
    points.to_csv(out / "points.csv", index=False)
    summary = {"slo": asdict(experiment.slo) if experiment.slo else None, "load": _jsonable(asdict(experiment.load)),
               "modes": {}}
    if experiment.slo is not None and not points.empty:
        prediction = _prediction(out, experiment, times)
        for mode in experiment.modes:
            summary["modes"][mode] = _mode_summary(points[points["mode"] == mode], experiment.slo.attainment,
                                                   prediction["modes"].get(mode, {}))
        summary["prediction_made_before_points"] = prediction["made_before_points"]
        gamma = experiment.gamma[0]
        summary["capacity_factor_closed_form"] = lm.capacity_factor(gamma, times.t_draft_server_s,
                                                                    times.t_verify_s(gamma))
        summary["tokens_per_round"] = lm.expected_tokens_per_round(experiment.backend.alpha, gamma)
    (out / "serving.json").write_text(json.dumps(_jsonable(summary), indent=2))
    from orchestrator.serving_report import write_serving_report
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
    prediction = predict_serving(serving_model(experiment, times), experiment.slo, modes, {})
    return {**_jsonable(prediction), "made_before_points": False}


def _mode_summary(mine: pd.DataFrame, level: float, predicted: dict) -> dict:
    """One mode's row of serving.json: the measured largest rate and its CI; the run's prediction
    (``predicted_*``, ``rate_err_pct``) where one was made, the closed form's steady state
    (``steady_*``) beside it; the goodput and the stationarity check (the share of repeats still
    building their queue) at the evaluated rate nearest the measured largest rate."""
    measured = max_rate(mine, level) if len(mine) else {}
    rate = measured.get("max_rate_rps", math.nan)

    def err_pct(reference) -> float:
        return 100 * (rate - reference) / reference if reference else math.nan

    row = {**measured, "predicted_max_rate_rps": predicted.get("run_max_rate_rps"),
           "predicted_ci_low_rps": predicted.get("run_max_rate_ci_low_rps"),
           "predicted_ci_high_rps": predicted.get("run_max_rate_ci_high_rps"),
           "rate_err_pct": err_pct(predicted.get("run_max_rate_rps")),
           "steady_max_rate_rps": predicted.get("steady_max_rate_rps"),
           "steady_err_pct": err_pct(predicted.get("steady_max_rate_rps")),
           "saturation_rps": predicted.get("saturation_rps")}
    at = mine.loc[(mine["rate_rps"] - rate).abs().idxmin()] if len(mine) and math.isfinite(rate) else None
    row["goodput_at_max_rps"] = float(at["goodput_rps"]) if at is not None else math.nan
    # the share of the repeats there whose queue was still building (each flags by chance ~4%)
    row["queue_growing_at_max"] = float(mine[mine["rate_rps"] == at["rate_rps"]]["queue_growing"].mean()) \
        if at is not None else None
    return row


def _jsonable(value):
    """Plain JSON: tuples as lists, non-finite numbers as null, anything else as its text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (float, np.floating, np.integer)):
        if isinstance(value, np.integer):
            return int(value)
        number = float(value)
        return number if math.isfinite(number) else None
    return value if value is None or isinstance(value, (str, int, bool)) else str(value)
