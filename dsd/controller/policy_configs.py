"""Each policy's own settings: one frozen dataclass per policy of dsd/controller/interface.py, validated on
construction. ``ControllerConfig`` (dsd/controller/interface.py) holds what every policy shares (the start
plan, gamma_max, the modes, hand-over) and names its policy; its ``settings`` is that policy's
dataclass from ``POLICY_CONFIGS``.

Settings given as keys (a dict: a JSON body, a TOML table) go through ``policy_config``, which
refuses a key of another policy naming the key and the policy it belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from dsd.checks import is_int, is_number


def _is_whole(value: object, low: int) -> bool:
    return is_int(value) and value >= low


@dataclass(frozen=True)
class StaticConfig:
    """``static``: the configured gamma and mode every round; no settings of its own."""


@dataclass(frozen=True)
class HeuristicConfig:
    """``heuristic``: +2 after a fully accepted block, -1 otherwise, within 1..gamma_max; no
    settings of its own."""


@dataclass(frozen=True)
class ModelPolicyConfig:
    """``model``: the closed form on running estimates (dsd/controller/model_based.py)."""

    margin_pct: float = 5.0  # switch only for a plan predicted this much faster
    discount: float = 0.9  # weight of the past in the running estimates, per round
    t_ar_s: float | None = None  # the server's AR step (prior; default: t_verify(1) as measured)
    t_draft_server_s: float | None = None  # the server's draft step (prior; default: the edge's)
    explore_after: int = 4  # after this many server requests in a row, one DSD request
    # a server stream no edge plan could take back is kept asked at least this round trip ahead
    # before any slower link is seen (ModelPolicy.stream_ahead_s): 0.2 s is the 90th percentile,
    # weighted by pings, of RIPE Atlas's country-pair mean RTTs (data/, 201.5 ms)
    stream_ahead_floor_s: float = 0.2

    def __post_init__(self) -> None:
        if not (is_number(self.margin_pct) and 0 <= self.margin_pct < 100):
            raise ValueError(f"margin_pct must be in [0, 100), got {self.margin_pct!r}")
        if not (is_number(self.discount) and 0 <= self.discount < 1):
            raise ValueError(f"discount must be in [0, 1), got {self.discount!r}")
        for name in ("t_ar_s", "t_draft_server_s"):
            value = getattr(self, name)
            if value is not None and not (is_number(value) and value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value!r}")
        if not _is_whole(self.explore_after, 1):
            raise ValueError(f"explore_after must be a whole number >= 1, got {self.explore_after!r}")
        if not (is_number(self.stream_ahead_floor_s) and 0 <= self.stream_ahead_floor_s <= 10):
            raise ValueError(
                f"stream_ahead_floor_s must be a number of seconds in [0, 10], got {self.stream_ahead_floor_s!r}"
            )


@dataclass(frozen=True)
class BanditConfig:
    """``bandit``: discounted UCB over (mode, gamma) arms (dsd/controller/bandit.py). It runs a model
    policy beside it for its informed prior and its link hints: ``model`` is that policy's
    settings, and its ``discount`` and ``margin_pct`` are also the bandit's own acceptance
    estimate's discount and its margin for changing the kind of a request."""

    gammas: tuple[int, ...] = (1, 2, 4, 8, 16)  # the gamma arms (those <= gamma_max)
    horizon_s: float = 12.0  # an observation's weight halves every horizon_s seconds
    exploration: float = 0.1  # UCB bonus scale (a share of the best arm's rate)
    prior_rounds: float = 6.0  # the model's prediction as this many pseudo-rounds per arm (0: none)
    model: ModelPolicyConfig = field(default_factory=ModelPolicyConfig)

    def __post_init__(self) -> None:
        if isinstance(self.gammas, list):
            object.__setattr__(self, "gammas", tuple(self.gammas))
        if isinstance(self.model, Mapping):
            object.__setattr__(self, "model", policy_config("model", self.model))
        if not (isinstance(self.gammas, tuple) and self.gammas and all(_is_whole(g, 1) for g in self.gammas)):
            raise ValueError(f"gammas must be a non-empty list of whole numbers >= 1, got {self.gammas!r}")
        for name in ("horizon_s", "exploration"):
            value = getattr(self, name)
            if not (is_number(value) and value > 0):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if not (is_number(self.prior_rounds) and self.prior_rounds >= 0):
            raise ValueError(f"prior_rounds must be a number >= 0, got {self.prior_rounds!r}")
        if not isinstance(self.model, ModelPolicyConfig):
            raise ValueError(
                f"model must be the model policy's settings (ModelPolicyConfig or a table), got {self.model!r}"
            )


PolicySettings = StaticConfig | HeuristicConfig | ModelPolicyConfig | BanditConfig
POLICY_CONFIGS: dict[str, type[PolicySettings]] = {
    "static": StaticConfig,
    "heuristic": HeuristicConfig,
    "model": ModelPolicyConfig,
    "bandit": BanditConfig,
}


def setting_names(policy: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(POLICY_CONFIGS[policy]))


def policy_config(policy: str, keys: Mapping[str, Any]) -> PolicySettings:
    """The settings of ``policy`` from keys: a key of another policy is refused naming the key,
    the policy it belongs to and the one named; any other unknown key naming the known ones."""
    own = setting_names(policy)
    for key in keys:
        if key in own:
            continue
        owners = [name for name in POLICY_CONFIGS if key in setting_names(name)]
        if owners:
            nested = [name for name in own if name in owners]  # the bandit's model policy
            where = f"; set it in its {nested[0]!r} table" if nested else ""
            raise ValueError(
                f"{key} is a setting of the {' and '.join(owners)} policy, not of controller "
                f"{policy!r} (its settings: {list(own)}){where}"
            )
        raise ValueError(f"unknown setting {key!r} of controller {policy!r}; known: {list(own)}")
    return POLICY_CONFIGS[policy](**keys)


Settings = TypeVar("Settings", StaticConfig, HeuristicConfig, ModelPolicyConfig, BanditConfig)


def settings_as(settings: PolicySettings | None, kind: type[Settings]) -> Settings:
    """A controller config's checked settings as its policy's own kind."""
    if not isinstance(settings, kind):
        raise TypeError(f"settings must be a {kind.__name__}, got {type(settings).__name__}")
    return settings
