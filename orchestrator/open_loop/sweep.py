"""Running an open-loop serving sweep (its plan: open_loop/plan.py): the experiment's modes x
[load] rates x repeats (x [load] RTTs for a rate map), each point one arrival process served by
one verifier and the experiment's edges, then a rate search per mode (and RTT); analysed by
open_loop/analyze.py.

    OUT/sweep.json, OUT/points/<key>/requests.csv (one row per request), done.json   as a sweep's
    OUT/prediction.json                        written before the first point (open_loop/prediction.py)
    OUT/requests.csv, OUT/points.csv, OUT/serving.json, OUT/*.png, OUT/report.md

A point's key is ``{mode}_rate{rate}rps_g{gamma}_r{repeat}`` (``{mode}_rtt{rtt}ms_rate...`` in a
rate map); its folder, resume, retries and failure rows are the sweep's
(orchestrator/records/sweep_folder.py). Every mode at one (rate, repeat) gets the same arrivals
on the same edges (orchestrator/spec/arrivals.py, seeded by the experiment's seed and the
repeat). Per request (requests.csv): arrival time, its edge and link, whether it was admitted
and if not why (``refused_reason``; a refused request is a row, never dropped), queue time at
the verifier, TTFT, TPOT, e2e, tokens and ``slo_met``.

Launchers: ``sim`` serves on virtual time (orchestrator/open_loop/sim.py: seconds); ``loopback``,
``netns`` and ``compose`` run the services, one edge run per request, each posted ahead of its
arrival with the arrival as its start time (``start_at_unix_s``; containers read the host's
clock), so the edges issue requests at their arrival times whether or not earlier ones finished.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import math
import os
import time
from dataclasses import asdict
from io import StringIO
from pathlib import Path

import pandas as pd

from orchestrator.common import cpus
from orchestrator.common.files import jsonable, write_json
from orchestrator.common.host import host_facts
from orchestrator.common.http_client import call
from orchestrator.launchers import leftovers
from orchestrator.launchers.base import PointSettings
from orchestrator.launchers.control_api import run_body
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.links import keys as link_keys
from orchestrator.open_loop.analyze import analyze_serving
from orchestrator.open_loop.figures import add_slo, next_search_rate, point_figures
from orchestrator.open_loop.plan import (
    PREDICTION,
    ServingPoint,
    arrivals_for,
    check_serving,
    edge_rtts_ms,
    link_point,
    map_rtts_ms,
    plan_serving,
    serving_model,
    sim_seed,
    sim_setup,
)
from orchestrator.open_loop.prediction import predict_serving
from orchestrator.open_loop.rate_map import predict_rate_map
from orchestrator.open_loop.sim import SIM_MODES, simulate_serving
from orchestrator.records.sweep_folder import add_facts, merge, point_done, prepare_out_dir, record_point
from orchestrator.running.run import (
    choose_launcher,
    cpu_plan_for,
    launcher_errors,
    point_settings,
    times_for,
    verifier_link_args,
)
from orchestrator.spec.arrivals import OpenLoopRequest
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.workload import load_prompts

POST_LEAD_S = 2.0  # a run is posted this long before its arrival (connect, Hello)
RUN_PROBE_INTERVAL_MS = 3_600_000.0  # one request per run: no pings during it


def run_sim_point(experiment: Experiment, point: ServingPoint, times) -> tuple:
    rows = simulate_serving(
        sim_setup(experiment, point.mode, times, point.rtt_ms),
        arrivals_for(experiment, point),
        seed=sim_seed(experiment, point.repeat),
    )
    return [], finish_rows(pd.DataFrame(rows), experiment).to_dict("records"), [], {}


def write_prediction(
    out: Path, experiment: Experiment, times, launcher: str, repeats: dict[str, int] | None = None
) -> None:
    """OUT/prediction.json before the first point: the closed form's steady state per mode and, on
    a network launcher, the virtual-time model on the sweep's own arrival schedules (on the sim
    launcher that would be the run itself), each mode's over its ``repeats`` realisations (the
    experiment's repeats by default). A resumed sweep keeps the one it has."""
    path = Path(out) / PREDICTION
    if experiment.slo is None or path.exists():
        return
    modes = [m for m in experiment.modes if m in SIM_MODES]
    if experiment.load.rtt_ms:
        # NOTE: a rate map predicts with the closed form alone; on a network launcher it gets no
        # virtual-time prediction of its own runs, so its points are judged against the process.
        models = {rtt: serving_model(experiment, times, rtt_ms=rtt) for rtt in map_rtts_ms(experiment)}
        write_json(path, predict_rate_map(models, experiment.slo, modes))
        return
    runs = {}
    if launcher != "sim" and experiment.load.arrival_process != "trace":
        for mode in modes:

            def schedules(rate_rps, mode=mode):
                return [
                    (
                        arrivals_for(experiment, ServingPoint(mode, rate_rps, experiment.gamma[0], r)),
                        sim_seed(experiment, r),
                    )
                    for r in range((repeats or {}).get(mode, experiment.repeats))
                ]

            runs[mode] = (sim_setup(experiment, mode, times), schedules)
    prediction = predict_serving(serving_model(experiment, times), experiment.slo, modes, runs)
    write_json(path, prediction)


def finish_rows(requests: pd.DataFrame, experiment: Experiment) -> pd.DataFrame:
    """A point's request rows with whether each met the SLO, and the sampling setting it ran with."""
    return add_slo(requests, experiment.slo).assign(**asdict(experiment.sampling_settings()[0]))


def run_open_loop_point(
    experiment: Experiment,
    point: ServingPoint,
    testbed,
    prompts: list[list[int]],
    settings: PointSettings,
    timeout_s: float = 900.0,
) -> tuple:
    """One open-loop point on a network testbed: each request a run on its edge, posted
    POST_LEAD_S before its arrival and started at it (the edge's start_at_unix_s), from a pool of
    posting threads, so a slow answer never delays a later arrival. Every run carries the
    experiment's sampling setting (request i samples with its seed + i) and ``settings``, the
    point settings a closed-loop sweep runs with."""
    arrivals = arrivals_for(experiment, point)
    links = testbed.shape(
        link_keys.edge_specs(experiment.link, link_point(experiment, point.rtt_ms), len(testbed.edges))
    )
    masks = settings.after_shape(testbed) if settings.after_shape is not None else None
    t0_unix_s = time.time() + POST_LEAD_S + 1.0
    runs = _post_arrivals(experiment, point, testbed, prompts, settings, arrivals, t0_unix_s)
    _wait_idle(testbed, t0_unix_s + (arrivals[-1].arrival_s if arrivals else 0.0) + timeout_s)
    rows = [_net_row(testbed, a, runs[a.index], t0_unix_s, links) for a in arrivals]
    return (
        [],
        finish_rows(pd.DataFrame(rows), experiment).to_dict("records"),
        [asdict(link) for link in links],
        {"t0_unix_s": t0_unix_s, **({"cpu_masks": masks} if masks else {})},
    )


def _post_arrivals(
    experiment: Experiment,
    point: ServingPoint,
    testbed,
    prompts: list[list[int]],
    settings: PointSettings,
    arrivals: list[OpenLoopRequest],
    t0_unix_s: float,
) -> dict[int, tuple]:
    """Each arrival posted as a run on its edge POST_LEAD_S before it, from a pool of posting
    threads; returns request index -> (run id, None) or (None, why it was not posted)."""
    attempt = os.urandom(3).hex()
    sampling = experiment.sampling_settings()[0]
    runs = {}

    def post(a: OpenLoopRequest) -> str:
        edge = testbed.edges[a.edge]
        run_id = f"serve-{point.key}-{attempt}-{a.index}"
        call(
            "POST",
            f"{edge.control_url}/runs",
            token=edge.token,
            body=run_body(
                settings,
                run_id=run_id,
                client_id=f"req{a.index}",
                mode=point.mode,
                gamma=point.gamma,
                sampling={**sampling.run_fields(), "seed": sampling.sampling_seed + a.index},
                prompts=[prompts[a.index % len(prompts)]],
                max_new_tokens=a.max_tokens,
                verifier_url=testbed.verifier_url,
                app_delay_ms=testbed.app_delay_ms(a.edge),
                probe_count=0,
                probe_interval_ms=RUN_PROBE_INTERVAL_MS,
                start_at_unix_s=t0_unix_s + a.arrival_s,
                stop_at_eos=False,
            ),
        )
        return run_id

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        futures = {}
        for a in arrivals:  # bounded: one post per arrival
            wait_s = t0_unix_s + a.arrival_s - POST_LEAD_S - time.time()
            if wait_s > 0:
                time.sleep(wait_s)
            futures[a.index] = pool.submit(post, a)
        for index, future in futures.items():
            try:
                runs[index] = (future.result(timeout=60), None)
            except Exception as exc:  # noqa: BLE001 - a post refused is the request's row
                runs[index] = (None, f"not posted: {type(exc).__name__}: {exc}")
    return runs


def _wait_idle(testbed, deadline_unix_s: float) -> None:
    """Until no edge has a run going (bounded by the deadline)."""
    while time.time() < deadline_unix_s:
        time.sleep(0.5)
        testbed.check()
        busy = [
            json.loads(call("GET", f"{e.control_url}/health", token=e.token))["runs"].get("running", 0)
            for e in testbed.edges
        ]
        if not any(busy):
            return
    raise TimeoutError("open-loop runs unfinished at the point's deadline")


def _net_row(testbed, a: OpenLoopRequest, posted: tuple, t0_unix_s: float, links) -> dict:
    """A request's row from its run's traces; a run that failed (a refusal by admission among
    them) is a row with its reason."""
    run_id, error = posted
    row = _unanswered_row(a, links[a.edge], run_id, error)
    if run_id is None:
        return row
    edge = testbed.edges[a.edge]
    try:
        requests = pd.read_csv(
            StringIO(call("GET", f"{edge.control_url}/runs/{run_id}/requests.csv", token=edge.token).decode())
        )
        rounds = pd.read_csv(
            StringIO(call("GET", f"{edge.control_url}/runs/{run_id}/rounds.csv", token=edge.token).decode())
        )
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
    first_s, last_s = (
        (float(live["t_receive_s"].min()), float(live["t_receive_s"].max())) if len(live) else (math.nan, math.nan)
    )
    row.update(
        admitted=True,
        start_lag_s=lag_s,
        tokens=tokens,
        rounds=int(r["rounds"]),
        queue_s=float(rounds["server_queue_s"].fillna(0).sum()) if len(rounds) else 0.0,
        server_passes=len(rounds),
        ttft_s=lag_s + float(r["ttft_s"]),
        e2e_s=lag_s + float(r["wall_s"]),
        tpot_s=(last_s - first_s) / (tokens - 1) if tokens > 1 else math.nan,
    )
    return row


def _unanswered_row(a: OpenLoopRequest, link, run_id: str | None, error: str | None) -> dict:
    """A request's row before its traces are read: not admitted, no times, ``error`` its reason."""
    return {
        "request_index": a.index,
        "edge": a.edge,
        "arrival_s": a.arrival_s,
        "warmup": a.warmup,
        "link_rtt_configured_ms": link.rtt_configured_ms,
        "max_tokens": a.max_tokens,
        "admitted": False,
        "refused_reason": error or "",
        "start_lag_s": math.nan,
        "queue_s": math.nan,
        "ttft_s": math.nan,
        "tpot_s": math.nan,
        "e2e_s": math.nan,
        "tokens": 0,
        "rounds": 0,
        "server_passes": 0,
        "run_id": run_id or "",
    }


def refusal_reason(error: str) -> str:
    """A run's error as a refusal reason: the verifier limit it names, else the error itself."""
    for limit in (
        "max_sessions_per_connection",
        "max_sessions",
        "max_inflight_per_connection",
        "max_tokens_per_connection",
    ):
        if limit in error:
            return f"limit {limit}"
    return error.strip().splitlines()[0][:300]


# ---- the sweep -------------------------------------------------------------------------------


def run_serving(
    experiment: Experiment,
    out: Path,
    resume: bool = False,
    launcher: str | None = None,
    on_point_done=None,
    plan: list[ServingPoint] | None = None,
    open_step: float = 1.0,
) -> pd.DataFrame:
    """Run the grid (or ``plan``: points of its own, e.g. each mode at its own rates over its own
    realisations), then the rate search, into ``out``; analyse it. The search runs each new rate
    over the realisations (repeats) its mode's planned points ran, so every rate of a mode pools
    the same ones; ``open_step`` is its step while no bracket is open (``next_search_rate``);
    on_point_done(point, its done record) is called after each point that ran. Returns points.csv's
    table."""
    launcher = choose_launcher(launcher or experiment.launcher)
    check_serving(experiment, launcher)
    out = Path(out)
    times = serving_times(experiment, out)
    prepare_out_dir(out, experiment, resume, _serving_facts(experiment, launcher, times))
    write_prediction(out, experiment, times, launcher)
    testbed = None
    own_cpus = os.sched_getaffinity(0)  # the orchestrator's pinning ends with the sweep
    try:
        if launcher == "sim":

            def run_point(point):
                return run_sim_point(experiment, point, times)
        else:
            testbed = open_serving_testbed(experiment, launcher, out / "services")
            if launcher == "compose":  # project, image, engine, adopted or brought up
                add_facts(out, jsonable({"testbed": testbed.facts()}))
            prompts = _prompts(experiment)
            settings = _pinned_settings(experiment, launcher, testbed, out)

            def run_point(point):
                return run_open_loop_point(experiment, point, testbed, prompts, settings)

        plan = plan or plan_serving(experiment)
        for point in plan:
            _record(out, point, run_point, experiment, testbed, on_point_done)
        _search_rates(out, experiment, plan, run_point, testbed, on_point_done, open_step)
    finally:
        os.sched_setaffinity(0, own_cpus)
        if testbed is not None:
            testbed.close()
    merge(out)
    return analyze_serving(out, experiment, times)


def _serving_facts(experiment: Experiment, launcher: str, times) -> dict:
    """sweep.json's record of an open-loop sweep: the host, the launcher, the costs and each edge's RTT."""
    return {
        **host_facts(),
        "launcher": launcher,
        "costs": times.to_dict(),
        "serving": True,
        "edge_rtt_ms": [list(edge_rtts_ms(experiment, rtt)) for rtt in map_rtts_ms(experiment)]
        if experiment.load.rtt_ms
        else list(edge_rtts_ms(experiment)),
    }


def _search_rates(
    out: Path, experiment: Experiment, plan: list[ServingPoint], run_point, testbed, on_point_done, open_step: float
) -> None:
    """The rate search per RTT and mode (with an SLO): each new rate over the realisations its
    mode's planned points ran, until next_search_rate has none."""
    for rtt_ms, mode in itertools.product(map_rtts_ms(experiment), experiment.modes):
        repeats = sorted({p.repeat for p in plan if p.mode == mode}) or range(experiment.repeats)
        for _ in range(experiment.load.search_iterations if experiment.slo else 0):
            rate = next_search_rate(_mode_points(out, mode, rtt_ms), experiment.slo.attainment, open_step=open_step)
            if rate is None:
                break
            for repeat in repeats:
                point = ServingPoint(mode, round(rate, 4), experiment.gamma[0], repeat, searched=True, rtt_ms=rtt_ms)
                _record(out, point, run_point, experiment, testbed, on_point_done)


def _pinned_settings(experiment: Experiment, launcher: str, testbed, out: Path) -> PointSettings:
    """The point settings of a closed-loop sweep on this testbed, the CPU pinning included (its
    plan goes to sweep.json as a closed-loop sweep's does)."""
    pinning = cpu_plan_for(launcher, experiment, len(testbed.edges))
    if pinning["pinned"]:
        pinning["orchestrator_applied"] = cpus.pin_self(pinning)
    add_facts(out, jsonable({"cpu_pinning": pinning}))
    return point_settings(experiment, pinning)


def serving_times(experiment: Experiment, out: Path):
    """The compute times an open-loop sweep runs and predicts with (recorded ones on resume)."""
    return times_for(experiment.for_group(experiment.profiles()[0], experiment.alphas()[0]), Path(out))


def _record(out: Path, point: ServingPoint, run_point, experiment, testbed, on_point_done) -> dict:
    if point_done(out, point):
        return {}
    done = record_point(out, point, run_point, experiment, testbed.heal if testbed is not None else None)
    if on_point_done:
        on_point_done(point, done)
    return done


def _mode_points(out: Path, mode: str, rtt_ms: float | None) -> pd.DataFrame:
    """The figures of one mode's finished points (at one RTT of a rate map)."""
    rows = []
    prefix = f"{mode}_" if rtt_ms is None else f"{mode}_rtt{rtt_ms:.6g}ms_"
    for done_path in sorted((out / "points").glob(f"{prefix}*/done.json")):
        path = done_path.parent / "requests.csv"
        if path.exists() and path.stat().st_size:
            requests = pd.read_csv(path)
            rows.append({"rate_rps": float(requests["rate_rps"].iloc[0]), **point_figures(requests)})
    return pd.DataFrame(rows)


def _prompts(experiment: Experiment) -> list[list[int]]:
    return load_prompts(experiment.backend, experiment.workload, 64, experiment.prompt_tokens, experiment.seed)


def open_serving_testbed(experiment: Experiment, launcher: str, work_dir: Path):
    """The services for an open-loop run: every edge of the experiment, the verifier's admission
    limit from [load] max_sessions (a flag on loopback and netns, DSD_MAX_SESSIONS on compose)."""
    profile = experiment.hardware_profile(experiment.profile) if experiment.profile else None
    max_sessions = experiment.load.max_sessions
    extra = (
        ("--max-sessions", str(max_sessions)) if max_sessions and launcher != "compose" else ()
    ) + verifier_link_args(experiment)
    config = ServicesConfig(
        experiment.backend,
        profile,
        n_edges=experiment.edges,
        max_batch=experiment.max_batch,
        batch_window_ms=experiment.batch_window_ms,
        work_dir=str(work_dir),
        extra_verifier_args=extra,
    )
    with launcher_errors(launcher, "to start"):
        if launcher == "loopback":
            from orchestrator.launchers.loopback import LoopbackTestbed

            return LoopbackTestbed(config)
        leftovers.refuse_if_any(services=launcher == "netns")
        if launcher == "compose":
            from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed

            # a project that is up is used if it matches (admission limit included), and left up
            return ComposeTestbed(
                ComposeConfig.from_services(
                    config, adopt="auto", max_sessions=max_sessions or ComposeConfig.max_sessions
                )
            )
        from orchestrator.launchers.netns import NetnsTestbed

        return NetnsTestbed(config)
