"""Glue for the CLI: run an experiment on its launcher, then analyze the sweep folder."""
from __future__ import annotations

import contextlib
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
from dsd.timing import measure_times
from orchestrator import cpus, leftovers
from orchestrator.experiment import Experiment
from orchestrator.launchers.base import LauncherError
from orchestrator.launchers.loopback import LoopbackTestbed, ServicesConfig
from orchestrator.links import check_launcher
from orchestrator.net_point import run_net_point
from orchestrator.predictions import Predictor
from orchestrator.sim_launcher import Costs
from orchestrator.sim_point import run_sim_point
from orchestrator.summary import analyze_sweep  # noqa: F401  (the CLI's and tests' entry point)
from orchestrator.sweep import check_out_dir, group_experiment, host_facts, plan_points, point_done, run_sweep
from orchestrator.workload import describe, experiment_prompts, prompts_for_point


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
    if experiment.backend.emulated:
        profile = experiment.hardware_profile(experiment.profile)
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
        leftovers.refuse_if_any(services=launcher == "netns")
    if launcher == "compose":
        check_compose_groups(experiment)
    plan = plan_points(experiment)
    first = group_experiment(experiment, plan[0])
    pairs = {first.backend: load_pair(first.backend)}       # per alpha, for the sim launcher
    draft, target = pairs[first.backend]
    costs = {name: costs_for(experiment.for_group(name, first.alphas()[0]), draft, target, out)
             for name in experiment.profiles()}
    pool = experiment_prompts(experiment)
    prompts = functools.partial(prompts_for_point, pool, experiment)     # point -> its prompts
    # Made at the first point's end: a testbed that fails to start leaves one error line, no bar.
    bars: list[tqdm] = []

    def progress(done: int, total: int, point, status: str) -> None:
        if not sys.stderr.isatty():   # a log (`docker compose logs`, CI): one plain line per point
            print(f"{experiment.name}: point {done}/{total} {point.key}: {status}", file=sys.stderr, flush=True)
            return
        if not bars:
            bars.append(tqdm(total=len(plan), desc=experiment.name, unit="point", file=sys.stderr))
        bar = bars[0]
        bar.update(1)
        bar.set_postfix_str(f"{point.key}: {status}"[:60])

    common = {"costs": asdict(costs[first.profile]), "launcher": launcher, "workload": describe(pool),
              "costs_source": "profile " + first.profile if experiment.backend.emulated
              else "measured here (dsd.timing)"}
    if len(costs) > 1:
        common["costs_by_profile"] = {name: asdict(c) for name, c in costs.items()}
    trace = experiment.backend.trace() if experiment.backend.kind == "synthetic" else None
    if trace is not None:
        common["acceptance_trace"] = trace.summary()
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
            if hasattr(testbed, "facts"):       # compose: project, image, engine, adopted or brought up
                facts["testbed"] = testbed.facts()
            pinning = facts["cpu_pinning"]
            if pinning["pinned"]:
                pinning["orchestrator_applied"] = cpus.pin_self(pinning)
            net_point = functools.partial(run_net_point,
                                          after_shape=lambda bed: cpus.pin_testbed(bed, pinning)
                                          if pinning["pinned"] else None,
                                          warmup=experiment.warmup_requests,
                                          max_new_tokens=experiment.max_new_tokens,
                                          max_in_flight=experiment.max_in_flight,
                                          run_prefix=time.strftime("%Y%m%dT%H%M%S"), link_options=experiment.link,
                                          controller=experiment.controller, gamma_max=experiment.gamma_max)

            def run_point(point):
                return net_point(point, testbed=testbeds.for_point(point), prompts=prompts(point))

            return run_sweep(experiment, out, run_point, facts, resume=resume, progress=progress,
                             heal=testbeds.heal, predict=predict)
    finally:
        os.sched_setaffinity(0, own_cpus)
        for bar in bars:
            bar.close()


def cpu_plan_for(launcher: str, experiment: Experiment, n_edges: int) -> dict:
    """The CPU sets of this sweep's processes, recorded in sweep.json (orchestrator/cpus.py).
    NOTE: compose would take `cpuset` per service; not wired yet, so compose runs unpinned."""
    if launcher == "compose":
        return {"pinned": False, "disjoint": False, "sets": {}, "cpus": cpus.usable_cpus(),
                "reason": "compose launcher: cpuset per service not wired yet; not pinned"}
    if launcher in ("swarm", "external"):
        return {"pinned": False, "disjoint": False, "sets": {}, "cpus": cpus.usable_cpus(),
                "reason": f"{launcher} launcher: the services run in containers or on other machines; not pinned"}
    return cpus.plan_cpus(cpus.usable_cpus(), n_edges, experiment.cpu_pinning)


def assumed_costs(point, experiment: Experiment, costs: dict) -> dict:
    """The compute times a point's group runs with, as the closed form's parameters."""
    c = costs[group_experiment(experiment, point).profile]
    return {"t_draft_edge_s": c.t_draft_edge_s, "t_draft_server_s": c.t_draft_server_s, "t_ar_s": c.t_ar_s,
            "t_verify_s": {int(g): v for g, v in c.t_verify_s.items()}}


def sim_group_point(point, experiment: Experiment, costs: dict, prompts, pairs: dict):
    """One point on the sim launcher with its group's models (alpha) and compute costs (profile);
    prompts(point) gives its prompts; pairs caches the (draft, target) of each backend config."""
    group = group_experiment(experiment, point)
    if group.backend not in pairs:
        pairs[group.backend] = load_pair(group.backend)
    draft, target = pairs[group.backend]
    return run_sim_point(point, draft=draft, target=target, prompts=prompts(point), warmup=experiment.warmup_requests,
                         max_new_tokens=experiment.max_new_tokens, max_in_flight=experiment.max_in_flight,
                         costs=costs[group.profile], controller=experiment.controller,
                         gamma_max=experiment.gamma_max)


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
        testbed, self.testbed, self.group = self.testbed, None, None
        if testbed is not None:
            with launcher_errors(self.launcher, "to stop"):
                testbed.close()

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


@contextlib.contextmanager
def launcher_errors(launcher: str, doing: str):
    """Whatever a launcher raises while starting or stopping a testbed (a namespace it may not
    make, an engine that does not answer, a service that exits) as one LauncherError, which the
    CLI prints as one line. Bad config (ValueError) passes through: it names its key already."""
    try:
        yield
    except (LauncherError, ValueError):
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised, with the original chained for --debug
        raise LauncherError(f"the {launcher} launcher failed {doing}: {type(exc).__name__}: {exc}") from exc


def check_compose_groups(experiment: Experiment) -> None:
    """A compose project that is already up serves one (profile, alpha) group: refuse a sweep of
    several before anything runs, rather than fail every point of the second group."""
    from orchestrator.launchers.compose import ComposeError, project_is_up

    groups = len(experiment.profiles()) * len(experiment.alphas())
    if groups > 1 and project_is_up("dsdbed"):
        raise ComposeError(
            f"the running compose project 'dsdbed' serves one (profile, alpha) group and the experiment has "
            f"{groups}; fix: `docker compose down` and the sweep brings up each group's project in turn, "
            "or sweep one profile and alpha per experiment file")


def open_testbed(launcher: str, experiment: Experiment, work_dir: Path):
    with launcher_errors(launcher, "to start"):
        return _open_testbed(launcher, experiment, work_dir)


def _open_testbed(launcher: str, experiment: Experiment, work_dir: Path):
    profile = experiment.hardware_profile(experiment.profile) if experiment.profile else None
    config = ServicesConfig(experiment.backend, profile, n_edges=min(experiment.edges, max(experiment.clients)),
                            max_batch=experiment.max_batch, batch_window_ms=experiment.batch_window_ms,
                            work_dir=str(work_dir))
    if launcher == "loopback":
        return LoopbackTestbed(config)
    if launcher == "netns":
        from orchestrator.launchers.netns import NetnsTestbed
        return NetnsTestbed(config)
    if launcher == "compose":
        from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed
        # A project that is up (`docker compose up -d`) is used if it matches, and left up.
        return ComposeTestbed(ComposeConfig.from_services(config, adopt="auto"))
    if launcher == "swarm":
        from orchestrator.launchers.swarm import SwarmTestbed
        return SwarmTestbed(config)
    if launcher == "external":
        from orchestrator.launchers.external import ExternalTestbed
        return ExternalTestbed(experiment.external, n_edges=config.n_edges)
    raise ValueError(f"unknown launcher {launcher!r}")
