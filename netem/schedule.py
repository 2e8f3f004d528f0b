"""A link that changes while it runs: steps or a replayed trace, as plain data (pure).

    schedule = LinkSchedule.from_steps([{"at_s": 5, "rtt_ms": 150}, {"at_s": 10, "loss_pct": 1}])
    schedule = LinkSchedule.from_trace_csv("trace.csv")    # t_s, rtt_ms[, jitter_ms, loss_pct, rate_mbit]
    spec = schedule.state_at(base, t_s)                    # the link in force t_s after the start

A step changes the keys it names from `at_s` on and keeps the others (a trace row is a step that
names its columns). Keys use the experiment's spelling: rtt_ms, delay_up_ms, delay_down_ms,
jitter_ms, delay_distribution, correlation_pct, loss_pct, rate_mbit (0 = no cap). Before the first
step the link is `base`. The shaper applies a schedule without restarting anything (netem.shaper:
the kernel qdisc is changed in place; the NFQUEUE daemon switches each queue at its time).
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from netem.spec import LinkSpec

STEP_KEYS = (
    "rtt_ms",
    "delay_up_ms",
    "delay_down_ms",
    "jitter_ms",
    "delay_distribution",
    "correlation_pct",
    "loss_pct",
    "rate_mbit",
)
TRACE_COLUMNS = ("t_s", "rtt_ms", "jitter_ms", "loss_pct", "rate_mbit")
MAX_STEPS = 1_000_000


@dataclass(frozen=True)
class LinkStep:
    at_s: float
    changes: tuple[tuple[str, object], ...]  # (key, value), keys from STEP_KEYS

    def __post_init__(self):
        if (
            isinstance(self.at_s, bool)
            or not isinstance(self.at_s, (int, float))
            or not math.isfinite(self.at_s)
            or self.at_s < 0
        ):
            raise ValueError(f"at_s must be a finite number of seconds >= 0, got {self.at_s!r}")
        unknown = sorted({k for k, _ in self.changes} - set(STEP_KEYS))
        if unknown:
            raise ValueError(f"unknown schedule key(s) {unknown}; known: at_s and {list(STEP_KEYS)}")
        if not self.changes:
            raise ValueError(f"a schedule step at {self.at_s} s changes nothing: give a link key")


@dataclass(frozen=True)
class LinkSchedule:
    """Steps in time order; `state_at` is all a consumer (the shaper, a controller) needs."""

    steps: tuple[LinkStep, ...] = ()
    source: str = ""  # "steps" or the trace file's name: for records

    def __post_init__(self):
        times = [s.at_s for s in self.steps]
        if times != sorted(times):
            raise ValueError(f"schedule steps must be in time order (at_s), got {times[:10]}")
        if len(self.steps) > MAX_STEPS:
            raise ValueError(f"a schedule has at most {MAX_STEPS} steps, got {len(self.steps)}")

    def __bool__(self) -> bool:
        return bool(self.steps)

    @classmethod
    def from_steps(cls, steps: list[dict]) -> LinkSchedule:
        out = []
        for i, step in enumerate(steps):
            if not isinstance(step, dict) or "at_s" not in step:
                raise ValueError(f"schedule step {i}: expected a table with at_s and link keys, got {step!r}")
            step = dict(step)
            try:
                out.append(LinkStep(step.pop("at_s"), tuple(sorted(step.items()))))
            except ValueError as error:
                raise ValueError(f"schedule step {i}: {error}") from None
        return cls(tuple(out), "steps")

    @classmethod
    def from_trace_csv(cls, path: str | Path) -> LinkSchedule:
        """A measured trace: header t_s, rtt_ms and any of jitter_ms, loss_pct, rate_mbit."""
        path = Path(path)
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            columns = [c.strip() for c in reader.fieldnames or []]
            if columns[:2] != ["t_s", "rtt_ms"] or set(columns) - set(TRACE_COLUMNS):
                raise ValueError(
                    f"{path}: trace columns must be t_s, rtt_ms[, jitter_ms, loss_pct, rate_mbit]; got {columns}"
                )
            steps = []
            for line, row in enumerate(reader, start=2):
                try:
                    values = {k.strip(): float(v) for k, v in row.items()}
                    steps.append(LinkStep(values.pop("t_s"), tuple(sorted(values.items()))))
                except (TypeError, ValueError) as error:
                    raise ValueError(f"{path}:{line}: {error}") from None
        if not steps:
            raise ValueError(f"{path}: the trace has no rows")
        try:
            return cls(tuple(steps), path.name)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def index_at(self, t_s: float) -> int:
        """How many steps have taken effect t_s after the start (0 = still the base link)."""
        return bisect.bisect_right([s.at_s for s in self.steps], t_s)

    def state_at(self, base: LinkSpec, t_s: float) -> LinkSpec:
        spec = base
        for step in self.steps[: self.index_at(t_s)]:
            spec = apply_changes(spec, dict(step.changes))
        return spec

    def specs(self, base: LinkSpec) -> list[tuple[float, LinkSpec]]:
        """(at_s, the link from then on) for every step, in order: what a shaper applies."""
        out, spec = [], base
        for step in self.steps:
            spec = apply_changes(spec, dict(step.changes))
            out.append((float(step.at_s), spec))
        return out

    def check(self, base: LinkSpec) -> None:
        """Every state the schedule reaches from `base` is a valid link (raises ValueError)."""
        spec = base
        for i, step in enumerate(self.steps):
            try:
                spec = apply_changes(spec, dict(step.changes))
            except ValueError as error:
                raise ValueError(f"schedule step {i} (at_s={step.at_s}): {error}") from None


def apply_changes(spec: LinkSpec, changes: dict) -> LinkSpec:
    """`spec` with some keys changed (experiment spelling; rate_mbit 0 = no cap)."""
    changes = {("distribution" if k == "delay_distribution" else k): v for k, v in changes.items()}
    if "rate_mbit" in changes:
        changes["rate_mbit"] = changes["rate_mbit"] or None
    if "rtt_ms" in changes:
        changes.update(delay_up_ms=None, delay_down_ms=None)
    elif "delay_up_ms" in changes or "delay_down_ms" in changes:
        changes = {"delay_up_ms": spec.up.delay_ms, "delay_down_ms": spec.down.delay_ms, **changes, "rtt_ms": None}
    return dataclasses.replace(spec, **changes)


def expected_rtt_at_ms(schedule: LinkSchedule, base: LinkSpec, sent_s: float, probe_bytes: int = 0) -> float:
    """The RTT a probe sent at `sent_s` should see: the up delay in force when it leaves, then the
    down delay in force when its reply starts back (a step between the two counts for the reply)."""
    up = schedule.state_at(base, sent_s)
    up_ms = up.up.delay_ms + (1000.0 * probe_bytes / up.up.rate_bytes_s if up.up.rate_bytes_s else 0.0)
    down = schedule.state_at(base, sent_s + up_ms / 1000.0)
    down_ms = down.down.delay_ms + (1000.0 * probe_bytes / down.down.rate_bytes_s if down.down.rate_bytes_s else 0.0)
    return up_ms + down_ms


def effect_brackets(
    changes: list[tuple[float, float, float]], samples: list[tuple[float, float]], tolerance_ms: float
) -> list[tuple[float, float]]:
    """When each change took effect as probes saw it, bracketed: for (at_s, old_rtt_ms, new_rtt_ms),
    (not_before_s, seen_s). seen_s is the send time of the first probe at or after at_s whose RTT is
    within tolerance_ms of the new RTT and nearer the new than the old one (NaN if none did before the
    next change); not_before_s is the send time of the last probe sent in [at_s, seen_s) whose RTT was
    nearer the old than the new one (it still saw the old link), else at_s. The change was in force
    somewhere in between. A probe held up on the way (a stalled host: its RTT is the new one plus the
    stall, beyond the tolerance) or a probe thread late to send widens the bracket at its upper end;
    only a late link moves not_before_s. `samples` are (sent_s, rtt_ms), lost probes left out, in any
    order (replies come back in their own)."""
    out = []
    samples = sorted(samples)
    sent = [s for s, _ in samples]
    for i, (at_s, old_ms, new_ms) in enumerate(changes):
        until_s = changes[i + 1][0] if i + 1 < len(changes) else math.inf
        not_before_s, found = at_s, math.nan
        for sent_s, rtt_ms in samples[bisect.bisect_left(sent, at_s) :]:
            if sent_s >= until_s:
                break
            to_new_ms = abs(rtt_ms - new_ms)
            nearer_new = to_new_ms <= abs(rtt_ms - old_ms)
            if nearer_new and to_new_ms <= tolerance_ms:
                found = sent_s
                break
            if not nearer_new:
                not_before_s = sent_s
        out.append((not_before_s, found))
    return out


def effect_times(
    changes: list[tuple[float, float, float]], samples: list[tuple[float, float]], tolerance_ms: float
) -> list[float]:
    """The upper ends (seen_s) of `effect_brackets`: when a probe first saw each change."""
    return [seen_s for _, seen_s in effect_brackets(changes, samples, tolerance_ms)]
