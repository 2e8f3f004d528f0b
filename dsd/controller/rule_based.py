"""The fixed policies of dsd/controller/interface.py: ``static`` (the configured plan every round) and
``heuristic`` (transformers' +2/-1 schedule on acceptance alone, the peer baseline)."""

from __future__ import annotations

from dsd.controller.interface import ControllerConfig, Decision, Observation, RequestObservation


class StaticPolicy:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.decision = Decision(config.gamma, config.mode)

    def observe(self, observation: Observation) -> None:
        pass

    def decide(self) -> Decision:
        return self.decision

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        return self.decision

    def observe_request(self, observation: RequestObservation) -> None:
        pass


class HeuristicPolicy:
    """transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 if every draft was
    accepted, else -1 (at least 1); here also at most gamma_max. Every request is DSD in the
    configured mode (the schedule knows nothing of the link), its gamma carried over."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        start = config.dsd_start
        self.gamma, self.mode, self.gamma_max = start.gamma, start.mode, config.gamma_max

    def observe(self, observation: Observation) -> None:
        if observation.stale or observation.proposed == 0:
            return
        step = 2 if observation.accepted == observation.proposed else -1
        self.gamma = min(self.gamma_max, max(1, self.gamma + step))

    def decide(self) -> Decision:
        return Decision(self.gamma, self.mode)

    def decide_request(self, rtt_s: float | None = None) -> Decision:
        return self.decide()

    def observe_request(self, observation: RequestObservation) -> None:
        pass
