"""benchmarks/adaptive.py on the sim: the real protocol code (orchestrator.launchers.sim) on one
virtual clock, the synthetic pair with the scenario's alpha classes, the link following the
scenario's RTTs (or held at one); the oracle measured with each condition held still."""

from __future__ import annotations

from benchmarks.adaptive_scenario import POLICIES, RequestRun, Scenario, arms, policy_config
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.controller.policies import make_controller
from dsd.costs.compute_times import ComputeTimes
from dsd.speculation.stopping import StopRule
from orchestrator.launchers.sim import SimClient, SimRequest, run_request


def sim_costs(profile, gamma_max: int) -> ComputeTimes:
    return profile.times.tabulated(range(1, gamma_max + 1))


def sim_run(
    scenario: Scenario, pair, costs: ComputeTimes, prompts, arm=None, policy=None, rtt_ms=None
) -> list[RequestRun]:
    """The requests one after another on one virtual clock; ``rtt_ms`` fixes the link."""
    draft, target = pair
    stop = StopRule(scenario.tokens)
    out, clock_s = [], 0.0
    for index, prompt in enumerate(prompts):
        start_s = clock_s
        rtt_at = (lambda t, s=start_s: scenario.rtt_at_ms(s + t) / 1e3) if rtt_ms is None else (lambda _t: rtt_ms / 1e3)
        mode, gamma = arm or ("sync", 4)
        tokens, rounds, wall_s, _ = run_request(
            SimClient(draft, target, costs, stop, gamma_max=scenario.gamma_max),
            SimRequest(mode, gamma, prompt, f"r{index}"),
            rtt_at,
            policy,
        )
        plans = [(r.gamma, r.mode) if r.mode else (gamma, mode) for r in rounds if not r.stale]
        out.append(RequestRun(start_s, wall_s, len(tokens), draft.config.alpha_of(prompt), plans))
        clock_s += wall_s
    return out


def sim_seed(scenario: Scenario, profile, seed: int) -> dict[str, list[RequestRun]]:
    config = SyntheticConfig(alpha=scenario.alphas[0], seed=seed, alpha_classes=scenario.alpha_classes())
    pair = (SyntheticLM(config, "draft"), SyntheticLM(config, "target"))
    costs = sim_costs(profile, scenario.gamma_max)
    prompts = scenario.prompts(seed)
    results = {f"static {m} {g}": sim_run(scenario, pair, costs, prompts, arm=(m, g)) for m, g in arms(scenario)}
    for name in POLICIES:
        results[name] = sim_run(scenario, pair, costs, prompts, policy=make_controller(policy_config(name, scenario)))
    return results


def sim_oracle(scenario: Scenario, profile, seed: int, levels_ms: list[float]) -> tuple[dict, dict, dict, dict]:
    """Each static arm at each constant (RTT level of ``levels_ms``, alpha), on the run's own prompts
    of that class: its per-token time; the best per condition (in-sample: chosen and scored on the
    same prompts, the sim's oracle), the netns estimator's split by prompts beside it
    (benchmarks/adaptive_oracle.py ``constant_oracle``, every arm on every prompt here), the
    prompt-matched oracle (``prompt_matched_oracle``), and the measurements (arm -> condition ->
    (prompt index, seconds, tokens))."""
    from benchmarks.adaptive_oracle import constant_oracle, prompt_matched_oracle

    config = SyntheticConfig(alpha=scenario.alphas[0], seed=seed, alpha_classes=scenario.alpha_classes())
    pair = (SyntheticLM(config, "draft"), SyntheticLM(config, "target"))
    costs = sim_costs(profile, scenario.gamma_max)
    prompts = scenario.prompts(seed)
    measured: dict = {}
    for k, alpha in enumerate(scenario.alphas):
        mine = [i for i in range(len(prompts)) if scenario.alpha_class(i) == k]
        for rtt in levels_ms:
            for mode, gamma in arms(scenario):
                runs = sim_run(scenario, pair, costs, [prompts[i] for i in mine], arm=(mode, gamma), rtt_ms=rtt)
                measured.setdefault(f"static {mode} {gamma}", {})[(rtt, alpha)] = [
                    (i, r.wall_s, r.tokens) for i, r in zip(mine, runs)
                ]
    split, in_sample = constant_oracle(measured)
    return in_sample, split, prompt_matched_oracle(measured), measured
