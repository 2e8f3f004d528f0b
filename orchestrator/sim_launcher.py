"""The ``sim`` launcher: real models and the real protocol code, on virtual time.

Compute costs are those measured on this machine (``dsd.timing``) or taken from a hardware
profile; the link is a constant RTT split evenly, a delay per message. Every mode, cloud AR and
co-located SD included, runs its message exchange on virtual time (``dsd.simulate``). It
predicts what the network launchers should measure, and runs anywhere in seconds. Every row it writes says ``launcher=sim``.
"""
from __future__ import annotations

from dataclasses import dataclass

from dsd.backends.protocol import SamplingParams
from dsd.control import ControllerConfig, make_controller
from dsd.modes import get_mode, server_modes
from dsd.simulate import LinkCosts, ServerCosts, simulate_dsd, simulate_on_server
from dsd.stopping import StopRule


@dataclass(frozen=True)
class Costs:
    t_draft_edge_s: float
    t_draft_server_s: float
    t_ar_s: float
    t_verify_s: dict            # gamma -> seconds
    t_prefill_per_token_s: float


def run_request(mode: str, draft, target, prompt: list[int], gamma: int, rtt_s: float,
                stop: StopRule, costs: Costs, max_in_flight: int, seq_id: str,
                sampling: SamplingParams = SamplingParams(), controller: str = "static", gamma_max: int = 16):
    """Returns (generated tokens, round records, wall_s, ttft_s) on virtual time. Every mode runs
    its protocol (dsd.simulate): no time here comes from the closed form."""
    prefill_s = costs.t_prefill_per_token_s * (len(prompt) - 1)
    t_verify_s = costs.t_verify_s[gamma]
    if mode in server_modes():
        server = ServerCosts(costs.t_ar_s, costs.t_draft_server_s, t_verify_s, prefill_s, rtt_s / 2)
        run = simulate_on_server(draft, target, prompt, gamma, stop, mode, server, sampling, seq_id)
        return run.generation.tokens, run.generation.rounds, run.total_s, run.first_token_s
    link = LinkCosts(costs.t_draft_edge_s, t_verify_s, rtt_s)
    # NOTE: a request's blocks are all charged the start gamma's t_verify (the link costs hold one).
    policy = make_controller(ControllerConfig(controller, gamma, mode, gamma_max)) if controller != "static" else None
    run = simulate_dsd(draft, target, prompt, gamma, stop, link, pipelined=get_mode(mode).pipelined,
                       max_in_flight=max_in_flight, sampling=sampling, seq_id=seq_id,
                       controller=policy, gamma_max=max(gamma_max, gamma))
    # The edge opens the session first: one round trip and the prefill before drafting pays off.
    open_s = rtt_s + prefill_s
    return run.generation.tokens, run.generation.rounds, open_s + run.total_s, open_s + run.first_token_s
