"""The ``sim`` launcher: real models and the real protocol code, on virtual time.

Compute costs are those measured on this machine (``dsd.timing``) or taken from a hardware
profile; the link is a constant RTT split evenly, a delay per message. Every mode, cloud AR and
co-located SD included, runs its message exchange on virtual time (``dsd.simulate``). It
predicts what the network launchers should measure, and runs anywhere in seconds. Every row it writes says ``launcher=sim``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dsd.backends.protocol import SamplingParams
from dsd.control import (ControllerConfig, RequestObservation, check_decision, make_controller,
                         shadow_matches)
from dsd.modes import edge_modes, get_mode, server_modes
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
                sampling: SamplingParams = SamplingParams(), controller: str = "static", gamma_max: int = 16,
                policy=None, rtt_at=None):
    """Returns (generated tokens, round records, wall_s, ttft_s) on virtual time. Every mode runs
    its protocol (dsd.simulate): no time here comes from the closed form.

    ``policy`` (a live dsd.control policy, kept across a run's requests) picks the request's mode
    among its modes (``decide_request`` at the RTT in force, ``observe_request`` after) and then
    its rounds' plans; without it, ``controller`` names a policy made for this request alone (DSD
    modes only). ``rtt_at(t_s)``: the link's RTT t_s after the request starts (default rtt_s)."""
    link_at = rtt_at or (lambda _t: rtt_s)
    rtt_s = link_at(0.0)
    if policy is not None:
        choice = check_decision(policy.decide_request(rtt_s), max(gamma_max, gamma), tuple(policy.config.modes))
        mode, gamma = choice.mode, choice.gamma
    elif controller != "static" and mode in edge_modes():
        policy = make_controller(ControllerConfig(controller, gamma, mode, gamma_max))
    prefill_s = costs.t_prefill_per_token_s * (len(prompt) - 1)
    t_verify_s = costs.t_verify_s[gamma]
    if mode in server_modes():
        server = ServerCosts(costs.t_ar_s, costs.t_draft_server_s, t_verify_s, prefill_s, rtt_s / 2)
        run = simulate_on_server(draft, target, prompt, gamma, stop, mode, server, sampling, seq_id)
        rounds = run.generation.rounds
        if policy is not None:     # the plan columns say what the controller chose
            rounds = [dataclasses.replace(r, gamma=gamma, mode=mode) for r in rounds]
            shadow = shadow_matches(draft, f"{seq_id}/shadow", prompt, run.generation.tokens) \
                if sampling.greedy else (0, 0)
            policy.observe_request(RequestObservation(mode, gamma, len(run.generation.tokens), run.total_s,
                                                      run.first_token_s, rtt_s, *shadow))
        return run.generation.tokens, rounds, run.total_s, run.first_token_s
    link = LinkCosts(costs.t_draft_edge_s, t_verify_s, rtt_s)
    # The edge opens the session first: one round trip and the prefill before drafting pays off.
    open_s = rtt_s + prefill_s
    run = simulate_dsd(draft, target, prompt, gamma, stop, link, pipelined=get_mode(mode).pipelined,
                       max_in_flight=max_in_flight, sampling=sampling, seq_id=seq_id,
                       controller=policy, gamma_max=max(gamma_max, gamma),
                       rtt_at=None if rtt_at is None else lambda t: rtt_at(open_s + t),
                       # an adaptive request's blocks are charged their own gamma's t_verify
                       t_verify_of=None if policy is None else lambda g: costs.t_verify_s.get(g, t_verify_s))
    if policy is not None:
        policy.observe_request(RequestObservation(mode, gamma, len(run.generation.tokens), open_s + run.total_s,
                                                  open_s + run.first_token_s, rtt_s))
    return run.generation.tokens, run.generation.rounds, open_s + run.total_s, open_s + run.first_token_s
