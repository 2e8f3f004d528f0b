"""The ``bandit`` policy of dsd/controller/interface.py: discounted UCB over (mode, gamma) arms, the reward
a round's (or a server request's) tokens per second, with no latency model inside."""

from __future__ import annotations

import dataclasses
import math

from dsd.analytic import latency_model as lm
from dsd.controller.interface import ControllerConfig, Decision, Observation, RequestObservation
from dsd.controller.estimators import Acceptance, add_shadow_rate
from dsd.modes import edge_modes, get_mode, server_modes
from dsd.controller.policy_configs import BanditConfig, settings_as
from dsd.controller.model_based import ModelPolicy, known, predicted_per_token_s

Context = tuple[int, int]  # (RTT bucket, acceptance bucket)


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
    sqrt(log(total) / count), counts in rounds (a server round or request counts one per 0.05
    s). Two levels: UCB over kinds (DSD, cloud AR, co-located), a kind worth its best tried
    arm, then UCB over the kind's arms; an untried arm is tried first, from the configured start
    outwards; an arm untried in a context takes its statistics from a neighbouring context, and a
    context not seen yet starts from the nearest one seen. A request starts as a DSD session
    (``decide_request``), every round may change the arm and, by a hand-over, the kind.

    Informed prior (``prior_rounds``, default 6; 0 turns it off): every arm's statistics in the
    current context carry ``prior_rounds`` pseudo-rounds at the rate the closed form of
    dsd/analytic/latency_model predicts for it from the running estimates (alpha, the link's RTT, t_draft,
    t_verify's line, the server's step: the model policy's estimators, fed every observation).
    This is a prediction, not a measurement, and is documented as such: it only decides where
    exploring is worth it (an arm predicted far behind is not tried in every new context; the
    uninformed bandit tried every arm and kind in the first request and again whenever the
    acceptance moved, and under-sampled the large gammas whose rounds vary most), while what an arm
    earns outweighs its prior after a few rounds. The value 6 was chosen among 1.5 / 3 / 6 / 12 on
    the sim's seeds 3-5 (benchmarks/adaptive.py), not on the seeds reported."""

    COUNT_UNIT_S = 0.05

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        settings = settings_as(config.settings, BanditConfig)
        gammas = sorted({g for g in settings.gammas if g <= config.gamma_max}) or [config.gamma_max]
        self.arms: list[Decision] = []
        for mode in config.modes:
            self.arms += [Decision(g, mode) for g in gammas] if get_mode(mode).speculative else [Decision(1, mode)]
        self.stats: dict[Context, dict[Decision, list[float]]] = {}  # context -> arm -> [tokens, seconds, count]
        self.rtt_bucket = 0
        self.alpha_bucket = 2  # alpha 0.5 until measured
        self.acceptance = Acceptance(settings.model.discount)
        self.current = (
            config.dsd_start
            if config.dsd_start in self.arms
            else next((a for a in self.arms if a.mode in edge_modes()), self.arms[0])
        )
        self.remaining_tokens: int | None = None  # the request's budget, as last observed
        self.fresh = False  # decide_request chose; no round asked since
        # the informed prior: the model policy's estimates (it sees every observation; its own
        # decisions are not used), whose closed-form prediction of each arm's rate counts as
        # ``prior_rounds`` pseudo-rounds of that arm in whatever context is current
        self.model = ModelPolicy(dataclasses.replace(config, name="model", settings=settings.model))

    @property
    def settings(self) -> BanditConfig:
        """This policy's own settings; ``settings.model``: those of the model policy beside it."""
        return settings_as(self.config.settings, BanditConfig)

    # A context moves only once its estimate is a quarter bucket past the bucket's edge: an RTT
    # near a factor-2 edge (10-12 ms, from jitter and load) or an alpha estimate near a 0.2 edge
    # (shadow drafting's estimate over some ten positions moves by +-0.15) would otherwise flip
    # between two contexts, each with arms to try, and a request would flap between edge and server.
    HYSTERESIS_BUCKETS = 0.25

    @classmethod
    def rtt_bucket_of(cls, rtt_s: float | None, default: int) -> int:
        if rtt_s is None or not math.isfinite(rtt_s):
            return default
        x = math.log2(max(rtt_s * 1e3, 0.5))
        return default if abs(x - default) <= 0.5 + cls.HYSTERESIS_BUCKETS else int(round(x))

    def _note_alpha(self) -> None:
        alpha = self.acceptance.value
        if alpha is not None and abs(alpha * 5 - (self.alpha_bucket + 0.5)) > 0.5 + self.HYSTERESIS_BUCKETS:
            self.alpha_bucket = min(int(alpha * 5), 4)

    @property
    def context(self) -> tuple[int, int]:
        return self.rtt_bucket, self.alpha_bucket

    def _known(self) -> dict[Decision, list[float]]:
        """The current context's table, an arm not tried in it taking what it earned in a
        neighbouring context (one bucket away: the contexts are coarse, and an arm earns much the
        same across a bucket's edge, so each arm need not be tried again in every bucket the
        estimates pass through); while the context has nothing, the nearest context's that has."""
        table = self._table(self.context)
        r, a = self.context
        if not any(v[1] > 0 for v in table.values()):
            known = [
                (abs(r - kr) + abs(a - ka), c)
                for c, t in self.stats.items()
                for kr, ka in [c]
                if any(v[1] > 0 for v in t.values())
            ]
            return self._with_prior(self.stats[min(known)[1]] if known else table)
        merged = dict(table)
        for arm, value in table.items():
            if value[1] <= 0:
                near = [
                    (abs(r - kr) + abs(a - ka), c)
                    for c, t in self.stats.items()
                    for kr, ka in [c]
                    if t[arm][1] > 0 and abs(r - kr) + abs(a - ka) <= 1
                ]
                if near:
                    merged[arm] = self.stats[min(near)[1]][arm]
        return self._with_prior(merged)

    def _with_prior(self, table: dict[Decision, list[float]]) -> dict[Decision, list[float]]:
        """``table`` with every arm's prior added (new lists: the statistics stay what was earned)."""
        priors = {arm: self._prior(arm) for arm in table}
        return {
            arm: value if (prior := priors[arm]) is None else [v + p for v, p in zip(value, prior)]
            for arm, value in table.items()
        }

    def _prior(self, arm: Decision) -> tuple[float, float, float] | None:
        """An informed prior, NOT a measurement of the arm: the closed form of dsd/analytic/latency_model on
        the running estimates of alpha, the link's RTT, t_draft, t_verify and the server's step
        (those of the model policy), as ``prior_rounds`` pseudo-rounds (tokens, seconds, count):
        a DSD arm's rounds of E(alpha, gamma) tokens at its predicted time per token, a server
        arm's counting units (``COUNT_UNIT_S``) at its predicted step. So an arm the prediction
        puts far behind is not explored by trying it in every new context (at 150 ms a DSD try
        costs a round trip and a round; the first request tried every arm), the arms it puts near
        the best are, and what an arm earns outweighs its prior after a few rounds. None until the
        estimates exist (the first round of a run), or with ``prior_rounds`` 0."""
        m, n = self.model, self.settings.prior_rounds
        if not n or not m._measured():
            return None
        alpha = min(max(known(m.alpha, "alpha"), 0.0), 0.999)
        per_token_s = predicted_per_token_s(
            arm.mode,
            arm.gamma,
            alpha,
            known(m.rtt_s.value, "rtt_s"),
            m._t_draft_edge_s(),
            m._t_verify_at(arm.gamma),
            m._t_ar_s(),
            m._t_draft_server_s(),
            m.server_queue_s,
        )
        if not (per_token_s and per_token_s > 0 and math.isfinite(per_token_s)):
            return None
        if get_mode(arm.mode).speculative:
            tokens = lm.expected_tokens_per_round(alpha, arm.gamma)
            return n * tokens, n * tokens * per_token_s, n
        return n * self.COUNT_UNIT_S / per_token_s, n * self.COUNT_UNIT_S, n

    def _table(self, context: Context) -> dict[Decision, list[float]]:
        return self.stats.setdefault(context, {a: [0.0, 0.0, 0.0] for a in self.arms})

    def _credit(self, context: Context, arm: Decision, tokens: float, seconds: float, count: float) -> None:
        if arm not in self.arms or not (seconds > 0 and math.isfinite(seconds)):
            return
        keep = 0.5 ** (seconds / self.settings.horizon_s)
        for table in self.stats.values():
            for value in table.values():
                value[:] = [v * keep for v in value]
        value = self._table(context)[arm]
        value[0] += tokens
        value[1] += seconds
        value[2] += count

    def observe(self, observation: Observation) -> None:
        o = observation
        self.model.observe(o)
        if o.stale:
            return
        context = self.context  # the one the round was planned in
        self.rtt_bucket = self.rtt_bucket_of(o.rtt_s, self.rtt_bucket)
        if o.starts_request_after(self.remaining_tokens):
            self.acceptance.new_request()
        self.remaining_tokens = o.remaining_tokens
        if o.mode in server_modes():
            self._observe_server(context, o)
            return
        self.acceptance.add(o.accepted, float(o.accepted < o.proposed))
        self._note_alpha()
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
            # the configured start first, then its neighbours (a kind is worth its best tried
            # arm: trying its extreme first, gamma 1, makes a good kind look bad)
            start = self.config.dsd_start
            return min(untried, key=lambda a: (a.mode != start.mode, abs(math.log2(a.gamma) - math.log2(start.gamma))))
        rates = {a: table[a][0] / table[a][1] for a in arms}
        total = sum(table[a][2] for a in arms)
        scale = self.settings.exploration * max(rates.values())
        return max(
            arms, key=lambda a: rates[a] + scale * math.sqrt(math.log(max(total, 1.0) + 1.0) / max(table[a][2], 1e-9))
        )

    def _observe_server(self, context: Context, o: Observation) -> None:
        """A server round of a hand-over earns its tokens over the time since the stream's last
        arrival, less the link's round trip where the round measured one (a stream's first: the
        hand-over's round trip is the cost of switching, which ``_worth_handing_over`` weighs, not
        the arm's pace: charged to a short exploration it would make the server look as slow as
        the link; at least the server's compute); shadow drafting moves the alpha context."""
        if o.shadow_positions:
            self.acceptance.add(o.shadow_matches, o.shadow_positions - o.shadow_matches)
            self._note_alpha()
        arm = self._arm_of(o.mode, o.gamma)
        if arm is not None and o.tokens and o.interval_s:
            seconds = o.interval_s if o.rtt_s is None else max(o.interval_s - o.rtt_s, o.t_verify_s or 0.0)
            if seconds > 0:
                self._credit(context, arm, o.tokens, seconds, seconds / self.COUNT_UNIT_S)

    def _arm_of(self, mode: str, gamma: int) -> Decision | None:
        if not get_mode(mode).speculative:
            return Decision(1, mode)
        return min((a for a in self.arms if a.mode == mode), key=lambda a: abs(a.gamma - gamma), default=None)

    def decide(self) -> Decision:
        """The next round's arm: UCB over the kinds (DSD, and the server's where a hand-over is
        allowed), leaving the current kind only for one whose rate is ``margin_pct`` higher and
        whose time saved over the remaining tokens outweighs the hand-over's round trip (so
        exploration does not make it flap between edge and server); then UCB within the kind."""
        if self.fresh:  # the request's first round: its start plan
            self.fresh = False
            return self.current
        kinds = self._kinds(self.config.round_modes)
        values = self._kind_values(kinds, borrow=True)
        here = self._kind_of(self.current.mode)
        kind = self._ucb_kind(values, here)
        if kind != here and here in kinds:
            new, old = values.get(kind), values.get(here)
            # a kind with no statistics here (nor, for DSD, in a neighbouring context; for the
            # server, anywhere) is explored by a hand-over: a segment or a round tells its rate;
            # a tried one must be worth the hand-over
            if new is not None and old is not None and not self._worth_handing_over(new[0], old[0]):
                kind = here
        self.current = self._pick(tuple(kinds[kind]))
        return self.current

    def _worth_handing_over(self, new_rate: float, old_rate: float) -> bool:
        saved_s = (1 / old_rate - 1 / new_rate) * (self.remaining_tokens or 0)
        margin = 1 + self.settings.model.margin_pct / 100
        return new_rate >= old_rate * margin and saved_s >= 2.0**self.rtt_bucket / 1e3

    @staticmethod
    def _kind_of(mode: str) -> str:
        return "dsd" if mode in edge_modes() else mode

    def _kinds(self, modes: tuple[str, ...]) -> dict[str, list[str]]:
        kinds: dict[str, list[str]] = {}
        for mode in modes:
            kinds.setdefault(self._kind_of(mode), []).append(mode)
        return kinds

    def _kind_values(self, kinds: dict[str, list[str]], borrow: bool = False) -> dict[str, tuple[float, float] | None]:
        """Per kind: (its best tried arm's rate, shrunk toward the kind's pooled rate by one
        observation, and its arms' count), None if none was tried; with ``borrow``, a kind not
        tried in this context is worth what it earned in the nearest one: a server kind in any (its
        rate hardly depends on the acceptance the edge would see), DSD in a neighbouring one (one
        bucket away: its rate moves with both) or in one that dominates this one (an RTT bucket no
        higher, an acceptance bucket no lower: DSD is no faster on a slower link or at a lower
        acceptance, so that rate is an optimistic initialisation, not a guess; if even it loses to
        the server kind there is nothing to explore -- a hand-over to try DSD at 150 ms costs a
        round trip and a round, ~0.3 s)."""
        table = self._known()
        values: dict[str, tuple[float, float] | None] = {}
        for kind, modes in kinds.items():
            arms = [a for a in self.arms if a.mode in modes]
            source = table
            if borrow and not any(table[a][1] > 0 for a in arms):
                source = self._nearest_with(arms, 1 if kind == "dsd" else None, dominating=True) or table
            tried = [a for a in arms if source[a][1] > 0]
            if not tried:
                values[kind] = None
                continue
            # each arm's rate shrunk toward the kind's pooled rate by one observation's weight:
            # a kind worth its best arm's raw rate is worth the luckiest single round (at 150 ms
            # one sync 8 round of 9 tokens made DSD look faster than cloud AR and kept a request
            # exploring DSD arms for a second); shrunk, one lucky round moves it halfway
            pooled = sum(source[a][0] for a in tried) / sum(source[a][1] for a in tried)
            values[kind] = (
                max((source[a][0] / source[a][1] * source[a][2] + pooled) / (source[a][2] + 1) for a in tried),
                sum(source[a][2] for a in arms),
            )
        return values

    def _nearest_with(
        self, arms: list[Decision], within: int | None = None, dominating: bool = False
    ) -> dict[Decision, list[float]] | None:
        r, a = self.context
        known = [
            (abs(r - kr) + abs(a - ka), c)
            for c, t in self.stats.items()
            for kr, ka in [c]
            if any(t[arm][1] > 0 for arm in arms)
        ]
        known = [k for k in known if within is None or k[0] <= within or (dominating and k[1][0] <= r and k[1][1] >= a)]
        return self.stats[min(known)[1]] if known else None

    def _ucb_kind(self, values: dict[str, tuple[float, float] | None], here: str = "dsd") -> str:
        """UCB over kinds; an untried kind first (``here`` first of them, then DSD: trying the
        kind a request is already in costs no hand-over)."""
        untried = sorted((k for k, v in values.items() if v is None), key=lambda k: (k != here, k != "dsd"))
        if untried:
            return untried[0]
        tried = {k: v for k, v in values.items() if v is not None}
        total = sum(count for _, count in tried.values())
        scale = self.settings.exploration * max(rate for rate, _ in tried.values())
        return max(
            tried,
            key=lambda k: tried[k][0] + scale * math.sqrt(math.log(max(total, 1.0) + 1.0) / max(tried[k][1], 1e-9)),
        )

    def link_rtt_s(self) -> float | None:
        """As ModelPolicy's: the link's RTT the plans are decided on."""
        return self.model.link_rtt_s()

    def server_step_s(self) -> float | None:
        """As ModelPolicy's: the server's step per streamed token."""
        return self.model.server_step_s()

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        """Two levels, as a request is a long commitment: UCB over the kinds of request (DSD, cloud
        AR, co-located), a kind worth its best arm's rate; then UCB over the kind's own arms."""
        self.rtt_bucket = self.rtt_bucket_of(rtt_s, self.rtt_bucket)
        self.remaining_tokens = None
        self.acceptance.new_request()
        self.model.decide_request(rtt_s)  # only for its estimates: a probe restarts the RTT's
        kinds = self._kinds(self.config.modes)
        values = self._kind_values(kinds, borrow=True)
        kind = self._ucb_kind(values)
        choice = self._pick(tuple(kinds[kind]))
        self.fresh = True
        if choice.mode in edge_modes():
            self.current = choice
            return choice
        return self._server_in_session(choice)

    def _server_in_session(self, choice: Decision) -> Decision:
        """As ModelPolicy's: a server request runs as a DSD session whose first round hands over
        at once (it costs what a plain server request does); every segment measures the link and
        shadow drafting the acceptance, so the context can move and a round bring it back."""
        c = self.config
        if not (c.handover and c.dsd_modes):
            return choice
        self.current = choice
        return self._pick(c.dsd_modes)

    def observe_request(self, observation: RequestObservation) -> None:
        o = observation
        self.model.observe_request(o)
        if o.mode in edge_modes() or o.tokens < 1 or not (o.wall_s > 0):
            return
        context = self.context
        if o.shadow_positions:
            add_shadow_rate(self.acceptance, o.shadow_positions, o.shadow_matches)
            self._note_alpha()
        arm = self._arm_of(o.mode, o.gamma)
        if arm is not None:
            self._credit(context, arm, o.tokens, o.wall_s, o.wall_s / self.COUNT_UNIT_S)
