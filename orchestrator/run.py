"""Glue for the CLI: run an experiment on its launcher, then analyze the sweep folder."""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from dsd.backends.factory import load_pair
from dsd.profiles import get_profile
from dsd.timing import measure_times
from orchestrator import analysis, leftovers, plots
from orchestrator.experiment import Experiment
from orchestrator.launchers.loopback import LoopbackTestbed, ServicesConfig
from orchestrator.net_point import run_net_point
from orchestrator.sim_launcher import Costs
from orchestrator.sim_point import run_sim_point
from orchestrator.sweep import check_out_dir, host_facts, plan_points, run_sweep
from orchestrator.workload import make_prompts


def costs_for(experiment: Experiment, draft, target, out: Path) -> Costs:
    """Compute costs: recorded ones on resume, a hardware profile for synthetic models, and
    otherwise measured here and now."""
    sidecar = out / "sweep.json"
    if sidecar.exists():
        recorded = json.loads(sidecar.read_text()).get("costs")
        if recorded:
            recorded["t_verify_s"] = {int(k): v for k, v in recorded["t_verify_s"].items()}
            return Costs(**recorded)
    if experiment.backend.kind == "synthetic":
        profile = get_profile(experiment.profile)
        return Costs(profile.t_draft_edge_s, profile.t_draft_server_s, profile.t_ar_s,
                     {g: profile.t_verify_s(g) for g in experiment.gamma}, profile.t_prefill_per_token_s)
    print("measuring compute times of the model pair on this machine ...", file=sys.stderr)
    times = measure_times(draft, target, gammas=tuple(experiment.gamma))
    return Costs(times.t_draft_s, times.t_draft_s, times.t_ar_s, dict(times.t_verify_s),
                 times.t_prefill_per_token_s)


def run_experiment(experiment: Experiment, out: Path, resume: bool) -> pd.DataFrame:
    out = Path(out)
    check_out_dir(out, experiment, resume)          # refuse before anything starts
    launcher = choose_launcher(experiment.launcher)
    if launcher in ("netns", "compose"):
        leftovers.refuse_if_any()
    draft, target = load_pair(experiment.backend)
    costs = costs_for(experiment, draft, target, out)
    n_prompts = experiment.warmup_requests + experiment.requests
    prompts = make_prompts(experiment.backend, n_prompts, experiment.prompt_tokens, experiment.seed)
    bar = tqdm(total=len(plan_points(experiment)), desc=experiment.name, unit="point", file=sys.stderr)

    def progress(done: int, total: int, point, status: str) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{point.key}: {status}"[:60])

    common = {"costs": asdict(costs), "launcher": launcher,
              "costs_source": "profile " + experiment.profile if experiment.backend.kind == "synthetic"
              else "measured here (dsd.timing)"}
    try:
        if launcher == "sim":
            facts = {**host_facts(), **common, "shaper_backend": "none (virtual link)"}
            run_point = functools.partial(run_sim_point, draft=draft, target=target, prompts=prompts,
                                          warmup=experiment.warmup_requests,
                                          max_new_tokens=experiment.max_new_tokens,
                                          max_in_flight=experiment.max_in_flight, costs=costs)
            return run_sweep(experiment, out, run_point, facts, resume=resume, progress=progress)
        del draft, target          # the services load their own copies
        with open_testbed(launcher, experiment, out / "services") as testbed:
            facts = {**host_facts(), **common, "shaper_backend": testbed.shaper,
                     "shaper_reason": getattr(testbed, "shaper_reason", "")}
            run_point = functools.partial(run_net_point, testbed=testbed, prompts=prompts,
                                          warmup=experiment.warmup_requests,
                                          max_new_tokens=experiment.max_new_tokens,
                                          max_in_flight=experiment.max_in_flight, seed=experiment.seed,
                                          run_prefix=time.strftime("%Y%m%dT%H%M%S"))
            return run_sweep(experiment, out, run_point, facts, resume=resume, progress=progress,
                             heal=testbed.heal)
    finally:
        bar.close()


def choose_launcher(requested: str) -> str:
    """auto: network namespaces as root, else loopback.

    NOTE: compose joins auto once its end-to-end test passes here; until then ask for it by name.
    """
    if requested != "auto":
        return requested
    if os.geteuid() == 0 and shutil.which("ip") and shutil.which("iptables"):
        return "netns"
    return "loopback"


def open_testbed(launcher: str, experiment: Experiment, work_dir: Path):
    profile = get_profile(experiment.profile) if experiment.profile else None
    config = ServicesConfig(experiment.backend, profile, n_edges=min(experiment.edges, max(experiment.clients)),
                            max_batch=experiment.max_batch, batch_window_ms=experiment.batch_window_ms,
                            work_dir=str(work_dir))
    if launcher == "loopback":
        return LoopbackTestbed(config)
    if launcher == "netns":
        from orchestrator.launchers.netns import NetnsTestbed
        return NetnsTestbed(config)
    if launcher == "compose":
        from orchestrator.launchers.compose import ComposeTestbed
        return ComposeTestbed(config)
    raise ValueError(f"unknown launcher {launcher!r}")


def analyze_sweep(out: Path) -> dict:
    out = Path(out)
    sweep = json.loads((out / "sweep.json").read_text())
    requests = pd.read_csv(out / "requests.csv")
    rounds = pd.read_csv(out / "rounds.csv") if (out / "rounds.csv").stat().st_size else pd.DataFrame()
    if requests.empty:
        raise ValueError(f"{out}: no finished requests to analyze")
    costs = sweep["costs"]
    assumed = {"t_draft_edge_s": costs["t_draft_edge_s"], "t_draft_server_s": costs["t_draft_server_s"],
               "t_ar_s": costs["t_ar_s"], "t_verify_s": {int(k): v for k, v in costs["t_verify_s"].items()}}
    params, params_source = analysis.fit_params(rounds, assumed)
    spec_rounds = rounds[rounds["mode"] != "ar"] if len(rounds) else rounds
    alpha = analysis.fit_alpha(spec_rounds) if len(spec_rounds) else math.nan
    points = analysis.add_predictions(analysis.point_table(requests, rounds), alpha, params)
    points.to_csv(out / "points.csv", index=False)
    gamma = int(sweep["experiment"]["gamma"][0])
    measured = analysis.measured_crossovers(points, gamma)
    predicted = analysis.predicted_crossovers(gamma, alpha, params)
    crossovers = {name: {"measured_rtt_ms": measured.get(name, {}).get("rtt_ms", math.nan),
                         "measured_rtt_ms_min": measured.get(name, {}).get("rtt_ms_min", math.nan),
                         "measured_rtt_ms_max": measured.get(name, {}).get("rtt_ms_max", math.nan),
                         "predicted_rtt_ms": predicted[name]["rtt_ms"]}
                  for name in analysis.CROSSOVERS}
    summary = {"alpha_fitted": alpha, "params": params, "params_source": params_source,
               "params_assumed": assumed, "gamma": gamma,
               "capacity_factor_predicted": 1 + gamma * params["t_draft_edge_s"] / params["t_verify_s"][gamma],
               "crossovers": crossovers, "launcher": sweep["launcher"],
               "shaper_backend": sweep["shaper_backend"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    plots.plot_latency_vs_rtt(points, gamma, alpha, params, measured, predicted,
                              out / "latency_vs_rtt.png",
                              f"{sweep['experiment']['name']}: gamma={gamma}, alpha={alpha:.2f}, "
                              f"launcher={sweep['launcher']}", sweep["launcher"])
    return summary
