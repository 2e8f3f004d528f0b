"""Running estimates the adaptive policies (dsd/policy_model.py, dsd/policy_bandit.py) keep:
a discounted mean, a discounted least-squares line, and the acceptance rate with a change test."""
from __future__ import annotations

import math
from collections import deque

from dsd import latency_model as lm


class Discounted:
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


class DiscountedLine:
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


class Acceptance:
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
        self.accepted, self.rejected = Discounted(discount), Discounted(discount)
        self.recent: deque[tuple[float, float]] = deque()

    def add(self, accepted: float, rejected: float) -> None:
        self.accepted.add(accepted)
        self.rejected.add(rejected)
        self.recent.append((accepted, rejected))
        while len(self.recent) > 1 and sum(a + r for a, r in list(self.recent)[1:]) >= self.MIN_POSITIONS:
            self.recent.popleft()
        if sum(a + r for a, r in self.recent) >= self.MIN_POSITIONS and self._changed():
            self.accepted, self.rejected = Discounted(self.discount), Discounted(self.discount)
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


def add_shadow_rate(acceptance: Acceptance, positions: int, matches: int) -> None:
    """Shadow drafting over a whole server request as rounds of gamma 4 would have gone at that
    per-position rate: each adds its expected accepted drafts and chance of a rejection (keeps the
    estimator's form)."""
    rate = matches / positions
    for _ in range(max(positions // 4, 1)):
        acceptance.add(lm.expected_accepted_per_round(rate, 4), 1.0 - rate ** 4)
