"""The controller of a run: the policy its ControllerConfig names (dsd/controller/interface.py describes
them), or the one a static run's mode brings (dsd/modes.py). The policies import control's
interface; this module imports them, so neither is imported through the other."""

from __future__ import annotations

from collections.abc import Callable

from dsd.controller.interface import Controller, ControllerConfig
from dsd.modes import get_mode
from dsd.controller.bandit import BanditPolicy
from dsd.controller.model_based import ModelPolicy
from dsd.controller.rule_based import HeuristicPolicy, StaticPolicy

POLICIES: dict[str, Callable[[ControllerConfig], Controller]] = {
    "static": StaticPolicy,
    "heuristic": HeuristicPolicy,
    "model": ModelPolicy,
    "bandit": BanditPolicy,
}


def make_controller(config: ControllerConfig) -> Controller:
    """The run's controller; a static run of a mode with its own policy (dsd/modes.py) gets that."""
    own_policy = get_mode(config.mode).policy
    if config.name == "static" and own_policy is not None:
        controller = own_policy(config)
        if not isinstance(controller, Controller):
            raise TypeError(f"mode {config.mode!r}: its policy made a {type(controller).__name__}, not a controller")
        return controller
    return POLICIES[config.name](config)
