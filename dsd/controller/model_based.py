"""The ``model`` policy of dsd/controller/interface.py: the closed form of dsd/analytic/latency_model on running
estimates of alpha, the RTT, t_draft and t_verify picks the plan of the lowest predicted
per-token latency, with a switching margin so it does not flap.

The verifier's queueing (other clients' passes ahead of ours: ``Observation.server_queue_s``) is
paid per server pass, whatever the mode: a DSD round's verification, every step of cloud AR, a
co-located round's draft block and its verification (``passes_per_round``). So the predictions
add a running estimate of it per pass: a loaded verifier makes every mode dearer, AR (one pass
per token) more than DSD (one per round of E tokens), small gammas more than large. Left out, a
DSD round was predicted too cheap by the queueing per round, and AR by the queueing per token
where t_ar came from the server's compute (a hand-over's steps) but not where it came from a
whole AR request's pace (which includes it; now taken out of it): the model leaned to AR or to
DSD depending on where its t_ar came from. Only rounds whose queueing cannot be the edge's own work
ahead of them are counted (``_queue_sample``): a sync round after a sync round of the request, a
hand-over stream's later steps; a pipelined block queues behind the edge's previous block, a
request's first round behind its own Open, a segment's first step behind the segment before."""

from __future__ import annotations

import math
from collections.abc import Callable

from dsd.analytic import latency_model as lm
from dsd.controller.interface import ControllerConfig, Decision, Observation, RequestObservation
from dsd.controller.estimators import Acceptance, Discounted, DiscountedLine, Level, add_shadow_rate
from dsd.modes import SERVER, SYNC, edge_modes, get_mode, server_modes
from dsd.controller.policy_configs import ModelPolicyConfig, settings_as


def passes_per_round(mode: str) -> int:
    """The server passes one round of ``mode`` queues for (AR: a step): a verification or an AR
    step; co-located, a draft block and then its verification."""
    return 2 if get_mode(mode).drafts == SERVER else 1


def predicted_per_token_s(
    mode: str,
    gamma: int,
    alpha: float,
    rtt_s: float,
    t_draft_s: float,
    t_verify_s: float,
    t_ar_s: float | None,
    t_draft_server_s: float | None = None,
    queue_s: float = 0.0,
) -> float:
    """The closed form's steady-state time per token of one plan (the mode's predictor in
    dsd/modes.py; t_draft_s is the edge's, t_draft_server_s the server's where a mode drafts there),
    with ``queue_s`` of the verifier's queueing per server pass added to the server's part of a
    round (a DSD round's wait for its verdict; an AR step)."""
    wait_s = queue_s * passes_per_round(mode)
    if get_mode(mode).speculative:
        t_verify_s = t_verify_s + wait_s
    elif t_ar_s is not None:
        t_ar_s = t_ar_s + wait_s
    return get_mode(mode).per_token_s(
        alpha,
        gamma,
        rtt_s,
        t_ar_s=t_ar_s,
        t_draft_edge_s=t_draft_s,
        t_draft_server_s=t_draft_server_s,
        t_verify_s=t_verify_s,
    )


def finite_request_factor(mode: str, gamma: int, alpha: float, tokens: int | None) -> float:
    """The steady per-token time's factor over the ``tokens`` a request still has to emit: a
    speculative round emits E tokens on average (E = expected_tokens_per_round), so the rounds
    overshoot the budget by about (E - 1) / 2 tokens, each as dear as the rest (the last round is
    cut to the budget but costs a whole round trip); AR emits one per step and wastes nothing.
    None or 0 tokens: the steady state (factor 1)."""
    if not tokens or not get_mode(mode).speculative:
        return 1.0
    return 1.0 + (lm.expected_tokens_per_round(alpha, gamma) - 1.0) / (2.0 * tokens)


def best_decision(
    alpha: float,
    rtt_s: float,
    t_draft_s: float,
    t_verify_s: float | Callable[[int], float],
    modes: tuple[str, ...],
    gamma_max: int,
    t_ar_s: float | None = None,
    t_draft_server_s: float | None = None,
    tokens: int | None = None,
    queue_s: float = 0.0,
) -> tuple[Decision, float]:
    """The plan of the lowest predicted per-token latency and that latency (ties: smaller gamma,
    then the earlier mode in ``modes``). ``t_verify_s``: seconds, or a function of gamma;
    ``tokens``: what the request still has to emit (``finite_request_factor``; None: steady state);
    ``queue_s``: the verifier's queueing per pass (``predicted_per_token_s``)."""
    verify = t_verify_s if callable(t_verify_s) else (lambda _g: t_verify_s)
    best: Decision | None = None
    best_s = math.inf
    for mode in modes:
        for gamma in range(1, gamma_max + 1) if get_mode(mode).speculative else [1]:
            cost_s = predicted_per_token_s(
                mode, gamma, alpha, rtt_s, t_draft_s, verify(gamma), t_ar_s, t_draft_server_s, queue_s
            ) * finite_request_factor(mode, gamma, alpha, tokens)
            if cost_s < best_s - 1e-15:
                best, best_s = Decision(gamma, mode), cost_s
    if best is None:
        raise ValueError(f"no plan among modes {modes!r}")
    return best, best_s


def known(value: float | None, name: str) -> float:
    """An estimate the caller has checked is measured (``ModelPolicy._measured``)."""
    if value is None:
        raise RuntimeError(f"{name}: not measured yet")
    return value


class ModelPolicy:
    """The closed form on running estimates, with a switching margin.

    Per round it picks among the DSD modes of ``config.modes``; per request (``decide_request``)
    among all of them, cloud AR and co-located SD included. The server's AR step is measured from
    AR requests (before any: the ``t_ar_s`` prior, else the verification of one token as
    measured, which is what a memory-bound target's AR step costs); the server's draft step from
    co-located requests likewise. Alpha is only measured in DSD: after ``explore_after`` server
    requests in a row, where DSD at the best alpha seen so far would beat the server, one request
    runs DSD again to re-measure it."""

    # A request on the server comes back to the edge only if that pays off at alpha's lower
    # confidence bound too (``Acceptance.lower_bound``, z standard errors): an estimate restarted at a
    # prompt boundary on 6 shadow matches in 6 reads 1.0, enough to flip a request from cloud AR to a
    # long DSD plan and back within it at a slow link (docs/results/adaptive.md). The
    # same holds for a request after one on the server (``decide_request``): a 0.3-class prompt's
    # shadow drafts over ~10 positions of memory often read 0.5, enough for DSD at 10 ms when it
    # does not pay
    HAND_BACK_Z = 1.0
    # rounds whose drafting is measured before the first decision: counted, not the Level's
    # discounted weight (1.9 after two rounds: every run's first request waited a third sync round)
    DRAFT_ROUNDS = 2

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        discount = self.settings.discount
        self.current = config.dsd_start
        self.acceptance = Acceptance(discount)
        self.rtt_s = Level(discount)  # the link: follows its steps
        self.rtt_floor_s: float | None = None  # the fastest the link has been measured
        self.rtt_ceiling_s: float | None = None  # the slowest its running level has been
        self.request_positions = 0  # positions drafted or shadowed in this request
        self.request_matches = 0  # ... and those accepted or matched
        # the edge's draft step: a Level, as the link (a host stall only adds time, so a step
        # far below restarts it), and no round is planned on it before two rounds measured it (a
        # stall in the run's first block read 21 ms a step on a 1 ms device and sent a 5 ms edge
        # to cloud AR for its whole run: CI's compose run of 1c2c999)
        self.t_draft_s = Level(discount)
        self.t_verify_s = DiscountedLine(discount)  # against gamma
        self.t_ar_s = Discounted(0.5)  # per AR request: steady per-token time
        self.t_draft_server_s = Discounted(0.5)
        self.queue_s = Discounted(discount)  # the verifier's queueing per pass (others' work)
        self.last_round_mode: str | None = None  # the request's previous round's mode
        self.alpha_best = 0.0  # the highest alpha estimate so far
        self.server_streak = 0  # server requests in a row
        self.last_request: Decision | None = None
        self.remaining_tokens: int | None = None  # the request's budget, as last observed
        self.request_tokens: int | None = None  # the last request's length (the next one's guess)

    @property
    def settings(self) -> ModelPolicyConfig:
        """This policy's own settings (the config's, so a config replaced on a live policy counts)."""
        return settings_as(self.config.settings, ModelPolicyConfig)

    def observe(self, observation: Observation) -> None:
        if observation.stale:
            return
        if observation.starts_request_after(self.remaining_tokens):
            self._new_request_positions()
        self.remaining_tokens = observation.remaining_tokens
        self.queue_s.add(self._queue_sample(observation))
        self.last_round_mode = observation.mode
        if observation.mode in server_modes():
            self._observe_server(observation)
            return
        self.acceptance.add(observation.accepted, float(observation.accepted < observation.proposed))
        self._add_positions(observation.proposed, observation.accepted)
        self._add_rtt(observation.rtt_s)
        self.t_draft_s.add(observation.t_draft_s)
        self.t_verify_s.add(observation.proposed, observation.t_verify_s)
        alpha = self.alpha
        if alpha is not None and self.acceptance.weight >= 5:
            self.alpha_best = max(self.alpha_best, alpha)

    def _add_rtt(self, rtt_s: float | None, measured: bool = True) -> None:
        """A sample of the link; only a measured one moves the fastest and slowest levels seen (a
        burst's guess, symmetric, may read a 10 ms link as 7.5)."""
        self.rtt_s.add(rtt_s)
        if measured and rtt_s is not None and math.isfinite(rtt_s) and rtt_s > 0:
            self.rtt_floor_s = rtt_s if self.rtt_floor_s is None else min(self.rtt_floor_s, rtt_s)
            self.rtt_ceiling_s = max(self.rtt_ceiling_s or 0.0, known(self.rtt_s.value, "rtt_s"))

    def _add_positions(self, positions: int, matches: int) -> None:
        """Count this request's drafted (or shadowed) positions and the accepted (matched) ones."""
        self.request_positions += positions
        self.request_matches += matches

    def _new_request_positions(self) -> None:
        self.request_positions, self.request_matches = 0, 0
        self.acceptance.new_request()

    def stream_ahead_s(self) -> float | None:
        """The round trip a server stream should be kept asked ahead for (dsd/drive/driver.py
        ``keep_server_busy``; None: the link as last measured). Asked one round trip ahead, a stream
        whose link slows mid-way (10 -> 150 ms) leaves the server idle until a segment's first
        tokens show the new RTT: 0.17 s lost per such step on netns, where cloud AR was the best
        plan on both links. So while the request is on the server and no edge plan would take it
        back even on the fastest link measured so far (``_hands_back``, as ``decide``), the stream is
        kept asked for the slowest link level seen, and at least ``stream_ahead_floor_s`` (a slow
        Internet path's RTT) for the step to a level not seen yet -- the run's first 10 -> 150 ms
        step cost 0.15-0.23 s on every netns seed with the slowest seen alone: only a change of
        acceptance could end such a stream early, and then the segments asked beyond the RTT are
        withdrawn when the plan goes back to the edge (dsd/drive/driver.py ``Segment.ahead``). So it is
        asked from the request's first segment: gated on the request's own drafts, a step in its
        first tokens idles the server a round trip of the new link (docs/results/adaptive.md). Judged at the higher of the running alpha and the
        request's own rate so far: a new prompt may bring a new alpha, and the running estimate
        (discounted) follows a rise over many positions. Asked once per stream arrival, beside
        ``decide``: about as dear (~0.12 ms here)."""
        if (
            self.current.mode not in server_modes()
            or not self.config.dsd_modes
            or not self._measured()
            or self.rtt_floor_s is None
        ):
            return None
        alpha = max(known(self.alpha, "alpha"), self.request_matches / max(self.request_positions, 1))
        rtt_s = self.rtt_floor_s
        if self._hands_back(self._best(self.config.dsd_modes, alpha, rtt_s)[0], alpha, rtt_s):
            return None
        return max(
            known(self.rtt_ceiling_s, "rtt_ceiling_s"), self.settings.stream_ahead_floor_s
        )  # set with rtt_floor_s

    def link_rtt_s(self) -> float | None:
        """The link's RTT as the plans are decided on (the probe before a request, then the
        rounds' running level): the driver's measure of a segment asked before this request
        measured the link itself (dsd/drive/driver.py ``_asked_on_rtt_s``)."""
        return self.rtt_s.value

    def server_step_s(self) -> float | None:
        """The server's step per streamed token as the plans are decided on (``t_ar_s``, from
        earlier AR requests, else the prior): how far ahead the driver asks a stream before the
        request measured it (dsd/drive/driver.py ``_pace``)."""
        return self._t_ar_s()

    def _queue_sample(self, o: Observation) -> float | None:
        """The verifier's queueing per pass this round saw from other clients' work, where nothing
        of the edge's own can have been ahead of it (module docstring); else None."""
        if o.server_queue_s is None:
            return None
        if o.mode in server_modes():  # a segment's later steps (rtt_s None) are ready at our previous pass's end
            return o.server_queue_s / passes_per_round(o.mode) if o.rtt_s is None and o.tokens else None
        return o.server_queue_s if o.mode == SYNC and self.last_round_mode == SYNC else None

    @property
    def server_queue_s(self) -> float:
        """The running estimate of the verifier's queueing per pass (0 before any sample)."""
        return self.queue_s.value or 0.0

    @property
    def alpha(self) -> float | None:
        """Maximum likelihood under i.i.d. acceptance (as ``Generation.alpha_measured``), discounted."""
        return self.acceptance.value

    def _t_ar_s(self) -> float | None:
        return self.t_ar_s.value or self.settings.t_ar_s or self.t_verify_s.at(1)

    def _t_draft_server_s(self) -> float | None:
        return self.t_draft_server_s.value or self.settings.t_draft_server_s or self.t_draft_s.value

    def _cost_s(self, decision: Decision, alpha: float, rtt_s: float) -> float:
        return predicted_per_token_s(
            decision.mode,
            decision.gamma,
            alpha,
            rtt_s,
            self._t_draft_edge_s(),
            self._t_verify_at(decision.gamma),
            self._t_ar_s(),
            self._t_draft_server_s(),
            self.server_queue_s,
        ) * finite_request_factor(decision.mode, decision.gamma, alpha, self.remaining_tokens)

    def _best(self, modes: tuple[str, ...], alpha: float, rtt_s: float) -> tuple[Decision, float]:
        return best_decision(
            alpha,
            rtt_s,
            self._t_draft_edge_s(),
            self._t_verify_at,
            modes,
            self.config.gamma_max,
            self._t_ar_s(),
            self._t_draft_server_s(),
            self.remaining_tokens,
            self.server_queue_s,
        )

    def _t_draft_edge_s(self) -> float:
        return known(self.t_draft_s.value, "t_draft_s")

    def _t_verify_at(self, gamma: int) -> float:
        return known(self.t_verify_s.at(gamma), "t_verify_s")

    def _measured(self) -> bool:
        return not (
            self.alpha is None
            or self.rtt_s.value is None
            or self.t_draft_s.value is None
            or self.t_verify_s.at(1) is None
        )

    def decide(self) -> Decision:
        """The next round's plan: the best predicted, if at least ``margin_pct`` faster than the
        current one and, for a hand-over (to the server or back), if the time it saves over the
        request's remaining tokens outweighs the round trip the hand-over costs; a hand-back from
        the server, also at alpha's lower confidence bound (``HAND_BACK_Z``)."""
        if not self._measured() or self.t_draft_s.count < self.DRAFT_ROUNDS:
            return self.current  # not measured enough yet: the configured start
        alpha, rtt_s, modes = known(self.alpha, "alpha"), known(self.rtt_s.value, "rtt_s"), self.config.round_modes
        best, _ = self._best(modes, alpha, rtt_s)
        if self.current.mode not in modes:
            self.current = best
            return self.current
        on_server = self.current.mode in server_modes()
        hands_over = (best.mode in server_modes()) != on_server
        if hands_over and on_server:
            switch = self._hands_back(best, alpha, rtt_s)
        else:
            switch = self._worth_switching(best, alpha, rtt_s, hands_over)
        if switch:
            self.current = best
        return self.current

    def _cautious_alpha(self, alpha: float) -> float:
        """``alpha``, or alpha's lower confidence bound (``HAND_BACK_Z``) where that is lower."""
        lower = self.acceptance.lower_bound(self.HAND_BACK_Z)
        return alpha if lower is None else min(alpha, lower)

    def _hands_back(self, best: Decision, alpha: float, rtt_s: float) -> bool:
        """A request on the server comes back to the edge for ``best`` only if that is worth it
        (``_worth_switching``) at ``alpha`` and at alpha's lower confidence bound."""
        return self._worth_switching(best, alpha, rtt_s, True) and self._worth_switching(
            best, self._cautious_alpha(alpha), rtt_s, True
        )

    def _worth_switching(self, best: Decision, alpha: float, rtt_s: float, hands_over: bool) -> bool:
        """``best`` is predicted at least ``margin_pct`` faster than the current plan at ``alpha``,
        and a hand-over (to the server or back) saves more over the request's remaining tokens
        than the round trip it costs."""
        best_s, current_s = self._cost_s(best, alpha, rtt_s), self._cost_s(self.current, alpha, rtt_s)
        pays_off = (
            not hands_over or self.remaining_tokens is None or (current_s - best_s) * self.remaining_tokens > rtt_s
        )
        return best_s < current_s * (1 - self.settings.margin_pct / 100) and pays_off

    def _observe_server(self, o: Observation) -> None:
        """A server round of a hand-over: shadow drafting's positions as draws of alpha (co-located
        rounds without them: the server's own draft rounds), the hand-over's round trip as the
        link's, the round's compute as the server's AR step (or draft steps, co-located)."""
        self._add_rtt(o.rtt_s, not o.rtt_inferred)
        if o.shadow_positions:
            self.acceptance.add(o.shadow_matches, o.shadow_positions - o.shadow_matches)
            self._add_positions(o.shadow_positions, o.shadow_matches)
        speculative = get_mode(o.mode).speculative
        if speculative and o.proposed and not o.shadow_positions:
            self.acceptance.add(o.accepted, float(o.accepted < o.proposed))
            self._add_positions(o.proposed, o.accepted)
        if o.t_verify_s is None or not o.tokens:
            return
        if not speculative:
            self.t_ar_s.add(o.t_verify_s / o.tokens)  # the server's step (arrival gaps are the link's)
        elif (t_verify_s := self.t_verify_s.at(o.gamma)) is not None and o.proposed:
            t_ds = (o.t_verify_s - t_verify_s) / o.proposed  # compute = drafts + verify
            if t_ds > 0:
                self.t_draft_server_s.add(t_ds)

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        """The request's mode (and start plan): the lowest predicted per-token time at the RTT
        just probed (else the running estimate), with the margin against the last choice; after a
        request on the server, the edge only if it wins at alpha's lower bound too (``HAND_BACK_Z``)."""
        c = self.config
        self.remaining_tokens = self.request_tokens  # the new request's, until its rounds say
        self.last_round_mode = None  # its first round queues behind its own Open
        self._new_request_positions()
        if rtt_s is not None:  # a probe is the link now: the rounds' running estimate restarts from it
            self.rtt_s = Level(self.settings.discount)
            self._add_rtt(rtt_s)
        if not self._measured():
            self.last_request = c.dsd_start if c.dsd_modes else Decision(c.gamma, c.modes[0])
            return self.last_request
        rtt_s = known(self.rtt_s.value, "rtt_s")
        alpha = known(self.alpha, "alpha")
        best, best_s = self._best(c.modes, alpha, rtt_s)
        last = self.last_request
        if (
            last is not None
            and last.mode in c.modes
            and best_s >= self._cost_s(last, alpha, rtt_s) * (1 - self.settings.margin_pct / 100)
        ):
            best = last if last.mode in server_modes() else self._best((last.mode,), alpha, rtt_s)[0]
        if last is not None and last.mode in c.modes and last.mode in server_modes() and best.mode in edge_modes():
            if self._best(c.modes, self._cautious_alpha(alpha), rtt_s)[0].mode in server_modes():
                best = last  # back from the server only if the edge wins at alpha's lower bound too
        if best.mode in server_modes() and c.dsd_modes and self.server_streak >= self.settings.explore_after:
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
        """A server request runs as a DSD session whose first round hands over to the server at
        once (``current``): it costs what a plain server request does (the edge sends Open and
        Generate back to back either way), and its rounds let the controller follow the request:
        every segment measures the link, shadow drafting the acceptance, and a round may bring
        the request back to the edge when either moves."""
        c = self.config
        if not (c.handover and c.dsd_modes):
            return best
        self.current = best
        return self._best(c.dsd_modes, alpha, rtt_s)[0]

    def observe_request(self, observation: RequestObservation) -> None:
        self.request_tokens = observation.tokens or None
        if observation.rtt_s is not None:
            self._add_rtt(observation.rtt_s)
        if observation.mode in edge_modes():
            self.server_streak = 0
            return
        self.server_streak += 1
        if observation.shadow_positions:
            self.server_streak = 0  # alpha is measured along the stream: no need to look
            add_shadow_rate(self.acceptance, observation.shadow_positions, observation.shadow_matches)
        per_token_s = observation.steady_per_token_s
        if per_token_s is None:
            return
        queued_s = self.server_queue_s * passes_per_round(observation.mode)  # per step or round: not compute
        if not get_mode(observation.mode).speculative:
            if per_token_s > queued_s:
                self.t_ar_s.add(per_token_s - queued_s)
        elif self.alpha is not None and (t_verify_s := self.t_verify_s.at(observation.gamma)) is not None:
            # (gamma*t_ds + t_v + queueing)/E = per token  ->  t_ds
            e = lm.expected_tokens_per_round(self.alpha, observation.gamma)
            t_ds = (per_token_s * e - t_verify_s - queued_s) / observation.gamma
            if t_ds > 0:
                self.t_draft_server_s.add(t_ds)
