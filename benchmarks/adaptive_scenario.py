"""What benchmarks/adaptive.py (sim) and benchmarks/adaptive_netns.py (netns) share: the scenario
(the link's schedule and the prompts' acceptance classes), a request's run, the score against the
oracle, the static arms and the policies' configs."""

from __future__ import annotations

import bisect
import functools
import math
import random
from dataclasses import dataclass, field

from dsd.controller.interface import ControllerConfig

POLICIES = ("model", "bandit", "heuristic")
GAMMAS = (1, 2, 3, 4, 6, 8, 12, 16)
CLASS_TOKEN = 1  # prompt class k starts with token CLASS_TOKEN + k


@dataclass
class Scenario:
    rtts_ms: list[float]
    segment_s: float
    alphas: list[float]
    alpha_requests: int
    requests: int
    tokens: int
    prompt_tokens: int
    modes: tuple[str, ...]
    gamma_max: int
    trace: tuple[tuple[float, float], ...] = ()  # (t_s, rtt_ms) from 0: the link, in place of the alternation
    trace_name: str = ""
    # (t_s, rtt_ms) from 0: the oracle's segments of the trace, each at its level
    # (benchmarks/trace_levels.py); empty: the trace's own rows
    levels: tuple[tuple[float, float], ...] = ()

    def rtt_at_ms(self, t_s: float) -> float:
        """The link's RTT at t_s."""
        if self.trace:
            return _row_at(self.trace, self._trace_times, t_s)
        return self.rtts_ms[int(t_s // self.segment_s) % len(self.rtts_ms)]

    def level_at_ms(self, t_s: float) -> float:
        """The oracle's RTT level at t_s: the link's own RTT unless the trace has levels."""
        if self._segments:
            return _row_at(self._segments, self._segment_times, t_s)
        return self.rtt_at_ms(t_s)

    def levels_ms(self) -> list[float]:
        """The RTT levels of the link: the oracle's conditions (with each alpha)."""
        return sorted({rtt for _, rtt in self._segments} if self._segments else set(self.rtts_ms))

    def next_change_s(self, t_s: float) -> float:
        """The next change of the oracle's level after t_s."""
        if self._segments:
            i = bisect.bisect_right(self._segment_times, t_s)
            return self._segment_times[i] if i < len(self._segment_times) else math.inf
        return (int(t_s // self.segment_s) + 1) * self.segment_s

    # The rows' times, worked out once (a scenario's trace and levels are set when it is made; the
    # sim asks the link's RTT at every message).
    @functools.cached_property
    def _trace_times(self) -> list[float]:
        return [t for t, _ in self.trace]

    @functools.cached_property
    def _segments(self) -> tuple[tuple[float, float], ...]:
        return self.levels or self.trace

    @functools.cached_property
    def _segment_times(self) -> list[float]:
        return [t for t, _ in self._segments]

    def alpha_class(self, index: int) -> int:
        return (index // self.alpha_requests) % len(self.alphas)

    def alpha_classes(self) -> tuple[tuple[int, float], ...]:
        return tuple((CLASS_TOKEN + k, a) for k, a in enumerate(self.alphas))

    def prompts(self, seed: int) -> list[list[int]]:
        rng = random.Random(seed)
        return [
            [CLASS_TOKEN + self.alpha_class(i)] + [rng.randrange(16, 500) for _ in range(self.prompt_tokens - 1)]
            for i in range(self.requests)
        ]

    def pieces(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        """(level rtt_ms, seconds) of [start, end) in each of the oracle's segments."""
        out, t_s = [], start_s
        while t_s < end_s - 1e-12:
            boundary_s = self.next_change_s(t_s)
            out.append((self.level_at_ms(t_s), min(boundary_s, end_s) - t_s))
            t_s = boundary_s
        return out


def _row_at(rows: tuple, times: list[float], t_s: float) -> float:
    return rows[max(bisect.bisect_right(times, t_s) - 1, 0)][1]


def load_rtt_trace(path: str) -> tuple[tuple[float, float], ...]:
    """--rtt-trace: a link trace (netem/schedule.py's format) of t_s and rtt_ms only, from t_s 0."""
    from netem.schedule import LinkSchedule

    schedule = LinkSchedule.from_trace_csv(path)
    trace = []
    for step in schedule.steps:
        changes = dict(step.changes)
        if set(changes) != {"rtt_ms"}:
            raise ValueError(
                f"--rtt-trace {path}: only the columns t_s, rtt_ms are replayed here, got "
                f"{sorted(changes)} at t_s {step.at_s}"
            )
        trace.append((float(step.at_s), float(changes["rtt_ms"])))
    if trace[0][0] != 0:
        raise ValueError(
            f"--rtt-trace {path}: the first row must be at t_s 0 (the link from the start), got {trace[0][0]}"
        )
    if len({rtt for _, rtt in trace}) < 2:
        raise ValueError(
            f"--rtt-trace {path}: one RTT level ({trace[0][1]:g} ms) is nothing to adapt to, and "
            f"the network runs place requests on the trace by its changes"
        )
    return tuple(trace)


@dataclass
class RequestRun:
    start_s: float  # since the schedule's start
    wall_s: float
    tokens: int
    alpha: float
    plans: list[tuple[int, str]] = field(default_factory=list)  # each live round's (gamma, mode)


def oracle_tokens(run: RequestRun, best_s: dict, scenario: Scenario) -> float:
    """The tokens the oracle emits in the request's wall time: each piece of the schedule it ran
    in at that condition's best per-token time."""
    return sum(
        seconds / best_s[(rtt, run.alpha)] for rtt, seconds in scenario.pieces(run.start_s, run.start_s + run.wall_s)
    )


def vs_oracle_pct(runs: list[RequestRun], best_s: dict, scenario: Scenario) -> float:
    return 100.0 * (sum(oracle_tokens(r, best_s, scenario) for r in runs) / sum(r.tokens for r in runs) - 1.0)


def matched_vs_oracle_pct(runs: list[RequestRun], matched: dict, scenario: Scenario) -> float:
    """As ``vs_oracle_pct`` against the prompt-matched oracle (benchmarks/adaptive_oracle.py
    ``prompt_matched_oracle``): request i's pieces at the oracle's per-token time on prompt i
    (``runs[i]`` ran prompt i, as every run of the benchmark does)."""
    oracle = sum(
        oracle_tokens(r, {key: times[i] for key, times in matched.items() if i in times}, scenario)
        for i, r in enumerate(runs)
    )
    return 100.0 * (oracle / sum(r.tokens for r in runs) - 1.0)


def touched_levels_ms(results: dict, scenario: Scenario) -> list[float]:
    """The levels some request of ``results`` (name -> [RequestRun]) spent time at: the only ones the
    oracle is needed at (a trace's slice may hold levels past where the runs end)."""
    return sorted(
        {rtt for runs in results.values() for r in runs for rtt, _ in scenario.pieces(r.start_s, r.start_s + r.wall_s)}
    )


def arms(scenario: Scenario) -> list[tuple[str, int]]:
    out = []
    for mode in scenario.modes:
        out += [(mode, 1)] if mode == "ar" else [(mode, g) for g in GAMMAS if g <= scenario.gamma_max]
    return out


def policy_config(name: str, scenario: Scenario) -> ControllerConfig:
    modes = scenario.modes if name != "heuristic" else tuple(m for m in scenario.modes if m in ("sync", "pipelined"))
    return ControllerConfig(name, 4, "sync", scenario.gamma_max, modes)
