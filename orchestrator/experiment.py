"""Experiment files (TOML): validated before anything starts; a misspelt key is an error."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from dsd.backends.factory import BackendConfig
from dsd.profiles import load_profiles

MODES = ("ar", "colocated", "sync", "pipelined")
LAUNCHERS = ("sim", "loopback", "netns", "compose", "auto")


@dataclass(frozen=True)
class Experiment:
    name: str
    launcher: str = "sim"
    modes: tuple[str, ...] = MODES
    rtt_ms: tuple[float, ...] = (0.0, 10.0, 20.0, 40.0, 80.0)
    gamma: tuple[int, ...] = (4,)
    clients: tuple[int, ...] = (1,)
    requests: int = 8                  # measured requests per point and client
    warmup_requests: int = 1           # run first and kept out of the results
    max_new_tokens: int = 64
    prompt_tokens: int = 32
    max_in_flight: int = 1
    edges: int = 4                     # edge processes/containers; clients share them round-robin
    max_batch: int = 1                 # verifier: sequences per verification pass (1 = serial)
    batch_window_ms: float = 0.0       # verifier: how long a pass waits to fill its batch
    repeats: int = 1
    seed: int = 0
    # synthetic backend: hardware profile name (dsd/profiles.toml), or a list of them to sweep
    profile: str | tuple[str, ...] = ""
    alpha: tuple[float, ...] = ()      # synthetic backend: acceptance rates to sweep (empty: backend.alpha)
    backend: BackendConfig = field(default_factory=BackendConfig)

    def __post_init__(self) -> None:
        _check(self.launcher in LAUNCHERS, "launcher", self.launcher, f"one of {LAUNCHERS}")
        _check(len(self.modes) > 0 and all(m in MODES for m in self.modes), "modes", self.modes,
               f"a non-empty list from {MODES}")
        _check(len(self.rtt_ms) > 0 and all(r >= 0 for r in self.rtt_ms), "rtt_ms", self.rtt_ms,
               "a non-empty list of numbers >= 0")
        _check(len(self.gamma) > 0 and all(isinstance(g, int) and 1 <= g <= 64 for g in self.gamma),
               "gamma", self.gamma, "a non-empty list of whole numbers in 1..64")
        _check(len(self.clients) > 0 and all(isinstance(c, int) and 1 <= c <= 256 for c in self.clients),
               "clients", self.clients, "a non-empty list of whole numbers in 1..256")
        for name, low in (("requests", 1), ("warmup_requests", 0), ("max_new_tokens", 1),
                          ("prompt_tokens", 1), ("max_in_flight", 1), ("repeats", 1), ("edges", 1),
                          ("max_batch", 1)):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= low, name, value, f"a whole number >= {low}")
        _check(isinstance(self.batch_window_ms, (int, float)) and self.batch_window_ms >= 0,
               "batch_window_ms", self.batch_window_ms, "a number >= 0")
        if self.backend.kind == "synthetic":
            _check(bool(self.profile), "profile", self.profile,
                   "a hardware profile name (the synthetic backend emulates its compute)")
        synthetic_only = "only with the synthetic backend (a real model pair has its own alpha and speed)"
        _check(not self.alpha or self.backend.kind == "synthetic", "alpha", self.alpha, synthetic_only)
        _check(all(isinstance(a, (int, float)) and 0 < a <= 1 for a in self.alpha), "alpha", self.alpha,
               "a list of numbers in (0, 1]")
        _check(len(set(self.alpha)) == len(self.alpha), "alpha", self.alpha, "no repeated values")
        if isinstance(self.profile, tuple):
            _check(self.backend.kind == "synthetic", "profile", self.profile, "a list " + synthetic_only)
            _check(len(self.profile) > 0 and len(set(self.profile)) == len(self.profile), "profile",
                   self.profile, "a non-empty list of distinct profile names")
        known = load_profiles()
        for name in self.profiles():
            _check(not name or name in known, "profile", name, f"a profile of dsd/profiles.toml {sorted(known)}")

    def profiles(self) -> tuple[str, ...]:
        return self.profile if isinstance(self.profile, tuple) else (self.profile,)

    def alphas(self) -> tuple[float, ...]:
        return tuple(float(a) for a in self.alpha) or (self.backend.alpha,)

    def for_group(self, profile: str, alpha: float) -> "Experiment":
        """The experiment with one profile and one alpha: what one testbed runs."""
        return replace(self, profile=profile, alpha=(), backend=replace(self.backend, alpha=alpha))


def _check(ok: bool, key: str, value, expected: str) -> None:
    if not ok:
        raise ValueError(f"experiment key {key!r}: expected {expected}, got {value!r}")


def load_experiment(path: Path) -> Experiment:
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    return experiment_from_dict(data, source=str(path))


def experiment_from_dict(data: dict, source: str = "experiment") -> Experiment:
    data = dict(data)
    backend = data.pop("backend", {})
    known = {f.name for f in fields(Experiment)} - {"backend"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; known: {sorted(known | {'backend'})}")
    backend_known = {f.name for f in fields(BackendConfig)}
    unknown = sorted(set(backend) - backend_known)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) in [backend]: {unknown}; known: {sorted(backend_known)}")
    if "name" not in data:
        raise ValueError(f"{source}: missing key 'name'")
    if "alpha" in data and "alpha" in backend:
        raise ValueError(f"{source}: alpha is given twice: as the sweep key 'alpha' and in [backend]; keep one")
    if isinstance(data.get("profile"), list):
        data["profile"] = tuple(data["profile"])
    for key in ("modes", "rtt_ms", "gamma", "clients", "alpha"):
        if key in data:
            value = data[key]
            data[key] = tuple(value) if isinstance(value, list) else (value,)
    try:
        return Experiment(backend=BackendConfig(**backend), **data)
    except TypeError as error:
        raise ValueError(f"{source}: {error}") from None
