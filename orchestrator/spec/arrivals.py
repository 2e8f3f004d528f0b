"""Open-loop load: when requests arrive, on which edge, and how long their answers are (pure).

    [load]
    arrival_process = "poisson"  # poisson | gamma_gaps | trace
    rate_rps = [1, 2, 4]         # requests per second, all edges together; a list is swept
    cv = 2.0                     # gamma_gaps only: coefficient of variation of the gaps (1 = Poisson)
    trace = "arrivals.csv"       # trace only: a CSV with an ``arrival_s`` column (seconds from 0)
    duration_s = 30              # arrivals over this long (or: requests = 200, a fixed count)
    warmup_s = 5                 # requests arriving before this run but are dropped from the figures
    assignment = "round_robin"   # round_robin | random | weighted (with weights = [...], one per edge)
    output = "fixed"             # fixed (max_new_tokens each) | lengths (drawn from lengths_csv)
    lengths_csv = ""             # a CSV with a ``tokens`` column, e.g. an earlier run's requests.csv
    max_sessions = 0             # the verifier's admission limit (0: its default); beyond it a request is refused
    search_iterations = 0        # > 0: after the grid, search each mode's largest rate at the SLO
    rtt_ms = []                  # a rate map: the grid runs at each of these RTTs, every edge's link at it
    seed = -1                    # -1: the experiment's seed

Without a ``[load]`` table an experiment stays closed-loop (each client sends its next request
when the last one ended: the saturated-capacity measure). With it, requests arrive as a process
at ``rate_rps`` whether or not earlier ones have finished (the convention of vLLM's serving
benchmark): the arrival process and the edge assignment are drawn here, seeded, before anything
runs, so every mode at one rate sees the same arrivals on the same edges.

Gamma gaps with mean 1/rate and coefficient of variation cv have shape k = 1/cv^2 and scale
1/(rate k); cv > 1 is burstier than Poisson, cv < 1 more regular.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsd.checks import check, is_int, is_number
from orchestrator.common.toml_tables import config_from_table

ARRIVAL_PROCESSES = ("poisson", "gamma_gaps", "trace")
# keys and values an older experiment file may use, refused with the name that replaced them
RENAMED_KEYS = {"arrival": "arrival_process"}
RENAMED_PROCESSES = {"gamma": "gamma_gaps"}
ASSIGNMENTS = ("round_robin", "random", "weighted")
OUTPUTS = ("fixed", "lengths")


@dataclass(frozen=True)
class LoadConfig:
    arrival_process: str = "poisson"
    rate_rps: tuple[float, ...] = ()
    cv: float = 1.0
    trace: str = ""
    duration_s: float = 0.0
    requests: int = 0
    warmup_s: float = 0.0
    assignment: str = "round_robin"
    weights: tuple[float, ...] = ()
    output: str = "fixed"
    lengths_csv: str = ""
    max_sessions: int = 0
    search_iterations: int = 0
    rtt_ms: tuple[float, ...] = ()
    seed: int = -1

    def __post_init__(self) -> None:
        self._check_process()
        self._check_counts()
        self._check_edges()
        self._check_output()

    def _check_process(self) -> None:
        if self.arrival_process in RENAMED_PROCESSES:
            raise ValueError(
                f"load.arrival_process {self.arrival_process!r} is now "
                f"{RENAMED_PROCESSES[self.arrival_process]!r} (gamma is the draft length)"
            )
        check(
            self.arrival_process in ARRIVAL_PROCESSES,
            "load.arrival_process",
            self.arrival_process,
            f"one of {ARRIVAL_PROCESSES}",
        )
        rates = self.rate_rps if isinstance(self.rate_rps, tuple) else (self.rate_rps,)
        object.__setattr__(self, "rate_rps", tuple(rates))
        self._check_trace_or_rates()
        check(is_number(self.cv) and 0 < self.cv <= 20, "load.cv", self.cv, "a number in (0, 20]")
        check(
            self.cv == 1.0 or self.arrival_process == "gamma_gaps",
            "load.cv",
            self.cv,
            "only with arrival_process = 'gamma_gaps'",
        )

    def _check_trace_or_rates(self) -> None:
        """A trace sets the arrival times and how many; otherwise the rates and a duration or a count do."""
        if self.arrival_process == "trace":
            check(
                isinstance(self.trace, str) and Path(self.trace).expanduser().is_file(),
                "load.trace",
                self.trace,
                "an existing CSV file with an arrival_s column (arrival_process = 'trace')",
            )
            check(
                not self.rate_rps,
                "load.rate_rps",
                list(self.rate_rps),
                "empty with arrival_process = 'trace' (the trace sets the times)",
            )
            check(
                not self.duration_s and not self.requests,
                "load.duration_s",
                self.duration_s,
                "unset with arrival_process = 'trace' (the trace sets how many)",
            )
        else:
            check(not self.trace, "load.trace", self.trace, "only with arrival_process = 'trace'")
            check(
                len(self.rate_rps) > 0 and all(is_number(r) and 0 < r <= 10_000 for r in self.rate_rps),
                "load.rate_rps",
                list(self.rate_rps),
                "a non-empty list of numbers in (0, 10000]",
            )
            check(
                len(set(self.rate_rps)) == len(self.rate_rps),
                "load.rate_rps",
                list(self.rate_rps),
                "no repeated values",
            )
            check(
                (self.duration_s > 0) != (self.requests > 0),
                "load.duration_s",
                self.duration_s,
                "duration_s > 0 or requests > 0 (one of the two)",
            )

    def _check_counts(self) -> None:
        check(
            is_number(self.duration_s) and 0 <= self.duration_s <= 86_400,
            "load.duration_s",
            self.duration_s,
            "a number of seconds in 0..86400",
        )
        for name, low, high in (
            ("requests", 0, 1_000_000),
            ("max_sessions", 0, 100_000),
            ("search_iterations", 0, 20),
            ("seed", -1, 2**31),
        ):
            value = getattr(self, name)
            check(is_int(value) and low <= value <= high, f"load.{name}", value, f"a whole number in {low}..{high}")
        check(is_number(self.warmup_s) and self.warmup_s >= 0, "load.warmup_s", self.warmup_s, "a number >= 0")
        check(
            self.duration_s == 0 or self.warmup_s < self.duration_s,
            "load.warmup_s",
            self.warmup_s,
            f"less than duration_s {self.duration_s}",
        )

    def _check_edges(self) -> None:
        check(self.assignment in ASSIGNMENTS, "load.assignment", self.assignment, f"one of {ASSIGNMENTS}")
        weights = self.weights if isinstance(self.weights, tuple) else tuple(self.weights)
        object.__setattr__(self, "weights", weights)
        if self.assignment == "weighted":
            check(
                len(weights) > 0 and all(is_number(w) and w >= 0 for w in weights) and sum(weights) > 0,
                "load.weights",
                list(weights),
                "a list of numbers >= 0, one per edge, not all 0",
            )
        else:
            check(not weights, "load.weights", list(weights), "only with assignment = 'weighted'")
        rtts = self.rtt_ms if isinstance(self.rtt_ms, tuple) else (self.rtt_ms,)
        object.__setattr__(self, "rtt_ms", tuple(rtts))
        check(
            all(is_number(r) and 0 <= r <= 10_000 for r in rtts) and len(set(rtts)) == len(rtts),
            "load.rtt_ms",
            list(rtts),
            "a list of distinct RTTs in 0..10000 ms (empty: no rate map, one link per edge)",
        )
        check(
            not rtts or self.arrival_process != "trace",
            "load.rtt_ms",
            list(rtts),
            "empty with arrival_process = 'trace' (a rate map sweeps rate_rps at each RTT; a trace has one rate)",
        )

    def _check_output(self) -> None:
        check(self.output in OUTPUTS, "load.output", self.output, f"one of {OUTPUTS}")
        if self.output == "lengths":
            check(
                bool(read_lengths(self.lengths_csv)) if _is_file(self.lengths_csv) else False,
                "load.lengths_csv",
                self.lengths_csv,
                "a CSV file with a 'tokens' column of whole numbers >= 1 (output = 'lengths')",
            )
        else:
            check(not self.lengths_csv, "load.lengths_csv", self.lengths_csv, "only with output = 'lengths'")


@dataclass(frozen=True)
class SloConfig:
    """What a request must meet to count as good: each given bound (0 = not part of the SLO), and
    the share of requests that must meet it for a rate to count as sustained."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    e2e_ms: float = 0.0
    attainment: float = 0.9

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, name)
            check(is_number(value) and 0 <= value <= 3_600_000, f"slo.{name}", value, "a number of ms in 0..3600000")
        check(
            self.ttft_ms > 0 or self.tpot_ms > 0 or self.e2e_ms > 0,
            "slo.ttft_ms",
            self.ttft_ms,
            "at least one of ttft_ms, tpot_ms, e2e_ms > 0",
        )
        check(
            is_number(self.attainment) and 0 < self.attainment < 1,
            "slo.attainment",
            self.attainment,
            "a number in (0, 1), e.g. 0.9",
        )

    def met(self, ttft_s: float, tpot_s: float, e2e_s: float) -> bool:
        """A served request meets every bound given (a TPOT that is undefined, a one-token answer,
        meets its bound)."""
        return (
            (not self.ttft_ms or ttft_s * 1e3 <= self.ttft_ms)
            and (not self.tpot_ms or not math.isfinite(tpot_s) or tpot_s * 1e3 <= self.tpot_ms)
            and (not self.e2e_ms or e2e_s * 1e3 <= self.e2e_ms)
        )


def parse_load(table, source: str = "experiment") -> LoadConfig:
    """The [load] table -> LoadConfig; a bad or unknown key is one ValueError line naming it
    (load_experiment has made the file's relative paths absolute from its folder)."""

    def convert(values: dict) -> dict:
        values = dict(values)
        for key in ("rate_rps", "weights", "rtt_ms"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        return values

    renamed = sorted(set(table) & set(RENAMED_KEYS)) if isinstance(table, dict) else []
    if renamed:
        raise ValueError(
            f"{source}: [load] {renamed[0]} is now {RENAMED_KEYS[renamed[0]]} (the request arrival process)"
        )
    return config_from_table(LoadConfig, table, "load", source, convert)


def parse_slo(table, source: str = "experiment") -> SloConfig:
    """The [slo] table -> SloConfig; a bad or unknown key is one ValueError line naming it."""
    return config_from_table(SloConfig, table, "slo", source)


# ---- arrivals (pure, seeded) ---------------------------------------------------------------------


def poisson_gaps_s(rate_rps: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n exponential gaps of mean 1/rate."""
    return rng.exponential(1.0 / rate_rps, size=n)


def gamma_gaps_s(rate_rps: float, cv: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n gamma gaps of mean 1/rate and coefficient of variation cv (shape 1/cv^2)."""
    shape = 1.0 / cv**2
    return rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)


def arrival_times_s(config: LoadConfig, rate_rps: float | None, seed: int) -> np.ndarray:
    """The request arrival times (s from the start, ascending) at one rate: ``requests`` of them,
    or every one before ``duration_s``; a trace's own times."""
    if config.arrival_process == "trace":
        return read_trace(config.trace)
    rng = np.random.default_rng([seed, 0x10AD])

    def gaps(n: int) -> np.ndarray:
        return (
            poisson_gaps_s(rate_rps, n, rng)
            if config.arrival_process == "poisson"
            else gamma_gaps_s(rate_rps, config.cv, n, rng)
        )

    if config.requests:
        return np.cumsum(gaps(config.requests))
    times = np.cumsum(gaps(int(rate_rps * config.duration_s * 1.5) + 16))
    while times[-1] < config.duration_s:  # bounded: each pass adds a mean duration's worth
        times = np.concatenate([times, times[-1] + np.cumsum(gaps(int(rate_rps * config.duration_s) + 16))])
    return times[times < config.duration_s]


def assign_edges(n_requests: int, n_edges: int, config: LoadConfig, seed: int) -> np.ndarray:
    """The edge each request arrives on."""
    if config.assignment == "round_robin":
        return np.arange(n_requests) % n_edges
    rng = np.random.default_rng([seed, 0xED9E])
    if config.assignment == "random":
        return rng.integers(0, n_edges, size=n_requests)
    weights = np.resize(np.asarray(config.weights, dtype=float), n_edges)
    return rng.choice(n_edges, size=n_requests, p=weights / weights.sum())


def output_lengths(n_requests: int, config: LoadConfig, max_new_tokens: int, seed: int) -> np.ndarray:
    """Each request's answer length: max_new_tokens, or drawn from lengths_csv (capped by it)."""
    if config.output == "fixed":
        return np.full(n_requests, max_new_tokens)
    rng = np.random.default_rng([seed, 0x1E9])
    return np.minimum(rng.choice(np.asarray(read_lengths(config.lengths_csv)), size=n_requests), max_new_tokens)


@dataclass(frozen=True)
class OpenLoopRequest:
    """One request of an open-loop point: when it arrives, at which edge, how long its answer."""

    index: int
    arrival_s: float
    edge: int
    max_tokens: int
    warmup: bool


def schedule(
    config: LoadConfig, rate_rps: float | None, n_edges: int, max_new_tokens: int, seed: int
) -> list[OpenLoopRequest]:
    """Every request of one open-loop point, in order of arrival."""
    times = arrival_times_s(config, rate_rps, seed)
    edges = assign_edges(len(times), n_edges, config, seed)
    lengths = output_lengths(len(times), config, max_new_tokens, seed)
    return [
        OpenLoopRequest(i, float(t), int(e), int(n), bool(t < config.warmup_s))
        for i, (t, e, n) in enumerate(zip(times, edges, lengths))
    ]


def read_trace(path: str) -> np.ndarray:
    """A trace's arrival times (its ``arrival_s`` column), sorted."""
    with open(Path(path).expanduser(), newline="") as handle:
        reader = csv.DictReader(handle)
        if "arrival_s" not in (reader.fieldnames or []):
            raise ValueError(f"experiment key 'load.trace': {path} has no arrival_s column")
        times = sorted(float(row["arrival_s"]) for row in reader)
    if not times or times[0] < 0:
        raise ValueError(f"experiment key 'load.trace': {path} needs arrival times >= 0, at least one")
    return np.asarray(times)


def read_lengths(path: str) -> list[int]:
    with open(Path(path).expanduser(), newline="") as handle:
        reader = csv.DictReader(handle)
        if "tokens" not in (reader.fieldnames or []):
            return []
        values = [row["tokens"] for row in reader if row.get("tokens") not in (None, "")]
    lengths = [int(float(v)) for v in values]
    return lengths if lengths and min(lengths) >= 1 else []


def _is_file(path) -> bool:
    return isinstance(path, str) and bool(path) and Path(path).expanduser().is_file()
