"""Adaptive DSD: a controller picks each round's gamma and mode from what the edge has measured.

A driver (``dsd.simulation.one_client.simulate_dsd``, ``services.edge.Client.dsd``) asks ``decide()`` before the
request's first block, and after every verdict hands the controller that round's ``Observation``
and asks again; the edge decoder then drafts its next block with the new plan
(``EdgeDecoder.set_drafting``). What the driver does with a decision is checked by
``check_decision``: a controller that returns a gamma outside 1..gamma_max or a mode it may not
use is refused with a ValueError naming the field.

A plan changes only what is drafted next: blocks already in flight keep their own gamma (every
verdict is applied to the block it answers), and a switch from pipelined to sync only stops new
speculation, so no token is lost or duplicated and greedy output stays the target's.

Policies (``CONTROLLERS``), each in its own module (dsd/controller/policies.py ``make_controller`` builds the run's) with
its own settings (dsd/controller/policy_configs.py; ``ControllerConfig`` holds what they share and names one):
- ``static`` (dsd/controller/rule_based.py): the configured gamma and mode, every round (the behaviour without a controller).
- ``heuristic`` (dsd/controller/rule_based.py): transformers' assisted-generation schedule on acceptance alone: every draft
  accepted -> gamma + 2, otherwise gamma - 1, clamped to 1..gamma_max; the mode stays.
- ``model`` (dsd/controller/model_based.py): running (discounted) estimates of alpha, the link RTT, t_draft and t_verify (a line
  in gamma, fitted once the plans have varied) put into
  the closed form of ``dsd.analytic.latency_model``; picks the (mode, gamma) of the lowest predicted
  per-token latency, and leaves the current plan only for one predicted at least ``margin_pct``
  faster (so noise in the estimates does not make it flap).
- ``bandit`` (dsd/controller/bandit.py): discounted UCB over (mode, gamma) arms, the reward a round's (or a server request's)
  tokens per second; the past is forgotten with time (``horizon_s``), so it follows a moving link; each arm
  starts from an informed prior (the closed form's predicted rate as ``prior_rounds`` pseudo-rounds).

Request-level choice: a driver that can also hand a request to the server (cloud AR, co-located
SD) asks ``decide_request(rtt_s)`` before the request (rtt_s: the link as last probed, or None
where no probe is newer than the previous request's round trips: the policy's running estimate) and, once
it is done, hands ``observe_request`` a ``RequestObservation``. A decision of a DSD mode starts a
DSD request (whose rounds then go through ``decide``/``observe``); ``ar``/``colocated`` runs it
on the server. Which modes a policy may pick is ``ControllerConfig.modes``. While a request is on
the server, a policy may also have ``stream_ahead_s()`` say how long a round trip the driver
should keep the stream asked ahead for (dsd/drive/driver.py ``keep_server_busy``; None or absent: the
link as last measured), and ``link_rtt_s()`` the RTT its plans were decided on (the driver's
measure of the link a segment is asked on before the request's own rounds measured it, so a
link that fell since shows as a fall: ``_asked_on_rtt_s``), and ``server_step_s()`` the server's
step per streamed token (with ``link_rtt_s()``, how far ahead a stream is asked before its own
tokens measured the pace: ``_pace``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dsd.checks import is_int
from dsd.modes import SYNC, edge_modes, get_mode, names, plannable_edge_modes
from dsd.controller.policy_configs import (
    POLICY_CONFIGS,
    BanditConfig,
    HeuristicConfig,
    ModelPolicyConfig,
    PolicySettings,
    StaticConfig,
    policy_config,
)
from dsd.costs.compute_times import steady_per_token_s

if TYPE_CHECKING:
    from dsd.backends.protocol import LanguageModel

CONTROLLERS = tuple(POLICY_CONFIGS)

# the largest gamma a controller may pick unless an experiment, an edge's run or a test says otherwise
GAMMA_MAX = 16


@dataclass(frozen=True)
class Observation:
    """One answered block, as the edge measured it (seconds; None where not measured)."""

    gamma: int  # the block's planned gamma
    mode: str  # the mode it was drafted in
    proposed: int
    accepted: int
    stale: bool
    rtt_s: float | None  # send -> verdict, less the server's queueing and compute: the link
    t_draft_s: float | None  # per draft step
    t_verify_s: float | None  # the server's compute for the block
    server_queue_s: float | None
    # a server round of a hand-over (mode a server mode; dsd.drive.driver): the tokens it emitted, the
    # time since the segment's previous arrival (its send, for the first), and shadow drafting's
    # positions and matches along them (greedy only)
    tokens: int = 0
    interval_s: float | None = None
    shadow_positions: int = 0
    shadow_matches: int = 0
    remaining_tokens: int | None = None  # what the request's token budget still allows
    rtt_inferred: bool = False  # rtt_s is a guess from a burst of stream arrivals (dsd/drive/stream_drift.py)

    def starts_request_after(self, previous_remaining: int | None) -> bool:
        """More budget left than the last round had: a new request began (from a driver that
        did not ask ``decide_request``)."""
        return (
            self.remaining_tokens is not None
            and previous_remaining is not None
            and self.remaining_tokens > previous_remaining
        )


@dataclass(frozen=True)
class RequestObservation:
    """One finished request as the edge measured it (seconds): its mode and gamma (the start
    plan for DSD), tokens, wall time from start to the last token, time to the first token, and
    the link's RTT as last probed (None where not known)."""

    mode: str
    gamma: int
    tokens: int
    wall_s: float
    ttft_s: float | None
    rtt_s: float | None
    # shadow drafting (greedy server requests): positions the edge's draft predicted along the
    # stream, and how many it got right; the acceptance the server's stream would have had
    shadow_positions: int = 0
    shadow_matches: int = 0
    # tokens the first emission carried (a co-located round's accepted run may be several), so the
    # rate learnt is the one requests.csv records
    first_emitted: int = 1
    # per token after the first emission: the server's rate without the request's start
    steady_per_token_s: float | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "steady_per_token_s", steady_per_token_s(self.ttft_s, self.wall_s, self.tokens - self.first_emitted)
        )


@dataclass(frozen=True)
class Decision:
    gamma: int
    mode: str

    def __post_init__(self) -> None:
        if not (is_int(self.gamma) and self.gamma >= 1):
            raise ValueError(f"gamma must be a whole number >= 1, got {self.gamma!r}")
        if self.mode not in names():  # dsd/modes.py; server modes only per request
            raise ValueError(f"mode must be one of {names()}, got {self.mode!r}")


def shadow_matches(draft: LanguageModel, seq_id: str, prompt: list[int], generated: list[int]) -> tuple[int, int]:
    """(positions, matches): the draft's greedy guess at every generated position, given the
    true prefix, against the token the server generated. In cloud AR the edge is idle while the
    tokens stream in, so it can draft along (one step per token, hidden while t_draft < t_ar) and
    keep measuring alpha; here done in one pass at the request's end (not charged: the same work)."""
    if not generated:
        return 0, 0
    logits = draft.logits(seq_id, list(prompt) + list(generated[:-1]), len(generated))  # [n, vocab]
    guesses = logits.argmax(dim=-1).tolist()
    draft.release(seq_id)
    return len(generated), sum(int(g == t) for g, t in zip(guesses, generated))


def check_decision(decision: object, gamma_max: int, modes: tuple[str, ...]) -> Decision:
    """What a driver accepts from a controller: a Decision within gamma_max and the usable modes."""
    if not isinstance(decision, Decision):
        raise ValueError(f"controller must return a Decision, got {type(decision).__name__}")
    gamma = decision.gamma
    if not (is_int(gamma) and 1 <= gamma <= gamma_max):
        raise ValueError(f"controller decision gamma must be a whole number in 1..{gamma_max}, got {gamma!r}")
    if decision.mode not in modes:
        raise ValueError(f"controller decision mode must be one of {modes}, got {decision.mode!r}")
    return decision


@dataclass(frozen=True)
class RequestOutcome:
    """One request as its driver measured it, from its start (seconds): its tokens, the time to
    the last token (None: no token came) and to the first, and how many the first emission carried."""

    tokens: list[int]
    wall_s: float | None
    ttft_s: float | None
    first_emitted: int = 1


@dataclass(frozen=True)
class ShadowDraft:
    """What drafts along a server request's tokens (``shadow_matches``), under greedy decoding."""

    draft: LanguageModel
    seq_id: str
    prompt: list[int]


async def request_cycle(
    controller: RequestController,
    rtt_s: float | None,
    run: Callable[[Decision], Awaitable[RequestOutcome]],
    shadow: ShadowDraft | None,
) -> Decision:
    """One request under a controller that picks its mode: decide at ``rtt_s`` (the module's
    docstring), check the decision, ``run`` the request in it, and hand the controller how it went
    (a server mode's with the shadow draft's matches, where ``shadow`` is given). Every driver
    (services/edge/, the sim launcher) runs its requests' decisions through this one cycle."""
    config = controller.config
    decision = check_decision(controller.decide_request(rtt_s), config.gamma_max, tuple(config.modes))
    outcome = await run(decision)
    if outcome.wall_s is None:
        return decision
    matches = (0, 0)
    if shadow is not None and decision.mode not in edge_modes():
        matches = shadow_matches(shadow.draft, f"{shadow.seq_id}/shadow", shadow.prompt, outcome.tokens)
    controller.observe_request(
        RequestObservation(
            decision.mode,
            decision.gamma,
            len(outcome.tokens),
            outcome.wall_s,
            outcome.ttft_s,
            rtt_s,
            *matches,
            first_emitted=outcome.first_emitted,
        )
    )
    return decision


@dataclass(frozen=True)
class ControllerConfig:
    """What every policy shares, the policy's name, and its own ``settings`` (dsd/controller/policy_configs.py:
    the policy's dataclass; None for its defaults; a dict of its keys is built and checked)."""

    name: str = "static"
    gamma: int = 4  # the first round's gamma (every round's, for static)
    mode: str = SYNC  # the first round's mode
    gamma_max: int = GAMMA_MAX  # raised to gamma for static (its every round's gamma)
    # what a policy may choose from (server modes: per request); an adaptive policy only plannable ones
    modes: tuple[str, ...] = plannable_edge_modes()
    handover: bool = True  # a round may hand the request to a server mode of ``modes``
    settings: StaticConfig | HeuristicConfig | ModelPolicyConfig | BanditConfig | None = None

    def __post_init__(self) -> None:
        if self.name not in CONTROLLERS:
            raise ValueError(f"controller must be one of {CONTROLLERS}, got {self.name!r}")
        for name in ("gamma", "gamma_max"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.name != "static" and self.gamma > self.gamma_max:
            raise ValueError(f"gamma must be <= gamma_max {self.gamma_max}, got {self.gamma!r}")
        object.__setattr__(self, "gamma_max", max(self.gamma_max, self.gamma))
        if self.mode not in names():
            raise ValueError(f"mode must be one of {names()}, got {self.mode!r}")
        if not self.modes or any(m not in names() for m in self.modes):
            raise ValueError(f"modes must be a non-empty list from {names()}, got {self.modes!r}")
        unplannable = [m for m in self.modes if self.name != "static" and not get_mode(m).plannable]
        if unplannable:
            raise ValueError(
                f"modes: controller {self.name!r} cannot plan {unplannable[0]!r} (dsd/modes.py: not "
                f"plannable); plannable: {[m for m in names() if get_mode(m).plannable]}"
            )
        if not isinstance(self.handover, bool):
            raise ValueError(f"handover must be true or false, got {self.handover!r}")
        object.__setattr__(self, "settings", self._checked_settings())

    def _checked_settings(self) -> PolicySettings:
        kind = POLICY_CONFIGS[self.name]
        if self.settings is None:
            return kind()
        if isinstance(self.settings, Mapping):
            shared = sorted(set(self.settings) & {f.name for f in fields(self)})
            if shared:
                raise ValueError(
                    f"{shared[0]} is shared by every policy: a field of the controller config, "
                    f"not a setting of controller {self.name!r}"
                )
            return policy_config(self.name, self.settings)
        if not isinstance(self.settings, kind):
            raise ValueError(
                f"settings of controller {self.name!r} must be a {kind.__name__}, got {type(self.settings).__name__}"
            )
        return self.settings

    @property
    def dsd_modes(self) -> tuple[str, ...]:
        """The modes a round may take (the request-level ones besides)."""
        return tuple(m for m in self.modes if m in edge_modes())

    @property
    def round_modes(self) -> tuple[str, ...]:
        """The modes a round may take: the DSD ones, and the server's where a hand-over is allowed."""
        return self.modes if self.handover and self.dsd_modes else (self.dsd_modes or edge_modes())

    @property
    def dsd_start(self) -> Decision:
        """The start plan of a DSD request: the configured one, in a DSD mode."""
        modes = self.dsd_modes or edge_modes()
        return Decision(self.gamma, self.mode if self.mode in modes else modes[0])


@runtime_checkable
class Controller(Protocol):
    """What a driver asks of every controller: ``decide()`` the next plan, ``observe()`` a round."""

    def decide(self) -> Decision: ...

    def observe(self, observation: Observation) -> None: ...


@runtime_checkable
class RequestController(Controller, Protocol):
    """A controller that also plans each request (every policy of dsd/controller/policies.py): the edge asks
    it for the request's mode before the request and tells it how the request went."""

    config: ControllerConfig

    def decide_request(self, rtt_s: float | None = None) -> Decision: ...

    def observe_request(self, observation: RequestObservation) -> None: ...


# A controller's optional hints to the hand-over stream (dsd/drive/handover.py), one Protocol each, so a
# controller declares exactly the ones it gives (the module docstring says what each means).
@runtime_checkable
class StreamAheadHint(Protocol):
    def stream_ahead_s(self) -> float | None: ...


@runtime_checkable
class LinkRttHint(Protocol):
    def link_rtt_s(self) -> float | None: ...


@runtime_checkable
class ServerStepHint(Protocol):
    def server_step_s(self) -> float | None: ...
