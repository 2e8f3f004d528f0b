"""Adaptive DSD against the per-segment oracle, on the sim launcher's virtual time.

    python benchmarks/adaptive.py [--profile cpu2-default-pair] [--alpha 0.8] [--seeds 3]

The link steps between a near and a far RTT (``--rtt-ms 10 150``, ``--segment-s`` each, cyclic)
during every request; the RTT a message sees is the one in force when it is sent. Every policy
and every static (mode, gamma) of the grid runs the same requests (synthetic backend, greedy)
with the real protocol code (dsd.simulate). The per-segment oracle is measured, not predicted:
each static arm runs at each segment's constant RTT and the best per-token time of each is kept.
A run that spent T_i seconds in segment i could at best have emitted sum_i T_i / best_i tokens;
``X_vs_oracle_pct`` is how much longer per token X took than that, averaged over requests.

Prints last: model_vs_oracle_pct= heuristic_vs_oracle_pct= best_static_vs_oracle_pct=
switches_per_100_rounds= (plan changes of the model policy per 100 live rounds).
NOTE: no alpha schedule yet (the synthetic acceptance is fixed per run), and the network
launchers are not driven from here (their link schedule is issue 16's ``[[link.schedule]]``).
"""
from __future__ import annotations

import argparse
import statistics

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.control import ControllerConfig, make_controller
from dsd.profiles import get_profile
from dsd.simulate import LinkCosts, simulate_dsd
from dsd.stopping import StopRule

MODES = ("sync", "pipelined")


def step_schedule(rtts_ms: list[float], segment_s: float):
    def rtt_at(t_s: float) -> float:
        return rtts_ms[int(t_s // segment_s) % len(rtts_ms)] / 1e3
    return rtt_at


def run(pair, prompt, profile, stop, mode, gamma, rtt_at, controller=None, gamma_max=None, seq_id="b"):
    draft, target = pair
    costs = LinkCosts(profile.t_draft_edge_s, profile.t_verify_s(gamma), rtt_at(0.0))
    return simulate_dsd(draft, target, prompt, gamma, stop, costs, pipelined=mode == "pipelined",
                        seq_id=seq_id, controller=controller, gamma_max=gamma_max, rtt_at=rtt_at,
                        t_verify_of=profile.t_verify_s)


def time_in_segments(total_s: float, rtts_ms: list[float], segment_s: float) -> dict[float, float]:
    spent: dict[float, float] = {}
    t_s, i = 0.0, 0
    while t_s < total_s:
        rtt = rtts_ms[i % len(rtts_ms)]
        spent[rtt] = spent.get(rtt, 0.0) + min(segment_s, total_s - t_s)
        t_s += segment_s
        i += 1
    return spent


def vs_oracle_pct(result, best_s: dict[float, float], rtts_ms, segment_s) -> float:
    spent = time_in_segments(result.total_s, rtts_ms, segment_s)
    oracle_tokens = sum(t / best_s[rtt] for rtt, t in spent.items())
    return 100.0 * (oracle_tokens / len(result.generation.tokens) - 1.0)


def switches(result) -> float:
    live = [(r.gamma, r.mode) for r in result.generation.rounds if not r.stale]
    changes = sum(a != b for a, b in zip(live, live[1:]))
    return 100.0 * changes / max(len(live), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="cpu2-default-pair")
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[10.0, 150.0])
    parser.add_argument("--segment-s", type=float, default=3.0)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--gamma-max", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    profile = get_profile(args.profile)
    pair = tuple(SyntheticLM(SyntheticConfig(alpha=args.alpha, seed=7), role) for role in ("draft", "target"))
    stop = StopRule(args.tokens)
    arms = [(m, g) for m in MODES for g in range(1, args.gamma_max + 1)]
    schedule = step_schedule(args.rtt_ms, args.segment_s)
    pct: dict[str, list[float]] = {"model": [], "heuristic": [], "best_static": []}
    switch_rates = []
    for seed in range(args.seeds):
        prompt = [seed + 1, 17, 5, 9]
        best_s = {rtt: min(run(pair, prompt, profile, stop, m, g, lambda _t, r=rtt: r / 1e3).per_token_s
                           for m, g in arms) for rtt in set(args.rtt_ms)}
        statics = [vs_oracle_pct(run(pair, prompt, profile, stop, m, g, schedule), best_s, args.rtt_ms,
                                 args.segment_s) for m, g in arms]
        pct["best_static"].append(min(statics))
        for name in ("model", "heuristic"):
            controller = make_controller(ControllerConfig(name, 4, "sync", args.gamma_max))
            result = run(pair, prompt, profile, stop, "sync", 4, schedule, controller, args.gamma_max)
            pct[name].append(vs_oracle_pct(result, best_s, args.rtt_ms, args.segment_s))
            if name == "model":
                switch_rates.append(switches(result))
        print(f"seed {seed}: " + " ".join(f"{k}={v[-1]:.1f}%" for k, v in pct.items()), flush=True)
    print(" ".join(f"{k}_vs_oracle_pct={statistics.mean(v):.1f}" for k, v in pct.items())
          + f" switches_per_100_rounds={statistics.mean(switch_rates):.1f}")


if __name__ == "__main__":
    main()
