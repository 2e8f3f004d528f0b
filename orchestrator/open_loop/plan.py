"""The plan of an open-loop serving sweep: its points ([load] RTT x repeat x rate x mode), what it cannot
run (refused before anything starts), each point's arrivals, and the inputs of its models (the
closed form's steady state, the virtual-time serving sim)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from orchestrator.links import keys as link_keys
from orchestrator.open_loop.figures import ServingModel
from orchestrator.open_loop.sim import SIM_MODES, ServingSetup
from orchestrator.spec.arrivals import OpenLoopRequest, schedule
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.plan import Point
from services.verifier.limits import VerifierLimits

SERVING_LAUNCHERS = ("sim", "loopback", "netns", "compose")
PREDICTION = "prediction.json"


@dataclass(frozen=True)
class ServingPoint:
    mode: str
    rate_rps: float | None  # None: a replayed trace's own rate
    gamma: int
    repeat: int
    searched: bool = False  # added by the rate search (not on the grid)
    rtt_ms: float | None = None  # a rate map's RTT, every edge's ([load] rtt_ms); None: the experiment's links

    @property
    def key(self) -> str:
        rate = "trace" if self.rate_rps is None else f"rate{self.rate_rps:.6g}rps"
        rtt = "" if self.rtt_ms is None else f"rtt{self.rtt_ms:.6g}ms_"
        return f"{self.mode}_{rtt}{rate}_g{self.gamma}_r{self.repeat}"

    def columns(self) -> dict:
        return {
            "mode": self.mode,
            "rate_rps": self.rate_rps,
            "gamma": self.gamma,
            "repeat": self.repeat,
            "searched": self.searched,
            **({} if self.rtt_ms is None else {"rtt_ms": self.rtt_ms}),
        }


def map_rtts_ms(experiment: Experiment) -> tuple[float | None, ...]:
    """The RTTs of a rate map ([load] rtt_ms), or (None,): one pass at the experiment's links."""
    return tuple(float(r) for r in experiment.load.rtt_ms) or (None,)


def plan_serving(experiment: Experiment) -> list[ServingPoint]:
    """The grid: RTTs outermost (a rate map's), then repeats, then rates, modes innermost (modes at
    one rate run together)."""
    rates = experiment.load.rate_rps or (None,)
    gamma = experiment.gamma[0]
    return [
        ServingPoint(mode, rate, gamma, repeat, rtt_ms=rtt)
        for rtt in map_rtts_ms(experiment)
        for repeat in range(experiment.repeats)
        for rate in rates
        for mode in experiment.modes
    ]


def check_serving(experiment: Experiment, launcher: str) -> None:
    """What an open-loop experiment cannot run, refused before anything starts."""
    if launcher not in SERVING_LAUNCHERS:
        raise ValueError(
            f"experiment key 'launcher': open-loop load ([load]) runs on {SERVING_LAUNCHERS}, got {launcher!r}"
        )
    if launcher == "sim":
        bad = [m for m in experiment.modes if m not in SIM_MODES]
        if bad:
            raise ValueError(
                f"experiment key 'modes': the serving sim runs {SIM_MODES}, not {bad} (use a network launcher)"
            )
    if len(experiment.gamma) != 1 or experiment.alpha or isinstance(experiment.profile, tuple):
        raise ValueError(
            "experiment key 'gamma': one gamma, one alpha and one profile with [load] "
            "(the sweep's axes are mode and rate)"
        )
    if experiment.load.arrival_process == "trace" and experiment.load.search_iterations:
        raise ValueError("experiment key 'load.search_iterations': no rate search with a trace (it has one rate)")
    if len(experiment.sampling_settings()) != 1:
        raise ValueError(
            "experiment key 'sampling': one sampling setting with [load] (the sweep's axes are mode and rate)"
        )
    if experiment.link.schedule:
        raise ValueError(
            "experiment key 'link.schedule': an open-loop sweep runs no link schedule (a fixed link per edge)"
        )
    if experiment.adaptive_budget_points:
        raise ValueError(
            "experiment key 'adaptive_budget_points': repeats until CI narrow crossovers of a closed-"
            "loop sweep; none with [load]"
        )
    defaults = {f.name: f.default for f in fields(Experiment)}
    if experiment.load.rtt_ms:
        _check_rate_map(experiment, defaults)
    closed_loop = {
        "clients": experiment.clients != (1,),
        "requests": experiment.requests != defaults["requests"],
        "warmup_requests": experiment.warmup_requests != defaults["warmup_requests"],
        "rtt_ms": len(link_keys.link_axes(experiment)) > (len(experiment.rtt_ms) if experiment.load.rtt_ms else 1),
    }
    for key, set_ in closed_loop.items():
        if set_:
            raise ValueError(
                f"experiment key {key!r}: a closed-loop sweep's; an open-loop one takes its load from "
                "[load] (rate_rps, duration_s or requests, warmup_s) and one link per edge"
            )
    if launcher == "sim":
        _check_sim_serving(experiment)


def _check_rate_map(experiment: Experiment, defaults: dict) -> None:
    """A rate map ([load] rtt_ms) sets every edge's RTT itself: a second source of RTTs would be
    silently replaced, so it is refused; the map's figure is the largest rate at the SLO."""
    others = {
        "rtt_ms": experiment.rtt_ms != defaults["rtt_ms"],
        "delay_up_ms": bool(experiment.delay_up_ms),
        "link.edges": bool(experiment.link.edges),
        "link.draw_rtt_ms": bool(experiment.link.draw_rtt_ms),
    }
    for key, set_ in others.items():
        if set_:
            raise ValueError(
                f"experiment key {key!r}: with [load] rtt_ms (a rate map) every edge's RTT comes from "
                f"[load] rtt_ms {list(experiment.load.rtt_ms)}; leave {key} unset"
            )
    if experiment.slo is None:
        raise ValueError(
            "experiment key 'load.rtt_ms': a rate map finds the largest rate at the SLO per mode and "
            "RTT; add an [slo] table"
        )


def _check_sim_serving(experiment: Experiment) -> None:
    """The serving sim (open_loop/sim.py) models greedy rounds of one static mode on ideal links:
    what it does not model is refused, not dropped."""
    unmodelled = {
        "controller": experiment.controller != "static",
        "sampling.temperature": experiment.sampling_settings()[0].temperature > 0,
        "request_deadline_s": experiment.request_deadline_s > 0,
        "tcp_rto_max_ms": experiment.tcp_rto_max_ms > 0,
        "transport": experiment.transport != "ws",
    }
    for key, set_ in unmodelled.items():
        if set_:
            raise ValueError(
                f"experiment key {key!r}: the serving sim does not model it; run [load] with it on "
                "a network launcher (loopback, netns, compose)"
            )


def edge_rtts_ms(experiment: Experiment, rtt_ms: float | None = None) -> tuple[float, ...]:
    """Each edge's RTT: a rate map's ``rtt_ms`` for every edge, else the experiment's first rtt_ms
    or its [link] per-edge entries."""
    specs = link_keys.edge_specs(experiment.link, link_point(experiment, rtt_ms), experiment.edges)
    return tuple(s.rtt_ms if s.rtt_ms is not None else s.delay_up_ms + s.delay_down_ms for s in specs)


def arrivals_for(experiment: Experiment, point: ServingPoint) -> list[OpenLoopRequest]:
    seed = (experiment.load.seed if experiment.load.seed >= 0 else experiment.seed) * 1009 + point.repeat
    return schedule(experiment.load, point.rate_rps, experiment.edges, experiment.max_new_tokens, seed)


def serving_model(experiment: Experiment, times, gap_s: float = 0.0, rtt_ms: float | None = None) -> ServingModel:
    """The prediction's inputs for this experiment (share per edge from the assignment; every
    edge at ``rtt_ms`` for a rate map's RTT)."""
    n = experiment.edges
    load = experiment.load
    if load.assignment == "weighted":
        weights = [load.weights[i % len(load.weights)] for i in range(n)]
        shares = tuple(w / sum(weights) for w in weights)
    else:
        shares = (1.0 / n,) * n
    lengths = [
        a.max_tokens
        for a in arrivals_for(
            experiment, ServingPoint(experiment.modes[0], (load.rate_rps or (None,))[0], experiment.gamma[0], 0)
        )
    ]
    tokens = round(sum(lengths) / len(lengths)) if lengths else experiment.max_new_tokens
    return ServingModel(
        times,
        experiment.gamma[0],
        experiment.backend.alpha,
        tokens,
        experiment.prompt_tokens,
        edge_rtts_ms(experiment, rtt_ms),
        shares,
        gap_s,
    )


# ---- one point -------------------------------------------------------------------------------


def sim_setup(experiment: Experiment, mode: str, times, rtt_ms: float | None = None) -> ServingSetup:
    return ServingSetup(
        mode,
        experiment.gamma[0],
        experiment.backend.alpha,
        times,
        edge_rtts_ms(experiment, rtt_ms),
        experiment.prompt_tokens,
        experiment.max_batch,
        experiment.load.max_sessions or VerifierLimits().max_sessions,
    )


def sim_seed(experiment: Experiment, repeat: int) -> int:
    return experiment.seed * 7919 + repeat


def link_point(experiment: Experiment, rtt_ms: float | None = None):
    """The closed-loop point whose link every edge gets (at a rate map's ``rtt_ms`` if given)."""
    axes = link_keys.link_axes(experiment)[0]
    return Point(
        experiment.modes[0],
        gamma=experiment.gamma[0],
        clients=1,
        repeat=0,
        **{**axes, **({} if rtt_ms is None else {"rtt_ms": float(rtt_ms)})},
    )
