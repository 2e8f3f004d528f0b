"""Hardware profiles: the compute times the synthetic backend emulates.

Profiles live in ``profiles.toml`` beside this file, in a file given with ``--profiles``, or in an
experiment's own ``[profiles.NAME]`` tables; every number names its source (``FIELD_source``).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from dsd.costs.compute_times import ComputeTimes


@dataclass(frozen=True)
class HardwareProfile:
    """A named ComputeTimes with the source of every number. The numbers are flat fields because
    they are the schema of profiles.toml and of ``--profile-json``; what they mean and how they
    combine (t_verify per gamma and batch, prefill) is ``times``, the one compute-times type."""

    name: str
    t_draft_edge_s: float  # one draft step on the edge device
    t_draft_server_s: float  # one draft step on the server (co-located SD)
    t_ar_s: float  # one autoregressive target step, batch 1
    t_verify_base_s: float  # target pass, fixed part
    t_verify_per_position_s: float  # target pass, per position (gamma + 1 of them)
    t_prefill_per_token_s: float  # prompt processing, per token
    batch_slope: float  # extra cost per extra sequence in a batched pass, as a fraction
    sources: tuple[tuple[str, str], ...] = ()  # (field, where the number comes from)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name.startswith("t_") or f.name == "batch_slope":
                value = getattr(self, f.name)
                if not (isinstance(value, (int, float)) and value >= 0):
                    raise ValueError(f"profile {self.name!r}: {f.name} must be a number >= 0, got {value!r}")
        try:
            _ = self.times  # builds the ComputeTimes, which checks them
        except ValueError as error:
            raise ValueError(f"profile {self.name!r}: {error}") from None

    @cached_property
    def times(self) -> ComputeTimes:
        """The profile's numbers as the one compute-times type (t_verify as its line)."""
        return ComputeTimes(
            t_draft_edge_s=self.t_draft_edge_s,
            t_draft_server_s=self.t_draft_server_s,
            t_ar_s=self.t_ar_s,
            t_prefill_per_token_s=self.t_prefill_per_token_s,
            t_verify_base_s=self.t_verify_base_s,
            t_verify_per_position_s=self.t_verify_per_position_s,
            batch_slope=self.batch_slope,
        )

    def t_verify_s(self, gamma: int, batch_size: int = 1) -> float:
        return self.times.t_verify_s(gamma, batch_size)

    def t_ar_batch_s(self, batch_size: int = 1) -> float:
        return self.times.t_ar_batch_s(batch_size)

    def t_prefill_s(self, n_tokens: int) -> float:
        return self.times.t_prefill_s(n_tokens)


def load_profiles(path: Path | None = None) -> dict[str, HardwareProfile]:
    """The package's profiles (``profiles.toml``), or those of another file in the same format."""
    text = path.read_text() if path else resources.files("dsd.costs").joinpath("profiles.toml").read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path or 'dsd/costs/profiles.toml'}: not valid TOML: {error}") from None
    return profiles_from_tables(data)


def profiles_from_tables(data: dict[str, Any], prefix: str = "") -> dict[str, HardwareProfile]:
    """Profiles from TOML tables {name: {field: number, field_source: "where it comes from"}}.

    Every number must name its source: a missing or empty ``FIELD_source`` is refused naming the
    key (``prefix`` says where the tables sit, e.g. "profiles." for an experiment's own).
    """
    known = {f.name for f in fields(HardwareProfile)} - {"name", "sources"}
    profiles = {}
    for name, table in data.items():
        where = f"profile {prefix}{name}"
        if not isinstance(table, dict):
            raise ValueError(f"{where}: expected a table of numbers and their sources, got {table!r}")
        values = {k: v for k, v in table.items() if not k.endswith("_source")}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        missing = known - set(values)
        if missing:
            raise ValueError(f"{where}: missing keys {sorted(missing)}")
        sources = tuple((k[: -len("_source")], v) for k, v in table.items() if k.endswith("_source"))
        stray = sorted(f"{k}_source" for k, _ in sources if k not in known)
        if stray:
            raise ValueError(f"{where}: sources for unknown keys {stray}")
        unsourced = sorted(
            f"{prefix}{name}.{k}_source"
            for k in known
            if not (isinstance(dict(sources).get(k), str) and dict(sources)[k].strip())
        )
        if unsourced:
            raise ValueError(f"{where}: every number names its source; no source given for {unsourced}")
        profiles[name] = HardwareProfile(name=name, sources=sources, **values)
    return profiles


def get_profile(name: str, path: Path | None = None) -> HardwareProfile:
    profiles = load_profiles(path)
    if name not in profiles:
        raise ValueError(f"unknown hardware profile {name!r}; known: {sorted(profiles)}")
    return profiles[name]
