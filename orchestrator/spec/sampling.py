"""The experiment's ``[sampling]`` table: temperature, top_k, top_p and seed, each a value or a
list to sweep (every combination runs, like gamma).

    [sampling]
    temperature = [0.0, 0.8]   # 0 = greedy
    top_k = 0                  # 0 = no top-k truncation
    top_p = 0.95               # 1 = no nucleus truncation
    seed = 0                   # default: the experiment's seed; request i of a run uses seed + i

Drafter and target apply the same truncation to their own logits, so every mode samples exactly
from the target's truncated distribution. The four values are columns of every trace row.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from dsd.backends.protocol import SamplingParams
from dsd.checks import check, is_int, is_number
from orchestrator.common.toml_tables import config_from_table

COLUMNS = ("temperature", "top_k", "top_p", "sampling_seed")  # trace columns, one per setting


@dataclass(frozen=True)
class Setting:
    """One sampling setting: what one sweep point runs with."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    sampling_seed: int = 0

    @property
    def tag(self) -> str:
        """The setting in a point's folder name; "" for greedy (older sweeps keep their folder
        names)."""
        if self.temperature == 0:
            return ""
        return (
            f"T{self.temperature:g}"
            + (f"k{self.top_k}" if self.top_k else "")
            + (f"p{self.top_p:g}" if self.top_p < 1 else "")
            + f"s{self.sampling_seed}"
        )

    def params(self, request_index: int) -> SamplingParams:
        """What request ``request_index`` of a run samples with (the edge's rule: seed + index)."""
        return SamplingParams(self.temperature, self.top_k or None, self.sampling_seed + request_index, self.top_p)

    def run_fields(self) -> dict:
        """The edge's RunConfig fields (services/edge/) for this setting."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k or None,
            "top_p": self.top_p,
            "seed": self.sampling_seed,
        }


@dataclass(frozen=True)
class SamplingSweep:
    temperature: tuple[float, ...] = (0.0,)
    top_k: tuple[int, ...] = (0,)
    top_p: tuple[float, ...] = (1.0,)
    seed: tuple[int, ...] = ()  # empty: the experiment's seed

    def __post_init__(self) -> None:
        _check_values(self.temperature, "temperature", lambda t: is_number(t) and 0 <= t <= 100, "numbers in 0..100")
        _check_values(self.top_k, "top_k", lambda k: is_int(k) and k >= 0, "whole numbers >= 0 (0: no top-k)")
        _check_values(self.top_p, "top_p", lambda p: is_number(p) and 0 < p <= 1, "numbers in (0, 1]")
        _check_values(
            self.seed, "seed", lambda s: is_int(s) and 0 <= s < 2**62, "whole numbers in 0..2^62", allow_empty=True
        )

    def settings(self, experiment_seed: int) -> list[Setting]:
        """Every combination; greedy (temperature 0) ignores truncation and seed, so it is one
        setting, recorded as top_k 0, top_p 1 and the first seed."""
        seeds = self.seed or (experiment_seed,)
        settings = []
        for t, k, p, s in itertools.product(self.temperature, self.top_k, self.top_p, seeds):
            setting = Setting(float(t), k, float(p), s) if t > 0 else Setting(0.0, 0, 1.0, seeds[0])
            if setting not in settings:
                settings.append(setting)
        return settings


def parse_sampling(table, source: str = "experiment") -> SamplingSweep:
    """The [sampling] table -> SamplingSweep; a bad or unknown key is a ValueError naming it."""
    return config_from_table(
        SamplingSweep,
        table,
        "sampling",
        source,
        convert=lambda t: {k: tuple(v) if isinstance(v, list) else (v,) for k, v in t.items()},
    )


def _check_values(values: tuple, key: str, ok, expected: str, allow_empty: bool = False) -> None:
    """A [sampling] key: a value or a list of distinct values, each ``ok``."""
    check(
        bool(values or allow_empty) and all(ok(v) for v in values) and len(set(values)) == len(values),
        f"sampling.{key}",
        list(values),
        f"a value or a list of distinct {expected}",
    )
