"""Adaptive DSD: a controller picks each round's gamma and mode from what the edge has measured.

A driver (``dsd.simulate.simulate_dsd``, ``services.edge.Client.dsd``) asks ``decide()`` before the
request's first block, and after every verdict hands the controller that round's ``Observation``
and asks again; the edge decoder then drafts its next block with the new plan
(``EdgeDecoder.set_plan``). What the driver does with a decision is checked by
``check_decision``: a controller that returns a gamma outside 1..gamma_max or a mode it may not
use is refused with a ValueError naming the field.

A plan changes only what is drafted next: blocks already in flight keep their own gamma (every
verdict is applied to the block it answers), and a switch from pipelined to sync only stops new
speculation, so no token is lost or duplicated and greedy output stays the target's.

Policies (``CONTROLLERS``):
- ``static``: the configured gamma and mode, every round (the behaviour without a controller).
- ``heuristic``: transformers' assisted-generation schedule on acceptance alone: every draft
  accepted -> gamma + 2, otherwise gamma - 1, clamped to 1..gamma_max; the mode stays.
- ``model``: running (discounted) estimates of alpha, the link RTT, t_draft and t_verify (a line
  in gamma, fitted once the plans have varied) put into
  the closed form of ``dsd.latency_model``; picks the (mode, gamma) of the lowest predicted
  per-token latency, and leaves the current plan only for one predicted at least ``margin_pct``
  faster (so noise in the estimates does not make it flap).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dsd.modes import AR, SYNC, edge_modes, get_mode, plan_modes

CONTROLLERS = ("static", "heuristic", "model")


@dataclass(frozen=True)
class Observation:
    """One answered block, as the edge measured it (seconds; None where not measured)."""
    gamma: int                     # the block's planned gamma
    mode: str                      # the mode it was drafted in
    proposed: int
    accepted: int
    stale: bool
    rtt_s: float | None            # send -> verdict, less the server's queueing and compute: the link
    t_draft_s: float | None        # per draft step
    t_verify_s: float | None       # the server's compute for the block
    server_queue_s: float | None


@dataclass(frozen=True)
class Decision:
    gamma: int
    mode: str

    def __post_init__(self) -> None:
        if not (isinstance(self.gamma, int) and not isinstance(self.gamma, bool) and self.gamma >= 1):
            raise ValueError(f"gamma must be a whole number >= 1, got {self.gamma!r}")
        if self.mode not in plan_modes():        # dsd/modes.py; AR only where the driver can hand over
            raise ValueError(f"mode must be one of {plan_modes()}, got {self.mode!r}")


def check_decision(decision, gamma_max: int, modes: tuple[str, ...]) -> Decision:
    """What a driver accepts from a controller: a Decision within gamma_max and the usable modes."""
    if not isinstance(decision, Decision):
        raise ValueError(f"controller must return a Decision, got {type(decision).__name__}")
    gamma = decision.gamma
    if not (isinstance(gamma, int) and not isinstance(gamma, bool) and 1 <= gamma <= gamma_max):
        raise ValueError(f"controller decision gamma must be a whole number in 1..{gamma_max}, got {gamma!r}")
    if decision.mode not in modes:
        raise ValueError(f"controller decision mode must be one of {modes}, got {decision.mode!r}")
    return decision


@dataclass(frozen=True)
class ControllerConfig:
    name: str = "static"
    gamma: int = 4                  # the first round's gamma (every round's, for static)
    mode: str = SYNC                # the first round's mode
    gamma_max: int = 16
    modes: tuple[str, ...] = edge_modes()   # what the model policy may choose from
    margin_pct: float = 5.0         # model: switch only for a plan predicted this much faster
    discount: float = 0.9           # model: weight of the past in the running estimates, per round
    t_ar_s: float | None = None     # model with AR among modes: the server's AR step (prior)

    def __post_init__(self) -> None:
        if self.name not in CONTROLLERS:
            raise ValueError(f"controller must be one of {CONTROLLERS}, got {self.name!r}")
        for name in ("gamma", "gamma_max"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.name != "static" and self.gamma > self.gamma_max:
            raise ValueError(f"gamma must be <= gamma_max {self.gamma_max}, got {self.gamma!r}")
        if self.mode not in plan_modes():        # dsd/modes.py; AR only where the driver can hand over
            raise ValueError(f"mode must be one of {plan_modes()}, got {self.mode!r}")
        if not self.modes or any(m not in plan_modes() for m in self.modes):
            raise ValueError(f"modes must be a non-empty list from {plan_modes()}, got {self.modes!r}")
        if not (0 <= self.margin_pct < 100):
            raise ValueError(f"margin_pct must be in [0, 100), got {self.margin_pct!r}")
        if not (0 <= self.discount < 1):
            raise ValueError(f"discount must be in [0, 1), got {self.discount!r}")
        if AR in self.modes and not (self.t_ar_s is not None and self.t_ar_s > 0):
            raise ValueError(f"t_ar_s must be > 0 when modes include {AR!r}, got {self.t_ar_s!r}")


class StaticPolicy:
    def __init__(self, config: ControllerConfig) -> None:
        self.decision = Decision(config.gamma, config.mode)

    def observe(self, observation: Observation) -> None:
        pass

    def decide(self) -> Decision:
        return self.decision


class HeuristicPolicy:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 if every draft was
    accepted, else -1 (at least 1); here also at most gamma_max."""

    def __init__(self, config: ControllerConfig) -> None:
        self.gamma, self.mode, self.gamma_max = config.gamma, config.mode, config.gamma_max

    def observe(self, observation: Observation) -> None:
        if observation.stale or observation.proposed == 0:
            return
        step = 2 if observation.accepted == observation.proposed else -1
        self.gamma = min(self.gamma_max, max(1, self.gamma + step))

    def decide(self) -> Decision:
        return Decision(self.gamma, self.mode)


def predicted_per_token_s(mode: str, gamma: int, alpha: float, rtt_s: float, t_draft_s: float,
                          t_verify_s: float, t_ar_s: float | None) -> float:
    """The closed form's steady-state time per token of one plan (the mode's predictor in
    dsd/modes.py; the edge drafts, so t_draft_s is the edge's and there is no server draft)."""
    return get_mode(mode).per_token_s(alpha, gamma, rtt_s, t_ar_s=t_ar_s, t_draft_edge_s=t_draft_s,
                                      t_draft_server_s=None, t_verify_s=t_verify_s)


def best_decision(alpha: float, rtt_s: float, t_draft_s: float, t_verify_s: float, modes: tuple[str, ...],
                  gamma_max: int, t_ar_s: float | None = None) -> tuple[Decision, float]:
    """The plan of the lowest predicted per-token latency and that latency (ties: smaller gamma,
    then the earlier mode in ``modes``)."""
    best, best_s = None, math.inf
    for mode in modes:
        for gamma in (range(1, gamma_max + 1) if get_mode(mode).speculative else [1]):
            cost_s = predicted_per_token_s(mode, gamma, alpha, rtt_s, t_draft_s, t_verify_s, t_ar_s)
            if cost_s < best_s - 1e-15:
                best, best_s = Decision(gamma, mode), cost_s
    return best, best_s


class _Discounted:
    """A discounted running mean: recent rounds count more, so it follows a moving link."""

    def __init__(self, discount: float) -> None:
        self.discount, self.total, self.weight = discount, 0.0, 0.0

    def add(self, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.total = self.discount * self.total + value
            self.weight = self.discount * self.weight + 1.0

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight else None


class _DiscountedLine:
    """A discounted least-squares line y = a + b*x (b >= 0; 0 while x has not varied): the
    verification time against the block's gamma."""

    def __init__(self, discount: float) -> None:
        self.discount = discount
        self.sums = [0.0] * 5                    # weight, x, y, xx, xy

    def add(self, x: float, y: float | None) -> None:
        if y is not None and math.isfinite(y):
            self.sums = [self.discount * s + v for s, v in zip(self.sums, (1.0, x, y, x * x, x * y))]

    def at(self, x: float) -> float | None:
        w, sx, sy, sxx, sxy = self.sums
        if not w:
            return None
        var = sxx / w - (sx / w) ** 2
        slope = max((sxy / w - sx * sy / w ** 2) / var, 0.0) if var > 1e-9 else 0.0
        return sy / w + slope * (x - sx / w)


class ModelPolicy:
    """The closed form on running estimates, with a switching margin."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.current = Decision(config.gamma, config.mode)
        self.accepted = _Discounted(config.discount)      # per round: accepted drafts
        self.rejected = _Discounted(config.discount)      # per round: 1 if a draft was rejected
        self.rtt_s = _Discounted(config.discount)
        self.t_draft_s = _Discounted(config.discount)
        self.t_verify_s = _DiscountedLine(config.discount)     # against gamma

    def observe(self, observation: Observation) -> None:
        if observation.stale:
            return
        self.accepted.add(observation.accepted)
        self.rejected.add(float(observation.accepted < observation.proposed))
        self.rtt_s.add(observation.rtt_s)
        self.t_draft_s.add(observation.t_draft_s)
        self.t_verify_s.add(observation.proposed, observation.t_verify_s)

    @property
    def alpha(self) -> float | None:
        """Maximum likelihood under i.i.d. acceptance (as ``Generation.alpha_measured``), discounted."""
        a, r = self.accepted.value, self.rejected.value
        if a is None or a + r == 0:
            return None
        return min(a / (a + r), 0.999)     # alpha = 1 would make every gamma look free

    def decide(self) -> Decision:
        alpha, rtt_s, t_draft_s = self.alpha, self.rtt_s.value, self.t_draft_s.value
        if alpha is None or rtt_s is None or t_draft_s is None or self.t_verify_s.at(1) is None:
            return self.current                  # nothing measured yet: the configured start
        c = self.config
        best, best_s = None, math.inf
        for mode in c.modes:
            for gamma in (range(1, c.gamma_max + 1) if get_mode(mode).speculative else [1]):
                cost_s = predicted_per_token_s(mode, gamma, alpha, rtt_s, t_draft_s, self.t_verify_s.at(gamma),
                                               c.t_ar_s)
                if cost_s < best_s - 1e-15:
                    best, best_s = Decision(gamma, mode), cost_s
        current = self.current
        current_s = predicted_per_token_s(current.mode, current.gamma, alpha, rtt_s, t_draft_s,
                                          self.t_verify_s.at(current.gamma), c.t_ar_s)
        if best_s < current_s * (1 - c.margin_pct / 100):
            self.current = best
        return self.current


def make_controller(config: ControllerConfig):
    """The run's controller; a static run of a mode with its own policy (dsd/modes.py) gets that."""
    if config.name == "static" and get_mode(config.mode).policy is not None:
        return get_mode(config.mode).policy(config)
    return {"static": StaticPolicy, "heuristic": HeuristicPolicy, "model": ModelPolicy}[config.name](config)
