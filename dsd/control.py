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
- ``bandit``: discounted UCB over (mode, gamma) arms, the reward a round's (or a server request's)
  tokens per second; the past is forgotten with time (``horizon_s``), so it follows a moving link.

Request-level choice: a driver that can also hand a request to the server (cloud AR, co-located
SD) asks ``decide_request(rtt_s)`` before the request (rtt_s: the link as last probed) and, once
it is done, hands ``observe_request`` a ``RequestObservation``. A decision of a DSD mode starts a
DSD request (whose rounds then go through ``decide``/``observe``); ``ar``/``colocated`` runs it
on the server. Which modes a policy may pick is ``ControllerConfig.modes``.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from dsd import latency_model as lm
from dsd.modes import SYNC, edge_modes, get_mode, names, server_modes

CONTROLLERS = ("static", "heuristic", "model", "bandit")


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
    # a server round of a hand-over (mode a server mode; dsd.driver): the tokens it emitted, the
    # time since the segment's previous arrival (its send, for the first), and shadow drafting's
    # positions and matches along them (greedy only)
    tokens: int = 0
    interval_s: float | None = None
    shadow_positions: int = 0
    shadow_matches: int = 0
    remaining_tokens: int | None = None    # what the request's token budget still allows


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

    @property
    def steady_per_token_s(self) -> float | None:
        """Per token after the first: what the server's rate is, without the request's start."""
        if self.tokens < 2 or self.ttft_s is None:
            return None
        return max(self.wall_s - self.ttft_s, 0.0) / (self.tokens - 1)


@dataclass(frozen=True)
class Decision:
    gamma: int
    mode: str

    def __post_init__(self) -> None:
        if not (isinstance(self.gamma, int) and not isinstance(self.gamma, bool) and self.gamma >= 1):
            raise ValueError(f"gamma must be a whole number >= 1, got {self.gamma!r}")
        if self.mode not in names():             # dsd/modes.py; server modes only per request
            raise ValueError(f"mode must be one of {names()}, got {self.mode!r}")


def shadow_matches(draft, seq_id: str, prompt: list[int], generated: list[int]) -> tuple[int, int]:
    """(positions, matches): the draft's greedy guess at every generated position, given the
    true prefix, against the token the server generated. In cloud AR the edge is idle while the
    tokens stream in, so it can draft along (one step per token, hidden while t_draft < t_ar) and
    keep measuring alpha; here done in one pass at the request's end (not charged: the same work)."""
    if not generated:
        return 0, 0
    logits = draft.logits(seq_id, list(prompt) + list(generated[:-1]), len(generated))     # [n, vocab]
    guesses = logits.argmax(dim=-1).tolist()
    draft.release(seq_id)
    return len(generated), sum(int(g == t) for g, t in zip(guesses, generated))


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
    modes: tuple[str, ...] = edge_modes()   # what a policy may choose from (server modes: per request)
    margin_pct: float = 5.0         # model: switch only for a plan predicted this much faster
    discount: float = 0.9           # model: weight of the past in the running estimates, per round
    t_ar_s: float | None = None     # model: the server's AR step (prior; default: t_verify(1) as measured)
    t_draft_server_s: float | None = None   # model: the server's draft step (prior; default: the edge's)
    explore_after: int = 4          # model: after this many server requests in a row, one DSD request
    gammas: tuple[int, ...] = (1, 2, 4, 8, 16)   # bandit: the gamma arms (those <= gamma_max)
    horizon_s: float = 12.0         # bandit: an observation's weight halves every horizon_s seconds
    exploration: float = 0.1        # bandit: UCB bonus scale (a share of the best arm's rate)
    handover: bool = True           # model, bandit: a round may hand the request to a server mode of ``modes``

    def __post_init__(self) -> None:
        if self.name not in CONTROLLERS:
            raise ValueError(f"controller must be one of {CONTROLLERS}, got {self.name!r}")
        for name in ("gamma", "gamma_max"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.name != "static" and self.gamma > self.gamma_max:
            raise ValueError(f"gamma must be <= gamma_max {self.gamma_max}, got {self.gamma!r}")
        if self.mode not in names():
            raise ValueError(f"mode must be one of {names()}, got {self.mode!r}")
        if not self.modes or any(m not in names() for m in self.modes):
            raise ValueError(f"modes must be a non-empty list from {names()}, got {self.modes!r}")
        if not (0 <= self.margin_pct < 100):
            raise ValueError(f"margin_pct must be in [0, 100), got {self.margin_pct!r}")
        if not (0 <= self.discount < 1):
            raise ValueError(f"discount must be in [0, 1), got {self.discount!r}")
        for name in ("t_ar_s", "t_draft_server_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value!r}")
        if not (isinstance(self.explore_after, int) and self.explore_after >= 1):
            raise ValueError(f"explore_after must be a whole number >= 1, got {self.explore_after!r}")
        if not self.gammas or any(not (isinstance(g, int) and not isinstance(g, bool) and g >= 1)
                                  for g in self.gammas):
            raise ValueError(f"gammas must be a non-empty list of whole numbers >= 1, got {self.gammas!r}")
        for name in ("horizon_s", "exploration"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if not isinstance(self.handover, bool):
            raise ValueError(f"handover must be true or false, got {self.handover!r}")

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


class StaticPolicy:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.decision = Decision(config.gamma, config.mode)

    def observe(self, observation: Observation) -> None:
        pass

    def decide(self) -> Decision:
        return self.decision

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        return self.decision

    def observe_request(self, observation: RequestObservation) -> None:
        pass


class HeuristicPolicy:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 if every draft was
    accepted, else -1 (at least 1); here also at most gamma_max. Every request is DSD in the
    configured mode (the schedule knows nothing of the link), its gamma carried over."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        start = config.dsd_start
        self.gamma, self.mode, self.gamma_max = start.gamma, start.mode, config.gamma_max

    def observe(self, observation: Observation) -> None:
        if observation.stale or observation.proposed == 0:
            return
        step = 2 if observation.accepted == observation.proposed else -1
        self.gamma = min(self.gamma_max, max(1, self.gamma + step))

    def decide(self) -> Decision:
        return Decision(self.gamma, self.mode)

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        return self.decide()

    def observe_request(self, observation: RequestObservation) -> None:
        pass


def predicted_per_token_s(mode: str, gamma: int, alpha: float, rtt_s: float, t_draft_s: float,
                          t_verify_s: float, t_ar_s: float | None, t_draft_server_s: float | None = None) -> float:
    """The closed form's steady-state time per token of one plan (the mode's predictor in
    dsd/modes.py; t_draft_s is the edge's, t_draft_server_s the server's where a mode drafts there)."""
    return get_mode(mode).per_token_s(alpha, gamma, rtt_s, t_ar_s=t_ar_s, t_draft_edge_s=t_draft_s,
                                      t_draft_server_s=t_draft_server_s, t_verify_s=t_verify_s)


def best_decision(alpha: float, rtt_s: float, t_draft_s: float, t_verify_s, modes: tuple[str, ...],
                  gamma_max: int, t_ar_s: float | None = None,
                  t_draft_server_s: float | None = None) -> tuple[Decision, float]:
    """The plan of the lowest predicted per-token latency and that latency (ties: smaller gamma,
    then the earlier mode in ``modes``). ``t_verify_s``: seconds, or a function of gamma."""
    verify = t_verify_s if callable(t_verify_s) else (lambda _g: t_verify_s)
    best, best_s = None, math.inf
    for mode in modes:
        for gamma in (range(1, gamma_max + 1) if get_mode(mode).speculative else [1]):
            cost_s = predicted_per_token_s(mode, gamma, alpha, rtt_s, t_draft_s, verify(gamma), t_ar_s,
                                           t_draft_server_s)
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


class _Acceptance:
    """The acceptance rate alpha, discounted per observation: each adds its accepted drafts
    (successes) and rejections (failures: 1 unless a round's drafts were all accepted; shadow
    drafting adds its matches and misses), and alpha is their ratio (the maximum-likelihood rate
    of i.i.d. positions, as ``Generation.alpha_measured``).

    A change test keeps the discount from lagging behind a new prompt: once the latest
    observations cover ``MIN_POSITIONS`` positions and are more than ``RESET_NATS`` likelier
    under their own rate than under the running one (a log-likelihood ratio: at alpha 0.9, three
    rejections in six positions score 3.1), the estimate restarts from them. A high-alpha
    history holds many accepted drafts, so without this a drop to 0.3 takes some twenty rounds
    to show; with it, a few."""

    MIN_POSITIONS = 6
    RESET_NATS = 4.0

    def __init__(self, discount: float) -> None:
        self.discount = discount
        self.accepted, self.rejected = _Discounted(discount), _Discounted(discount)
        self.recent: deque[tuple[float, float]] = deque()

    def add(self, accepted: float, rejected: float) -> None:
        self.accepted.add(accepted)
        self.rejected.add(rejected)
        self.recent.append((accepted, rejected))
        while len(self.recent) > 1 and sum(a + r for a, r in list(self.recent)[1:]) >= self.MIN_POSITIONS:
            self.recent.popleft()
        if sum(a + r for a, r in self.recent) >= self.MIN_POSITIONS and self._changed():
            self.accepted, self.rejected = _Discounted(self.discount), _Discounted(self.discount)
            for a, r in self.recent:
                self.accepted.add(a)
                self.rejected.add(r)

    def _changed(self) -> bool:
        a, r = sum(x for x, _ in self.recent), sum(y for _, y in self.recent)

        def log_likelihood(p: float) -> float:
            p = min(max(p, 1e-3), 1 - 1e-3)
            return a * math.log(p) + r * math.log(1 - p)

        return log_likelihood(a / (a + r)) - log_likelihood(self.value) > self.RESET_NATS

    @property
    def value(self) -> float | None:
        a, r = self.accepted.value, self.rejected.value
        if a is None or a + r == 0:
            return None
        return min(a / (a + r), 0.999)     # alpha = 1 would make every gamma look free

    @property
    def weight(self) -> float:
        return self.accepted.weight


class ModelPolicy:
    """The closed form on running estimates, with a switching margin.

    Per round it picks among the DSD modes of ``config.modes``; per request (``decide_request``)
    among all of them, cloud AR and co-located SD included. The server's AR step is measured from
    AR requests (before any: the ``t_ar_s`` prior, else the verification of one token as
    measured, which is what a memory-bound target's AR step costs); the server's draft step from
    co-located requests likewise. Alpha is only measured in DSD: after ``explore_after`` server
    requests in a row, where DSD at the best alpha seen so far would beat the server, one request
    runs DSD again to re-measure it."""

    SESSION_RTTS = 4

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.current = config.dsd_start
        self.acceptance = _Acceptance(config.discount)
        self.rtt_s = _Discounted(config.discount)
        self.t_draft_s = _Discounted(config.discount)
        self.t_verify_s = _DiscountedLine(config.discount)     # against gamma
        self.t_ar_s = _Discounted(0.5)                    # per AR request: steady per-token time
        self.t_draft_server_s = _Discounted(0.5)
        self.alpha_best = 0.0                             # the highest alpha estimate so far
        self.server_streak = 0                            # server requests in a row
        self.last_request: Decision | None = None
        self.remaining_tokens: int | None = None          # the request's budget, as last observed
        self.request_tokens = 0                           # the last request's output length

    def observe(self, observation: Observation) -> None:
        if observation.stale:
            return
        self.remaining_tokens = observation.remaining_tokens
        if observation.mode in server_modes():
            self._observe_server(observation)
            return
        self.acceptance.add(observation.accepted, float(observation.accepted < observation.proposed))
        self.rtt_s.add(observation.rtt_s)
        self.t_draft_s.add(observation.t_draft_s)
        self.t_verify_s.add(observation.proposed, observation.t_verify_s)
        if self.alpha is not None and self.acceptance.weight >= 5:
            self.alpha_best = max(self.alpha_best, self.alpha)

    @property
    def alpha(self) -> float | None:
        """Maximum likelihood under i.i.d. acceptance (as ``Generation.alpha_measured``), discounted."""
        return self.acceptance.value

    def _t_ar_s(self) -> float | None:
        return self.t_ar_s.value or self.config.t_ar_s or self.t_verify_s.at(1)

    def _t_draft_server_s(self) -> float | None:
        return self.t_draft_server_s.value or self.config.t_draft_server_s or self.t_draft_s.value

    def _cost_s(self, decision: Decision, alpha: float, rtt_s: float) -> float:
        return predicted_per_token_s(decision.mode, decision.gamma, alpha, rtt_s, self.t_draft_s.value,
                                     self.t_verify_s.at(decision.gamma), self._t_ar_s(), self._t_draft_server_s())

    def _best(self, modes: tuple[str, ...], alpha: float, rtt_s: float) -> tuple[Decision, float]:
        return best_decision(alpha, rtt_s, self.t_draft_s.value, self.t_verify_s.at, modes, self.config.gamma_max,
                             self._t_ar_s(), self._t_draft_server_s())

    def _measured(self) -> bool:
        return not (self.alpha is None or self.rtt_s.value is None or self.t_draft_s.value is None
                    or self.t_verify_s.at(1) is None)

    def decide(self) -> Decision:
        """The next round's plan: the best predicted, if at least ``margin_pct`` faster than the
        current one and, for a hand-over (to the server or back), if the time it saves over the
        request's remaining tokens outweighs the round trip the hand-over costs."""
        if not self._measured():
            return self.current                  # nothing measured yet: the configured start
        alpha, rtt_s, modes = self.alpha, self.rtt_s.value, self.config.round_modes
        best, best_s = self._best(modes, alpha, rtt_s)
        if self.current.mode not in modes:
            self.current = best
            return self.current
        current_s = self._cost_s(self.current, alpha, rtt_s)
        hands_over = (best.mode in server_modes()) != (self.current.mode in server_modes())
        pays_off = not hands_over or self.remaining_tokens is None or \
            (current_s - best_s) * self.remaining_tokens > rtt_s
        if best_s < current_s * (1 - self.config.margin_pct / 100) and pays_off:
            self.current = best
        return self.current

    def _observe_server(self, o: Observation) -> None:
        """A server round of a hand-over: shadow drafting's positions as draws of alpha (co-located
        rounds without them: the server's own draft rounds), the hand-over's round trip as the
        link's, the round's compute as the server's AR step (or draft steps, co-located)."""
        self.rtt_s.add(o.rtt_s)
        if o.shadow_positions:
            self.acceptance.add(o.shadow_matches, o.shadow_positions - o.shadow_matches)
        speculative = get_mode(o.mode).speculative
        if speculative and o.proposed and not o.shadow_positions:
            self.acceptance.add(o.accepted, float(o.accepted < o.proposed))
        if o.t_verify_s is None or not o.tokens:
            return
        if not speculative:
            self.t_ar_s.add(o.t_verify_s / o.tokens)      # the server's step (arrival gaps are the link's)
        elif self.t_verify_s.at(o.gamma) is not None and o.proposed:
            t_ds = (o.t_verify_s - self.t_verify_s.at(o.gamma)) / o.proposed     # compute = drafts + verify
            if t_ds > 0:
                self.t_draft_server_s.add(t_ds)

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        """The request's mode (and start plan): the lowest predicted per-token time at the RTT
        just probed (else the running estimate), with the margin against the last choice."""
        c = self.config
        if rtt_s is not None:      # a probe is the link now: the rounds' running estimate restarts from it
            self.rtt_s = _Discounted(c.discount)
            self.rtt_s.add(rtt_s)
        if not self._measured():
            self.last_request = c.dsd_start if c.dsd_modes else Decision(c.gamma, c.modes[0])
            return self.last_request
        rtt_s = self.rtt_s.value
        alpha = self.alpha
        best, best_s = self._best(c.modes, alpha, rtt_s)
        last = self.last_request
        if last is not None and last.mode in c.modes and \
                best_s >= self._cost_s(last, alpha, rtt_s) * (1 - c.margin_pct / 100):
            best = last if last.mode in server_modes() else self._best((last.mode,), alpha, rtt_s)[0]
        if best.mode in server_modes() and c.dsd_modes and self.server_streak >= c.explore_after:
            # alpha may have risen while the server generated: look again where it could pay off
            dsd, dsd_s = self._best(c.dsd_modes, max(alpha, self.alpha_best), rtt_s)
            if dsd_s < self._cost_s(best, alpha, rtt_s):
                best = dsd
        self.last_request = best
        if best.mode in server_modes():
            return self._server_in_session(best, alpha, rtt_s)
        self.current = best
        return best

    def _server_in_session(self, best: Decision, alpha: float, rtt_s: float) -> Decision:
        """A server request that could come back: where DSD at the best alpha seen so far would
        beat the server by more than a few round trips over a request's tokens (opening a DSD
        session first may cost one; ``SESSION_RTTS`` leaves room for the chance that alpha did
        not rise), the request runs as a DSD session whose first round hands over to the server
        at once (``current``), so shadow drafting can bring it back mid-request."""
        c = self.config
        if not (c.handover and c.dsd_modes and self.request_tokens):
            return best
        dsd, dsd_s = self._best(c.dsd_modes, max(alpha, self.alpha_best), rtt_s)
        if (self._cost_s(best, alpha, rtt_s) - dsd_s) * self.request_tokens <= self.SESSION_RTTS * rtt_s:
            return best
        self.current = best
        return dsd

    def _observe_shadow(self, positions: int, matches: int) -> None:
        """Shadow drafting as rounds of gamma 4 would have gone at that per-position rate: each
        adds its expected accepted drafts and chance of a rejection (keeps the estimator's form)."""
        rate = matches / positions
        for _ in range(max(positions // 4, 1)):
            self.acceptance.add(lm.expected_accepted_per_round(rate, 4), 1.0 - rate ** 4)

    def observe_request(self, observation: RequestObservation) -> None:
        self.request_tokens = observation.tokens
        if observation.rtt_s is not None:
            self.rtt_s.add(observation.rtt_s)
        if observation.mode in edge_modes():
            self.server_streak = 0
            return
        self.server_streak += 1
        if observation.shadow_positions:
            self.server_streak = 0                # alpha is measured along the stream: no need to look
            self._observe_shadow(observation.shadow_positions, observation.shadow_matches)
        per_token_s = observation.steady_per_token_s
        if per_token_s is None:
            return
        if not get_mode(observation.mode).speculative:
            self.t_ar_s.add(per_token_s)
        elif self.alpha is not None and self.t_verify_s.at(observation.gamma) is not None:
            # (gamma*t_ds + t_v)/E = per token  ->  t_ds
            e = lm.expected_tokens_per_round(self.alpha, observation.gamma)
            t_ds = (per_token_s * e - self.t_verify_s.at(observation.gamma)) / observation.gamma
            if t_ds > 0:
                self.t_draft_server_s.add(t_ds)


class BanditPolicy:
    """Discounted UCB over (mode, gamma) arms (Garivier and Moulines' D-UCB, discounted in time),
    one set of statistics per context: the link's RTT in factor-2 buckets (measured every round,
    probed between requests) and the acceptance in buckets of 0.2 (a discounted estimate from the
    rounds; in server requests from shadow drafting). No latency model: what an arm is worth in a
    context is only what it earned there.

    An arm's reward is tokens per second: a DSD round earns accepted + 1 tokens (a stale one
    none) over its cycle, built from what the round measured (sync: gamma drafts + the link +
    the server; pipelined: the longer of the next block's drafting and the wait when the block
    survived, the wait plus a redraft when it did not); a server request earns its tokens over its
    wall time. Weights halve every ``horizon_s`` seconds of experience, so what an arm earned
    before the acceptance moved fades. The index is rate + exploration * best rate *
    sqrt(log(total) / count), counts in rounds (a server request counts one per 0.05 s); an
    untried arm comes first; a context not seen yet starts from the nearest one seen. Requests
    pick among all arms, rounds among the DSD ones."""

    COUNT_UNIT_S = 0.05

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        gammas = sorted({g for g in config.gammas if g <= config.gamma_max}) or [config.gamma_max]
        self.arms: list[Decision] = []
        for mode in config.modes:
            self.arms += [Decision(g, mode) for g in gammas] if get_mode(mode).speculative else [Decision(1, mode)]
        self.stats: dict[tuple, dict[Decision, list[float]]] = {}     # context -> arm -> [tokens, seconds, count]
        self.rtt_bucket = 0
        self.acceptance = _Acceptance(config.discount)
        self.current = config.dsd_start if config.dsd_start in self.arms else \
            next((a for a in self.arms if a.mode in edge_modes()), self.arms[0])
        self.remaining_tokens: int | None = None          # the request's budget, as last observed
        self.request_tokens = 0                           # the last request's output length

    @staticmethod
    def rtt_bucket_of(rtt_s: float | None, default: int) -> int:
        if rtt_s is None or not math.isfinite(rtt_s):
            return default
        return int(round(math.log2(max(rtt_s * 1e3, 0.5))))

    @property
    def context(self) -> tuple[int, int]:
        alpha = self.acceptance.value
        return self.rtt_bucket, min(int((0.5 if alpha is None else alpha) * 5), 4)

    def _known(self) -> dict[Decision, list[float]]:
        """The current context's table; while it has nothing, the nearest context's that has
        (an alpha or RTT bucket away: a transition passes through buckets it will not stay in)."""
        table = self._table(self.context)
        if any(v[1] > 0 for v in table.values()):
            return table
        r, a = self.context
        known = [(abs(r - kr) + abs(a - ka), c) for c, t in self.stats.items() for kr, ka in [c]
                 if any(v[1] > 0 for v in t.values())]
        return self.stats[min(known)[1]] if known else table

    def _table(self, context: tuple) -> dict[Decision, list[float]]:
        return self.stats.setdefault(context, {a: [0.0, 0.0, 0.0] for a in self.arms})

    def _credit(self, context: tuple, arm: Decision, tokens: float, seconds: float, count: float) -> None:
        if arm not in self.arms or not (seconds > 0 and math.isfinite(seconds)):
            return
        keep = 0.5 ** (seconds / self.config.horizon_s)
        for table in self.stats.values():
            for value in table.values():
                value[:] = [v * keep for v in value]
        value = self._table(context)[arm]
        value[0] += tokens
        value[1] += seconds
        value[2] += count

    def observe(self, observation: Observation) -> None:
        o = observation
        if o.stale:
            return
        context = self.context                  # the one the round was planned in
        self.rtt_bucket = self.rtt_bucket_of(o.rtt_s, self.rtt_bucket)
        self.remaining_tokens = o.remaining_tokens
        if o.mode in server_modes():
            self._observe_server(context, o)
            return
        self.acceptance.add(o.accepted, float(o.accepted < o.proposed))
        t_draft_s = o.t_draft_s or 0.0
        wait_s = (o.rtt_s or 0.0) + (o.t_verify_s or 0.0) + (o.server_queue_s or 0.0)
        if get_mode(o.mode).pipelined:
            survived = o.accepted == o.proposed
            cycle_s = max((o.gamma + 1) * t_draft_s, wait_s) if survived else wait_s + o.gamma * t_draft_s
        else:
            cycle_s = o.proposed * t_draft_s + wait_s
        self._credit(context, Decision(o.gamma, o.mode), o.accepted + 1, cycle_s, 1.0)

    def _pick(self, modes: tuple[str, ...]) -> Decision:
        table = self._known()
        arms = [a for a in self.arms if a.mode in modes]
        untried = [a for a in arms if table[a][1] <= 0]
        if untried:
            return untried[0]
        rates = {a: table[a][0] / table[a][1] for a in arms}
        total = sum(table[a][2] for a in arms)
        scale = self.config.exploration * max(rates.values())
        return max(arms, key=lambda a: rates[a] + scale * math.sqrt(math.log(max(total, 1.0) + 1.0)
                                                                    / max(table[a][2], 1e-9)))

    def _observe_server(self, context: tuple, o: Observation) -> None:
        """A server round of a hand-over earns its tokens over the time since the stream's last
        arrival (the first: the hand-over's round trip too); shadow drafting moves the alpha context."""
        if o.shadow_positions:
            self.acceptance.add(o.shadow_matches, o.shadow_positions - o.shadow_matches)
        arm = self._arm_of(o.mode, o.gamma)
        if arm is not None and o.tokens and o.interval_s:
            self._credit(context, arm, o.tokens, o.interval_s, o.interval_s / self.COUNT_UNIT_S)

    def _arm_of(self, mode: str, gamma: int) -> Decision | None:
        if not get_mode(mode).speculative:
            return Decision(1, mode)
        return min((a for a in self.arms if a.mode == mode), key=lambda a: abs(a.gamma - gamma), default=None)

    def decide(self) -> Decision:
        """The next round's arm: UCB over the kinds (DSD, and the server's where a hand-over is
        allowed), leaving the current kind only for one whose rate is ``margin_pct`` higher and
        whose time saved over the remaining tokens outweighs the hand-over's round trip (so
        exploration does not make it flap between edge and server); then UCB within the kind."""
        kinds = self._kinds(self.config.round_modes)
        values = self._kind_values(kinds, borrow=True)
        kind = self._ucb_kind(values)
        here = self._kind_of(self.current.mode)
        if kind != here and here in kinds:
            new, old = values.get(kind), values.get(here)
            # a kind not tried here is tried per request, not by a hand-over mid-request
            if new is None or (old is not None and not self._worth_handing_over(new[0], old[0])):
                kind = here
        self.current = self._pick(tuple(kinds[kind]))
        return self.current

    def _worth_handing_over(self, new_rate: float, old_rate: float) -> bool:
        saved_s = (1 / old_rate - 1 / new_rate) * (self.remaining_tokens or 0)
        return new_rate >= old_rate * (1 + self.config.margin_pct / 100) and saved_s >= 2.0 ** self.rtt_bucket / 1e3

    @staticmethod
    def _kind_of(mode: str) -> str:
        return "dsd" if mode in edge_modes() else mode

    def _kinds(self, modes: tuple[str, ...]) -> dict[str, list[str]]:
        kinds: dict[str, list[str]] = {}
        for mode in modes:
            kinds.setdefault(self._kind_of(mode), []).append(mode)
        return kinds

    def _kind_values(self, kinds: dict[str, list[str]],
                     borrow: bool = False) -> dict[str, tuple[float, float] | None]:
        """Per kind: (its best tried arm's rate, its arms' count), None if none was tried; with
        ``borrow``, a kind not tried in this context is worth what it earned in the nearest one
        (a server's rate hardly depends on the acceptance the edge would see)."""
        table, values = self._known(), {}
        for kind, modes in kinds.items():
            arms = [a for a in self.arms if a.mode in modes]
            source = table
            if borrow and not any(table[a][1] > 0 for a in arms):
                source = self._nearest_with(arms) or table
            tried = [a for a in arms if source[a][1] > 0]
            values[kind] = (max(source[a][0] / source[a][1] for a in tried), sum(source[a][2] for a in arms)) \
                if tried else None
        return values

    def _nearest_with(self, arms: list[Decision]) -> dict[Decision, list[float]] | None:
        r, a = self.context
        known = [(abs(r - kr) + abs(a - ka), c) for c, t in self.stats.items() for kr, ka in [c]
                 if any(t[arm][1] > 0 for arm in arms)]
        return self.stats[min(known)[1]] if known else None

    def _ucb_kind(self, values: dict[str, tuple[float, float] | None]) -> str:
        untried = [k for k, v in values.items() if v is None]
        if untried:
            return untried[0]
        total = sum(count for _, count in values.values())
        scale = self.config.exploration * max(rate for rate, _ in values.values())
        return max(values, key=lambda k: values[k][0] + scale * math.sqrt(
            math.log(max(total, 1.0) + 1.0) / max(values[k][1], 1e-9)))

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        """Two levels, as a request is a long commitment: UCB over the kinds of request (DSD, cloud
        AR, co-located), a kind worth its best arm's rate; then UCB over the kind's own arms."""
        self.rtt_bucket = self.rtt_bucket_of(rtt_s, self.rtt_bucket)
        kinds = self._kinds(self.config.modes)
        values = self._kind_values(kinds)
        kind = self._ucb_kind(values)
        choice = self._pick(tuple(kinds[kind]))
        if choice.mode in edge_modes():
            self.current = choice
            return choice
        return self._server_in_session(choice, values[kind])

    def _server_in_session(self, choice: Decision, value: tuple[float, float] | None) -> Decision:
        """As ModelPolicy's: a server request that could come back (DSD earned more at this RTT in
        some acceptance context, by more than a round trip over a request's tokens) runs as a DSD
        session whose first round hands over at once; the stream's shadow drafting moves the
        context, and a round may then bring it back to the edge."""
        c = self.config
        if not (c.handover and c.dsd_modes and self.request_tokens and value):
            return choice
        dsd_rates = [v[0] / v[1] for (r, _), table in self.stats.items() if r == self.rtt_bucket
                     for arm, v in table.items() if arm.mode in c.dsd_modes and v[1] > 0]
        if not dsd_rates or (1 / value[0] - 1 / max(dsd_rates)) * self.request_tokens <= 2.0 ** self.rtt_bucket / 1e3:
            return choice
        self.current = choice
        return self._pick(c.dsd_modes)

    def observe_request(self, observation: RequestObservation) -> None:
        o = observation
        self.request_tokens = o.tokens
        if o.mode in edge_modes() or o.tokens < 1 or not (o.wall_s > 0):
            return
        context = self.context
        if o.shadow_positions:
            rate = o.shadow_matches / o.shadow_positions
            for _ in range(max(o.shadow_positions // 4, 1)):     # as ModelPolicy._observe_shadow
                self.acceptance.add(lm.expected_accepted_per_round(rate, 4), 1.0 - rate ** 4)
        arm = self._arm_of(o.mode, o.gamma)
        if arm is not None:
            self._credit(context, arm, o.tokens, o.wall_s, o.wall_s / self.COUNT_UNIT_S)


def make_controller(config: ControllerConfig):
    """The run's controller; a static run of a mode with its own policy (dsd/modes.py) gets that."""
    if config.name == "static" and get_mode(config.mode).policy is not None:
        return get_mode(config.mode).policy(config)
    return {"static": StaticPolicy, "heuristic": HeuristicPolicy, "model": ModelPolicy,
            "bandit": BanditPolicy}[config.name](config)
