"""Glue for the CLI: run an experiment on its launcher, then analyze the sweep folder."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from dsd.backends.factory import load_pair
from dsd.drive.batching import BatchingConfig
from dsd.costs.compute_times import ComputeTimes
from dsd.costs.measurement import measure_times
from orchestrator.analysis.predictions import Predictor
from orchestrator.common import cpus
from orchestrator.common.host import host_facts
from orchestrator.launchers import leftovers
from orchestrator.launchers.base import LauncherError, PointSettings
from orchestrator.launchers.loopback import LoopbackTestbed
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.launchers.sim import SimTestbed, check_clients_settings
from orchestrator.links.keys import check_launcher
from orchestrator.records.sweep_folder import check_out_dir, merge, point_done, record_point, run_sweep
from orchestrator.running.regime import announce_regime
from orchestrator.running.repeat_until_ci import run_repeats_until_ci
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.plan import point_experiment, plan_points, prompts_for_point
from orchestrator.spec.workload import describe, experiment_categories, experiment_prompts


def run_experiment(experiment: Experiment, out: Path, resume: bool) -> pd.DataFrame:
    """Run the experiment's plan on its launcher into the sweep folder ``out``: one testbed per
    (profile, alpha) group at a time, each point run by the testbed (launchers/base.py). ``out``
    is made absolute first: the services run in other working directories (a network namespace,
    a container)."""
    out = Path(out).absolute()
    launcher = check_before_start(experiment, out, resume)
    plan = plan_points(experiment)
    pairs = functools.cache(load_pair)  # backend config -> (draft, target)
    times = group_times(experiment, plan, pairs, out)
    regime = announce_regime(experiment, next(iter(times.values())))
    if launcher != "sim":
        pairs.cache_clear()  # the services load their own copies
    pool = experiment_prompts(experiment)
    prompts = functools.partial(prompts_for_point, pool, experiment)  # point -> its prompts
    pool_categories = experiment_categories(experiment)
    categories = functools.partial(
        prompts_for_point, pool_categories if any(pool_categories) else [], experiment
    )  # point -> its prompts' categories
    predict = Predictor(experiment, out, functools.partial(assumed_times, experiment=experiment, times=times))
    progress = Progress(experiment.name, len(plan))
    own_cpus = os.sched_getaffinity(0)  # the orchestrator's pinning ends with the sweep
    try:
        with GroupTestbeds(launcher, experiment, out / "services", times, pairs) as testbeds:
            testbed = testbeds.for_point(next((p for p in plan if not point_done(out, p)), plan[0]))
            facts = sweep_facts(experiment, launcher, testbed, times, pool)
            if regime is not None:
                facts["regime"] = regime
            settings = point_settings(experiment, facts["cpu_pinning"])

            def run_point(point):
                with_categories = dataclasses.replace(settings, categories=tuple(categories(point)))
                return testbeds.for_point(point).run_point(point, prompts(point), with_categories)

            done = run_sweep(
                experiment, out, run_point, facts, resume=resume, progress=progress, heal=testbeds.heal, predict=predict
            )
            if experiment.adaptive_budget_points:  # repeats where a crossover's interval is wide
                run_repeats_until_ci(
                    experiment,
                    out,
                    lambda p: record_point(out, p, run_point, experiment, testbeds.heal),
                    experiment.gamma[0],
                    on_point_added=lambda p: progress(len(plan), len(plan), p, "repeat until CI"),
                )
                done = merge(out)
            return done
    finally:
        os.sched_setaffinity(0, own_cpus)
        progress.close()


def check_before_start(experiment: Experiment, out: Path, resume: bool) -> str:
    """Refuse what cannot run before anything starts; returns the launcher to run on."""
    check_out_dir(out, experiment, resume)
    launcher = choose_launcher(experiment.launcher)
    check_launcher(experiment, launcher)
    if launcher == "sim":
        check_clients_settings(max(experiment.clients), experiment.controller)
    if launcher in ("netns", "compose"):
        leftovers.refuse_if_any(services=launcher == "netns")
    if launcher == "compose":
        check_compose_groups(experiment)
    return launcher


def group_times(experiment: Experiment, plan: list, pairs, out: Path) -> dict[str, ComputeTimes]:
    """Each profile's compute times (measured with the first point's model pair where measured)."""
    alpha = point_experiment(experiment, plan[0]).alphas()[0]
    return {name: times_for(experiment.for_group(name, alpha), out, pairs) for name in experiment.profiles()}


def times_for(experiment: Experiment, out: Path, pairs=load_pair) -> ComputeTimes:
    """Compute times: recorded ones on resume, a hardware profile for synthetic models (its
    t_verify line tabulated at the sweep's gammas, as sweep.json records it), and otherwise
    measured here and now on pairs(experiment.backend)'s (draft, target)."""
    sidecar = out / "sweep.json"
    if sidecar.exists():
        data = json.loads(sidecar.read_text())
        recorded = data.get("costs_by_profile", {}).get(experiment.profile) or data.get("costs")
        if recorded:
            return ComputeTimes.from_dict(recorded)
    if experiment.backend.emulated:
        return experiment.hardware_profile(experiment.profile).times.tabulated(experiment.gamma)
    print(
        "measuring compute times of the model pair on this machine (one thread, as the services run) ...",
        file=sys.stderr,
    )
    draft, target = pairs(experiment.backend)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return measure_times(draft, target, gammas=tuple(experiment.gamma)).times
    finally:
        torch.set_num_threads(threads)


def sweep_facts(experiment: Experiment, launcher: str, testbed, times: dict, pool) -> dict:
    """sweep.json's record of where and with what the sweep ran; pins this process where the
    CPU plan says so."""
    first = point_experiment(experiment, plan_points(experiment)[0]).profile
    facts = {
        **host_facts(),
        "costs": times[first].to_dict(),
        "launcher": launcher,
        "workload": describe(pool),
        "costs_source": "profile " + first if experiment.backend.emulated else "measured here (dsd.costs.measurement)",
    }
    if len(times) > 1:
        facts["costs_by_profile"] = {name: t.to_dict() for name, t in times.items()}
    trace = experiment.backend.trace() if experiment.backend.kind == "synthetic" else None
    if trace is not None:
        facts["acceptance_trace"] = trace.summary()
    facts.update(
        {
            "shaper_backend": testbed.shaper,
            "shaper_reason": getattr(testbed, "shaper_reason", ""),
            "cpu_pinning": cpu_plan_for(launcher, experiment, len(testbed.edges)),
        }
    )
    if hasattr(testbed, "facts"):  # compose: project, image, engine, adopted or brought up
        facts["testbed"] = testbed.facts()
    pinning = facts["cpu_pinning"]
    if pinning["pinned"]:
        pinning["orchestrator_applied"] = cpus.pin_self(pinning)
    return facts


def point_settings(experiment: Experiment, pinning: dict | None = None) -> PointSettings:
    """What every point runs with; after shaping, the testbed's processes are pinned where the
    CPU plan says so."""
    pinned = pinning is not None and pinning["pinned"]
    return PointSettings(
        warmup=experiment.warmup_requests,
        max_new_tokens=experiment.max_new_tokens,
        max_in_flight=experiment.max_in_flight,
        controller=experiment.controller,
        gamma_max=experiment.gamma_max,
        controller_modes=experiment.controller_modes,
        transport=experiment.transport,
        request_deadline_s=experiment.request_deadline_s,
        tcp_rto_max_ms=experiment.tcp_rto_max_ms,
        cache=experiment.cache,
        run_prefix=time.strftime("%Y%m%dT%H%M%S"),
        link_options=experiment.link,
        after_shape=(lambda bed: cpus.pin_testbed(bed, pinning)) if pinned else None,
    )


class Progress:
    """A sweep's progress: a bar on a terminal, made at the first point's end (a testbed that
    fails to start leaves one error line, no bar); in a log (`docker compose logs`, CI) one plain
    line per point."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total = name, total
        self.bar: tqdm | None = None

    def __call__(self, done: int, total: int, point, status: str) -> None:
        if not sys.stderr.isatty():
            print(f"{self.name}: point {done}/{total} {point.key}: {status}", file=sys.stderr, flush=True)
            return
        if self.bar is None:
            self.bar = tqdm(total=self.total, desc=self.name, unit="point", file=sys.stderr)
        self.bar.update(1)
        self.bar.set_postfix_str(f"{point.key}: {status}"[:60])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cpu_plan_for(launcher: str, experiment: Experiment, n_edges: int) -> dict:
    """The CPU sets of this sweep's processes, recorded in sweep.json (orchestrator/common/cpus.py); on
    compose the verifier's and the edges' sets are their containers' cpusets."""
    if launcher == "sim":
        return {
            "pinned": False,
            "disjoint": False,
            "sets": {},
            "reason": "sim launcher: one process on virtual time, nothing to isolate",
        }
    if launcher in ("swarm", "external"):
        return {
            "pinned": False,
            "disjoint": False,
            "sets": {},
            "cpus": cpus.usable_cpus(),
            "reason": f"{launcher} launcher: the services run in containers or on other machines; not pinned",
        }
    return cpus.plan_cpus(cpus.usable_cpus(), n_edges, experiment.cpu_pinning)


def assumed_times(point, experiment: Experiment, times: dict) -> ComputeTimes:
    """The compute times a point's group runs with (the closed form's parameters before any fit)."""
    return times[point_experiment(experiment, point).profile]


class GroupTestbeds:
    """One testbed at a time, for the (profile, alpha) group of the point being run. The plan
    runs each group's points together, so each group starts its services once."""

    def __init__(self, launcher: str, experiment: Experiment, work_dir: Path, times: dict, pairs) -> None:
        self.launcher, self.experiment, self.work_dir = launcher, experiment, Path(work_dir)
        self.times, self.pairs = times, pairs  # the sim launcher's compute times and model pairs
        self.group: Experiment | None = None
        self.testbed = None

    def for_point(self, point):
        group = point_experiment(self.experiment, point)
        if group != self.group:
            self.close()
            self.testbed = open_testbed(self.launcher, group, self.work_dir / point.group, self.times, self.pairs)
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

    def __enter__(self) -> GroupTestbeds:
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
            "or sweep one profile and alpha per experiment file"
        )


def open_testbed(launcher: str, experiment: Experiment, work_dir: Path, times: dict, pairs):
    """The testbed of one (profile, alpha) group; the sim launcher's runs with times[profile] and
    pairs(backend)'s model pair."""
    with launcher_errors(launcher, "to start"):
        if launcher == "sim":
            return SimTestbed(
                *pairs(experiment.backend),
                times[experiment.profile],
                BatchingConfig(experiment.max_batch, experiment.batch_window_ms),
            )
        return _open_testbed(launcher, experiment, work_dir)


def verifier_link_args(experiment: Experiment) -> tuple[str, ...]:
    """The verifier's end of the experiment's link settings (the edges' come with each run)."""
    return ("--tcp-rto-max-ms", str(experiment.tcp_rto_max_ms)) if experiment.tcp_rto_max_ms else ()


def _open_testbed(launcher: str, experiment: Experiment, work_dir: Path):
    profile = experiment.hardware_profile(experiment.profile) if experiment.profile else None
    config = ServicesConfig(
        experiment.backend,
        profile,
        n_edges=min(experiment.edges, max(experiment.clients)),
        max_batch=experiment.max_batch,
        batch_window_ms=experiment.batch_window_ms,
        work_dir=str(work_dir),
        extra_verifier_args=verifier_link_args(experiment),
    )
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
