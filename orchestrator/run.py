"""Glue for the CLI: run an experiment on its launcher, then analyze the sweep folder."""
from __future__ import annotations

import functools
import json
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
from orchestrator import cpus, leftovers
from orchestrator.experiment import Experiment
from orchestrator.launchers.loopback import LoopbackTestbed, ServicesConfig
from orchestrator.links import check_launcher
from orchestrator.net_point import run_net_point
from orchestrator.predictions import Predictor
from orchestrator.sim_launcher import Costs
from orchestrator.sim_point import run_sim_point
from orchestrator.summary import analyze_sweep  # noqa: F401  (the CLI's and tests' entry point)
from orchestrator.sweep import check_out_dir, group_experiment, host_facts, plan_points, point_done, run_sweep
from orchestrator.workload import make_prompts


def costs_for(experiment: Experiment, draft, target, out: Path) -> Costs:
    """Compute costs: recorded ones on resume, a hardware profile for synthetic models, and
    otherwise measured here and now."""
    sidecar = out / "sweep.json"
    if sidecar.exists():
        data = json.loads(sidecar.read_text())
        recorded = data.get("costs_by_profile", {}).get(experiment.profile) or data.get("costs")
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
    check_launcher(experiment, launcher)
    if launcher in ("netns", "compose"):
        leftovers.refuse_if_any()
    plan = plan_points(experiment)
    first = group_experiment(experiment, plan[0])
    pairs = {first.backend: load_pair(first.backend)}       # per alpha, for the sim launcher
    draft, target = pairs[first.backend]
    costs = {name: costs_for(experiment.for_group(name, first.backend.alpha), draft, target, out)
             for name in experiment.profiles()}
    n_prompts = experiment.warmup_requests + experiment.requests
    prompts = make_prompts(experiment.backend, n_prompts, experiment.prompt_tokens, experiment.seed)
    bar = tqdm(total=len(plan), desc=experiment.name, unit="point", file=sys.stderr)

    def progress(done: int, total: int, point, status: str) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{point.key}: {status}"[:60])

    common = {"costs": asdict(costs[first.profile]), "launcher": launcher,
              "costs_source": "profile " + first.profile if experiment.backend.kind == "synthetic"
              else "measured here (dsd.timing)"}
    if len(costs) > 1:
        common["costs_by_profile"] = {name: asdict(c) for name, c in costs.items()}
    own_cpus = os.sched_getaffinity(0)           # the orchestrator's pinning ends with the sweep
    predict = Predictor(experiment, out, functools.partial(assumed_costs, experiment=experiment, costs=costs))
    try:
        if launcher == "sim":
            facts = {**host_facts(), **common, "shaper_backend": "none (virtual link)",
                     "cpu_pinning": {"pinned": False, "disjoint": False, "sets": {},
                                     "reason": "sim launcher: one process on virtual time, nothing to isolate"}}
            run_point = functools.partial(sim_group_point, experiment=experiment, costs=costs, prompts=prompts,
                                          pairs=pairs)
            return run_sweep(experiment, out, run_point, facts, resume=resume, progress=progress, predict=predict)
        del draft, target, pairs   # the services load their own copies
        with GroupTestbeds(launcher, experiment, out / "services") as testbeds:
            testbed = testbeds.for_point(next((p for p in plan if not point_done(out, p)), plan[0]))
            facts = {**host_facts(), **common, "shaper_backend": testbed.shaper,
                     "shaper_reason": getattr(testbed, "shaper_reason", ""),
                     "cpu_pinning": cpu_plan_for(launcher, experiment, len(testbed.edges))}
            pinning = facts["cpu_pinning"]
            if pinning["pinned"]:
                pinning["orchestrator_applied"] = cpus.pin_self(pinning)
            net_point = functools.partial(run_net_point, prompts=prompts,
                                          after_shape=lambda bed: cpus.pin_testbed(bed, pinning)
                                          if pinning["pinned"] else None,
                                          warmup=experiment.warmup_requests,
                                          max_new_tokens=experiment.max_new_tokens,
                                          max_in_flight=experiment.max_in_flight, seed=experiment.seed,
                                          run_prefix=time.strftime("%Y%m%dT%H%M%S"), link_options=experiment.link)

            def run_point(point):
                return net_point(point, testbed=testbeds.for_point(point))

            return run_sweep(experiment, out, run_point, facts, resume=resume, progress=progress,
                             heal=testbeds.heal, predict=predict)
    finally:
        os.sched_setaffinity(0, own_cpus)
        bar.close()


def cpu_plan_for(launcher: str, experiment: Experiment, n_edges: int) -> dict:
    """The CPU sets of this sweep's processes, recorded in sweep.json (orchestrator/cpus.py).
    NOTE: compose would take `cpuset` per service; not wired yet, so compose runs unpinned."""
    if launcher == "compose":
        return {"pinned": False, "disjoint": False, "sets": {}, "cpus": cpus.usable_cpus(),
                "reason": "compose launcher: cpuset per service not wired yet; not pinned"}
    return cpus.plan_cpus(cpus.usable_cpus(), n_edges, experiment.cpu_pinning)


def assumed_costs(point, experiment: Experiment, costs: dict) -> dict:
    """The compute times a point's group runs with, as the closed form's parameters."""
    c = costs[group_experiment(experiment, point).profile]
    return {"t_draft_edge_s": c.t_draft_edge_s, "t_draft_server_s": c.t_draft_server_s, "t_ar_s": c.t_ar_s,
            "t_verify_s": {int(g): v for g, v in c.t_verify_s.items()}}


def sim_group_point(point, experiment: Experiment, costs: dict, prompts: list[list[int]], pairs: dict):
    """One point on the sim launcher with its group's models (alpha) and compute costs (profile);
    pairs caches the (draft, target) of each backend config for this sweep."""
    group = group_experiment(experiment, point)
    if group.backend not in pairs:
        pairs[group.backend] = load_pair(group.backend)
    draft, target = pairs[group.backend]
    return run_sim_point(point, draft=draft, target=target, prompts=prompts, warmup=experiment.warmup_requests,
                         max_new_tokens=experiment.max_new_tokens, max_in_flight=experiment.max_in_flight,
                         costs=costs[group.profile])


class GroupTestbeds:
    """One testbed at a time, for the (profile, alpha) group of the point being run. The plan
    runs each group's points together, so each group starts its services once."""

    def __init__(self, launcher: str, experiment: Experiment, work_dir: Path) -> None:
        self.launcher, self.experiment, self.work_dir = launcher, experiment, Path(work_dir)
        self.group: Experiment | None = None
        self.testbed = None

    def for_point(self, point):
        group = group_experiment(self.experiment, point)
        if group != self.group:
            self.close()
            self.testbed = open_testbed(self.launcher, group, self.work_dir / point.group)
            self.group = group
        return self.testbed

    def heal(self) -> list[str]:
        """Before a retry: heal the testbed of the group that is running (see Testbed.heal)."""
        return self.testbed.heal() if self.testbed is not None else []

    def close(self) -> None:
        if self.testbed is not None:
            self.testbed.close()
        self.testbed, self.group = None, None

    def __enter__(self) -> "GroupTestbeds":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
