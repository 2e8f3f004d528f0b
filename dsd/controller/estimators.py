"""Running estimates the adaptive policies (dsd/controller/model_based.py, dsd/controller/bandit.py) keep:
a discounted mean, a discounted least-squares line, and the acceptance rate with a change test."""

from __future__ import annotations

import math
from collections import deque

from dsd.analytic import latency_model as lm


class Discounted:
    """A discounted running mean: recent rounds count more, so it follows a moving link."""

    def __init__(self, discount: float) -> None:
        self.discount, self.total, self.weight = discount, 0.0, 0.0
        self.count = 0  # values added (since a Level's restart): the weight is discounted

    def add(self, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.total = self.discount * self.total + value
            self.weight = self.discount * self.weight + 1.0
            self.count += 1

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight else None


class Level(Discounted):
    """A discounted mean of a quantity that moves in steps, the link's RTT (a move from Wi-Fi to
    LTE, a congested hour): once the latest ``STEP_RUN`` measurements all lie more than a factor
    ``STEP_FACTOR`` above the running value, or the latest one that far below it, the mean
    restarts from them. With the discount alone a step from 10 to 150 ms takes some ten rounds to
    pass 75 ms; with the test, two. A factor 2 is far outside one path's jitter yet well inside the
    steps that change the best plan (the bandit's RTT contexts are factor-2 buckets too); two in a
    row above, so one outlier (a queueing spike) does not restart it, while delays only ever add:
    a measurement that low is the link having become faster."""

    STEP_FACTOR = 2.0
    STEP_RUN = 2

    def __init__(self, discount: float) -> None:
        super().__init__(discount)
        self.recent: deque[tuple[float, float | None]] = deque(maxlen=self.STEP_RUN)  # (value, level before)

    def add(self, value: float | None) -> None:
        if value is None or not math.isfinite(value):
            return
        level = self.value
        self.recent.append((value, level))
        super().add(value)
        if level is None:
            return
        start = self.recent[0][1]  # the level before the run (the run itself moves it)
        high = (
            len(self.recent) == self.STEP_RUN
            and start is not None
            and all(v > start * self.STEP_FACTOR for v, _ in self.recent)
        )
        if high or value * self.STEP_FACTOR < level:
            self.total, self.weight, self.count = 0.0, 0.0, 0
            for v, _ in list(self.recent) if high else [(value, None)]:
                super().add(v)


class DiscountedLine:
    """A discounted least-squares line y = a + b*x (b >= 0; 0 while x has not varied): the
    verification time against the block's gamma."""

    def __init__(self, discount: float) -> None:
        self.discount = discount
        self.sums = [0.0] * 5  # weight, x, y, xx, xy

    def add(self, x: float, y: float | None) -> None:
        if y is not None and math.isfinite(y):
            self.sums = [self.discount * s + v for s, v in zip(self.sums, (1.0, x, y, x * x, x * y))]

    def at(self, x: float) -> float | None:
        w, sx, sy, sxx, sxy = self.sums
        if not w:
            return None
        var = sxx / w - (sx / w) ** 2
        slope = max((sxy / w - sx * sy / w**2) / var, 0.0) if var > 1e-9 else 0.0
        return sy / w + slope * (x - sx / w)


class Acceptance:
    """The acceptance rate alpha, discounted per observation: each adds its accepted drafts
    (successes) and rejections (failures: 1 unless a round's drafts were all accepted; shadow
    drafting adds its matches and misses), and alpha is their ratio (the maximum-likelihood rate
    of i.i.d. positions, as ``Generation.alpha_measured``).

    A change test keeps the discount from lagging behind a new prompt: among the latest
    observations (up to ``WINDOW_POSITIONS`` positions), every run of the most recent ones that
    covers ``MIN_POSITIONS`` positions or more is scored by how much likelier it is under its own
    rate than under the running one (a log-likelihood ratio: at alpha 0.9, three rejections in
    six positions score 3.1); once the best run scores more than ``RESET_NATS``, the estimate
    restarts from it (a generalised likelihood-ratio test for a change point). A high-alpha
    history holds many accepted drafts, so without this a drop to 0.3 takes some thirty rounds
    to show; with it, a few. The window is longer than the shortest run because the running
    value drifts towards the new rate meanwhile: a fixed run of six positions then never scores
    enough (seen in the sim: 0.95 -> 0.3 took 30 rounds); 32 positions is a few rounds at any
    gamma, within one request.

    A new request is a new prompt, and a prompt's acceptance may differ from the last one's: a
    change is far likelier there than between two rounds of one prompt. So the run that begins
    with the request's first observation (``new_request``) needs only ``REQUEST_RESET_NATS``: the
    prior odds against a change at a prompt boundary (about 1 in 12) plus the half nat the fitted
    rate gains by chance. With 4 for it too, a request at alpha 0.3 after several at 0.9 drafts about three times as
    many long rounds before the estimate falls (docs/results/adaptive.md)."""

    MIN_POSITIONS = 6
    # A request's first positions may restart the estimate from fewer, at ``RESET_NATS``: three
    # rejections in its first three positions after a run at 0.9 score 4.4 above it (at 0.9 one
    # request in a thousand starts so); waiting for six positions costs a low-alpha prompt two
    # more long rounds
    MIN_REQUEST_POSITIONS = 3
    WINDOW_POSITIONS = 32
    RESET_NATS = 4.0
    REQUEST_RESET_NATS = 2.5

    def __init__(self, discount: float) -> None:
        self.discount = discount
        self.accepted, self.rejected = Discounted(discount), Discounted(discount)
        self.recent: deque[tuple[float, float]] = deque()
        self.request_observations = 0  # of the current request (new_request), the latest in ``recent``

    def new_request(self) -> None:
        self.request_observations = 0

    def add(self, accepted: float, rejected: float) -> None:
        self.accepted.add(accepted)
        self.rejected.add(rejected)
        self.recent.append((accepted, rejected))
        self.request_observations += 1
        while len(self.recent) > 1 and sum(a + r for a, r in list(self.recent)[1:]) >= self.WINDOW_POSITIONS:
            self.recent.popleft()
        run = self._changed_run()
        if run:
            self.accepted, self.rejected = Discounted(self.discount), Discounted(self.discount)
            self.recent = deque(run)
            for a, r in run:
                self.accepted.add(a)
                self.rejected.add(r)

    def _changed_run(self) -> list[tuple[float, float]] | None:
        """The latest run of observations that scores highest above its threshold (``RESET_NATS``;
        ``REQUEST_RESET_NATS`` for the run of the whole current request), if any."""
        running = self.value
        if running is None:
            return None

        def log_likelihood(a: float, r: float, p: float) -> float:
            p = min(max(p, 1e-3), 1 - 1e-3)
            return a * math.log(p) + r * math.log(1 - p)

        best, best_excess, a, r = None, 0.0, 0.0, 0.0
        items = list(self.recent)
        for k in range(len(items) - 1, -1, -1):
            a, r = a + items[k][0], r + items[k][1]
            whole_request = len(items) - k == self.request_observations
            if a + r < (self.MIN_REQUEST_POSITIONS if whole_request else self.MIN_POSITIONS):
                continue
            threshold = self.REQUEST_RESET_NATS if whole_request and a + r >= self.MIN_POSITIONS else self.RESET_NATS
            excess = log_likelihood(a, r, a / (a + r)) - log_likelihood(a, r, running) - threshold
            if excess > best_excess:
                best, best_excess = items[k:], excess
        return best

    @property
    def value(self) -> float | None:
        a, r = self.accepted.value, self.rejected.value
        if a is None or r is None or a + r == 0:
            return None
        return min(a / (a + r), 0.999)  # alpha = 1 would make every gamma look free

    def lower_bound(self, z: float) -> float | None:
        """A lower confidence bound on alpha: Wilson's score interval on the discounted positions
        (accepted and rejected drafts, the discount's memory: ~10 observations), ``z`` standard
        errors below. Six matches in six positions read alpha 1.0 but bound it at 0.86 (z = 1);
        a long run of rounds at 0.9 stays near 0.9."""
        a, r = self.accepted.total, self.rejected.total
        n = a + r
        if n <= 0:
            return None
        p = a / n
        centre, spread = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        bound, value = max((centre - spread) / (1 + z * z / n), 0.0), self.value
        return bound if value is None else min(bound, value)

    @property
    def weight(self) -> float:
        return self.accepted.weight


def add_shadow_rate(acceptance: Acceptance, positions: int, matches: int) -> None:
    """Shadow drafting over a whole server request as rounds of gamma 4 would have gone at that
    per-position rate: each adds its expected accepted drafts and chance of a rejection (keeps the
    estimator's form)."""
    rate = matches / positions
    for _ in range(max(positions // 4, 1)):
        acceptance.add(lm.expected_accepted_per_round(rate, 4), 1.0 - rate**4)
