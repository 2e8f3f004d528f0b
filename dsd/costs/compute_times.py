"""One frozen type for the compute times of a model pair on some hardware (docs/concepts.md's t_d, t_v,
t_ar), whoever produced them: a hardware profile (``HardwareProfile.times``), a measurement on
this machine (``dsd.costs.measurement.MeasuredTimes.times``), or a fit to a run's rounds
(orchestrator/analysis/points.py). Those modules build it; this one imports neither.

t_verify is the one time that depends on gamma. A profile gives it as a line,
base + per_position * (gamma + 1); a measurement gives a table gamma -> seconds. Both are kept:
the table wins for the gammas it holds, the line answers the others, and a gamma in neither is
an error rather than a guess.

The dict form (``to_dict``/``from_dict``) is the JSON of sweep.json's ``costs``, calibration.json
and summary.json's ``params``: ``t_verify_s`` is the table (gamma -> seconds), as it always was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dsd.checks import is_number

_OPTIONAL = ("t_prefill_per_token_s", "batch_slope", "t_verify_base_s", "t_verify_per_position_s")


def _finite(name: str, value: object) -> float:
    if not is_number(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ComputeTimes:
    t_draft_edge_s: float  # one draft step on the edge device
    # One draft step on the server (co-located SD). NOTE: may be below 0: the client-view fit
    # (orchestrator/analysis/fits.py fit_effective_params, predictions.calibrate) derives it as
    # (co-located round - DSD's t_verify) / gamma, and DSD's t_verify carries message overhead a
    # co-located round does not pay; refusing it would stop a sweep's predictions.
    t_draft_server_s: float
    t_ar_s: float  # one autoregressive target step, batch 1
    # None below: not known (a measurement has no batch slope; an older sweep's record no prefill).
    t_prefill_per_token_s: float | None = None  # prompt processing, per token
    t_verify_base_s: float | None = None  # the line: fixed part of a target pass ...
    t_verify_per_position_s: float | None = None  # ... and per position (gamma + 1 of them)
    t_verify_by_gamma_s: tuple[tuple[int, float], ...] = ()  # the table: (gamma, seconds), measured
    batch_slope: float | None = None  # extra cost per extra sequence in a batched pass, as a fraction
    # The cached mode's hit rate (dsd/cache/speculation_cache.py): the share of verdicts its speculation cache
    # held a complete next block for. Not compute, but what the closed form needs beside it, and
    # fitted from a run's rounds with it; None: not known (only the cached mode reads it).
    cache_hit_rate: float | None = None
    cache_fill_s: float | None = None  # ... and how long its fill takes (a complete one)

    def __post_init__(self) -> None:
        for name in ("t_draft_edge_s", "t_draft_server_s", "t_ar_s") + _OPTIONAL:
            if getattr(self, name) is not None or name not in _OPTIONAL:
                object.__setattr__(self, name, _finite(name, getattr(self, name)))
        for name in ("t_draft_edge_s",) + _OPTIONAL:
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.t_ar_s <= 0:
            raise ValueError(f"t_ar_s must be > 0, got {self.t_ar_s!r}")
        if self.cache_hit_rate is not None:
            object.__setattr__(self, "cache_hit_rate", _finite("cache_hit_rate", self.cache_hit_rate))
            if not 0.0 <= self.cache_hit_rate <= 1.0:
                raise ValueError(f"cache_hit_rate must be in [0, 1], got {self.cache_hit_rate!r}")
        if self.cache_fill_s is not None:
            object.__setattr__(self, "cache_fill_s", _finite("cache_fill_s", self.cache_fill_s))
            if self.cache_fill_s < 0:
                raise ValueError(f"cache_fill_s must be >= 0, got {self.cache_fill_s!r}")
        line = (self.t_verify_base_s, self.t_verify_per_position_s)
        if (line[0] is None) != (line[1] is None):
            raise ValueError(f"t_verify_base_s and t_verify_per_position_s come together, got {line!r}")
        object.__setattr__(self, "t_verify_by_gamma_s", _verify_table(self.t_verify_by_gamma_s))
        if line[0] is None and not self.t_verify_by_gamma_s:
            raise ValueError(
                "t_verify: give t_verify_base_s and t_verify_per_position_s, or t_verify_by_gamma_s, got neither"
            )

    # --- the times -------------------------------------------------------------------------------

    def knows_gamma(self, gamma: int) -> bool:
        """Whether t_verify_s(gamma) has an answer (the line answers every gamma)."""
        return self.t_verify_base_s is not None or gamma in self.verify_table_s

    @property
    def verify_table_s(self) -> dict[int, float]:
        """The measured t_verify per gamma (a copy)."""
        return dict(self.t_verify_by_gamma_s)

    def t_verify_s(self, gamma: int, batch_size: int = 1) -> float:
        """One target pass over gamma + 1 positions, for batch_size sequences at once."""
        table = self.verify_table_s
        if gamma in table:
            single_s = table[gamma]
        elif self.t_verify_base_s is not None and self.t_verify_per_position_s is not None:
            single_s = self.t_verify_base_s + self.t_verify_per_position_s * (gamma + 1)
        else:
            raise ValueError(f"gamma {gamma!r}: t_verify was measured only for gamma {sorted(table)}")
        return single_s * self._batch_factor(batch_size)

    def closed_form_terms(self, gamma: int) -> dict[str, float | None]:
        """The compute terms of the closed form at this gamma, as dsd.modes.predict_per_token_s
        takes them."""
        return {
            "t_ar_s": self.t_ar_s,
            "t_draft_edge_s": self.t_draft_edge_s,
            "t_draft_server_s": self.t_draft_server_s,
            "t_verify_s": self.t_verify_s(gamma),
            "cache_hit_rate": self.cache_hit_rate,
            "cache_fill_s": self.cache_fill_s,
        }

    def t_ar_batch_s(self, batch_size: int = 1) -> float:
        return self.t_ar_s * self._batch_factor(batch_size)

    def t_prefill_s(self, n_tokens: int) -> float:
        if self.t_prefill_per_token_s is None:
            raise ValueError("t_prefill_per_token_s: not known for these times (recorded without it)")
        return self.t_prefill_per_token_s * n_tokens

    def _batch_factor(self, batch_size: int) -> float:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if batch_size == 1:
            return 1.0
        if self.batch_slope is None:
            raise ValueError(
                f"batch_size {batch_size}: batch_slope is not known for these times (a measurement "
                "of single passes); measure it (dsd.costs.measurement.fit_batch_slope)"
            )
        return 1.0 + self.batch_slope * (batch_size - 1)

    # --- new values from old -----------------------------------------------------------------------

    def with_verify_s(self, by_gamma: Mapping[int, float]) -> ComputeTimes:
        """These t_verify values in the table (others kept): a fit to a run's rounds."""
        return dataclasses.replace(self, t_verify_by_gamma_s=tuple({**self.verify_table_s, **by_gamma}.items()))

    def tabulated(self, gammas: Iterable[int]) -> ComputeTimes:
        """The table filled for these gammas from the line (what the sweep ran with, as JSON)."""
        return self.with_verify_s({int(g): self.t_verify_s(int(g)) for g in gammas})

    def replace(self, **changes: Any) -> ComputeTimes:
        return dataclasses.replace(self, **changes)

    # --- conversions -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: every field (None where not known), the table as ``t_verify_s``
        {gamma: seconds}; the line's keys only where there is a line."""
        out: dict[str, Any] = {
            "t_draft_edge_s": self.t_draft_edge_s,
            "t_draft_server_s": self.t_draft_server_s,
            "t_ar_s": self.t_ar_s,
            "t_verify_s": self.verify_table_s,
            "t_prefill_per_token_s": self.t_prefill_per_token_s,
            "batch_slope": self.batch_slope,
        }
        for name in ("cache_hit_rate", "cache_fill_s"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.t_verify_base_s is not None:
            out["t_verify_base_s"] = self.t_verify_base_s
            out["t_verify_per_position_s"] = self.t_verify_per_position_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComputeTimes:
        """The inverse of ``to_dict``; JSON's string gamma keys become ints. Also reads the
        ``costs`` of sweeps written before this type (no batch_slope) and the analysis params of
        older summaries (no t_prefill_per_token_s): not known, None. An unknown key is an error."""
        known = {
            "t_draft_edge_s",
            "t_draft_server_s",
            "t_ar_s",
            "t_verify_s",
            "t_prefill_per_token_s",
            "batch_slope",
            "t_verify_base_s",
            "t_verify_per_position_s",
            "cache_hit_rate",
            "cache_fill_s",
        }
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"compute times: unknown keys {unknown}; known: {sorted(known)}")
        missing = sorted({"t_draft_edge_s", "t_draft_server_s", "t_ar_s"} - set(data))
        if missing:
            raise ValueError(f"compute times: missing keys {missing}")
        table = data.get("t_verify_s") or {}
        if not isinstance(table, Mapping):
            raise ValueError(f"t_verify_s must be a table {{gamma: seconds}}, got {table!r}")
        return cls(
            t_draft_edge_s=data["t_draft_edge_s"],
            t_draft_server_s=data["t_draft_server_s"],
            t_ar_s=data["t_ar_s"],
            t_prefill_per_token_s=data.get("t_prefill_per_token_s"),
            t_verify_base_s=data.get("t_verify_base_s"),
            t_verify_per_position_s=data.get("t_verify_per_position_s"),
            t_verify_by_gamma_s=tuple((_gamma(g), s) for g, s in table.items()),
            batch_slope=data.get("batch_slope"),
            cache_hit_rate=data.get("cache_hit_rate"),
            cache_fill_s=data.get("cache_fill_s"),
        )


def fit_verify_line(by_gamma_s: Mapping[int, float]) -> tuple[float, float]:
    """(t_verify_base_s, t_verify_per_position_s): the least-squares line through a measured
    table, t_verify(gamma) = base + per_position * (gamma + 1), both clipped at 0."""
    if len(by_gamma_s) < 2:
        raise ValueError(f"t_verify_by_gamma_s: a line needs two gammas or more, got {dict(by_gamma_s)!r}")
    xs = [g + 1 for g in by_gamma_s]
    ys = list(by_gamma_s.values())
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    slope = max(slope, 0.0)
    return max(mean_y - slope * mean_x, 0.0), slope


def _gamma(key: Any) -> int:
    try:
        gamma = int(key)
    except (TypeError, ValueError):
        raise ValueError(f"t_verify_s: gamma must be a whole number, got {key!r}") from None
    if gamma != float(key) or gamma < 0:
        raise ValueError(f"t_verify_s: gamma must be a whole number >= 0, got {key!r}")
    return gamma


def _verify_table(table: object) -> tuple[tuple[int, float], ...]:
    """A mapping or pairs gamma -> seconds as sorted (gamma, seconds) pairs, each checked."""
    pairs = table.items() if isinstance(table, Mapping) else table
    if not isinstance(pairs, Iterable):
        raise ValueError(f"t_verify_by_gamma_s must map gamma to seconds, got {table!r}")
    out: dict[int, float] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"t_verify_by_gamma_s must map gamma to seconds, got {table!r}")
        gamma = _gamma(pair[0])
        seconds = _finite(f"t_verify_by_gamma_s[{gamma}]", pair[1])
        if seconds < 0:
            raise ValueError(f"t_verify_by_gamma_s[{gamma}] must be >= 0, got {seconds!r}")
        out[gamma] = seconds
    return tuple(sorted(out.items()))


# The kinds of work a verifier's device runs, as a pass over a batch of jobs of one kind: a
# prompt's prefill, a step of cloud AR (dsd.modes.AR), gamma draft steps of co-located SD, a
# verification, and the answer to a block that went stale (nothing to compute).
PREFILL, AR_STEP, DRAFT, VERIFY, STALE = "prefill", "ar", "draft", "verify", "stale"
PASS_KINDS = (PREFILL, AR_STEP, DRAFT, VERIFY, STALE)


class BatchCosts(Protocol):
    """What prices a pass: ComputeTimes, or a hardware profile (dsd.costs.profiles.HardwareProfile)."""

    @property
    def t_ar_s(self) -> float: ...
    @property
    def t_draft_server_s(self) -> float: ...

    def t_verify_s(self, gamma: int, batch_size: int = 1) -> float: ...
    def t_ar_batch_s(self, batch_size: int = 1) -> float: ...
    def t_prefill_s(self, n_tokens: int) -> float: ...


def pass_cost_s(costs: BatchCosts, kind: str, sizes: list[int]) -> float:
    """Modelled time of one pass over a batch of jobs of one kind; sizes: gamma, draft steps or
    prompt tokens per job. The emulated verifier (services/verifier/scheduler.py), the sim's shared
    verifier (dsd/simulation/many_clients.py) and the open-loop sim price passes with it."""
    batch = len(sizes)
    if kind == VERIFY:
        return costs.t_verify_s(max(sizes), batch)
    if kind == AR_STEP:
        return costs.t_ar_batch_s(batch)
    if kind == DRAFT:
        return max(sizes) * costs.t_draft_server_s * costs.t_ar_batch_s(batch) / costs.t_ar_s
    if kind == PREFILL:
        return sum(costs.t_prefill_s(n) for n in sizes)
    if kind == STALE:
        return 0.0
    raise ValueError(f"kind must be one of {PASS_KINDS}, got {kind!r}")


def steady_per_token_s(t_first_s: float | None, t_last_s: float | None, tokens_after_first: int) -> float | None:
    """A request's steady-state time per token: from its first emission to a later one, over the
    tokens emitted after the first emission (which may be several tokens: a co-located round's
    accepted run). The request's one-off costs, its round trip to open and the prefill, stay out.
    None where undefined (no emission after the first). requests.csv, the analysis's per-round
    refinement and the controllers' observations all use it."""
    if t_first_s is None or t_last_s is None or tokens_after_first <= 0:
        return None
    return (t_last_s - t_first_s) / tokens_after_first
