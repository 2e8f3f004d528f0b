"""Where a policy's regret goes, request by request: reads the pickle of ``benchmarks/adaptive.py
--save FILE`` and prints, per seed, each request's start, the link's RTT and alpha over it, the
modes its rounds ran, and the seconds it lost against the per-segment oracle (its wall time less
what the oracle's per-token times give for its tokens over the same pieces of the schedule;
negative: faster than the oracle, the prompts' luck). The seconds sum to the run's regret.

    python benchmarks/adaptive_regret.py /tmp/seed2.pkl model [--top 8]
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.adaptive import oracle_tokens  # noqa: E402


def lost_s(run, best_s: dict, scenario) -> float:
    """The request's seconds above the oracle: wall less its tokens at the oracle's pace over the
    pieces it ran in (benchmarks/adaptive.py ``oracle_tokens``)."""
    oracle = oracle_tokens(run, best_s, scenario)
    return run.wall_s - run.tokens * run.wall_s / oracle if oracle > 0 else 0.0


def describe(index: int, run, lost: float, scenario) -> str:
    link = " -> ".join(f"{rtt:g}" for rtt, _ in scenario.pieces(run.start_s, run.start_s + run.wall_s))
    modes: list[str] = []
    for gamma, mode in run.plans:
        label = mode if mode in ("ar", "colocated") else f"{mode}{gamma}"
        if not modes or modes[-1] != label:
            modes.append(label)
    return (
        f"  request {index:2d} t={run.start_s:6.2f}s wall={run.wall_s:5.2f}s tokens={run.tokens:3d} "
        f"rtt={link} ms alpha={run.alpha:g} lost={lost:+.3f}s "
        f"modes={' '.join(modes[:8])}{' ...' if len(modes) > 8 else ''}"
    )


class _Unpickler(pickle.Unpickler):
    """benchmarks/adaptive.py pickles its classes as __main__'s when run as a script."""

    def find_class(self, module: str, name: str):
        if module == "__main__":
            module = "benchmarks.adaptive"
        return super().find_class(module, name)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pickle", help="the file benchmarks/adaptive.py --save wrote")
    parser.add_argument("policy", help="model, bandit, heuristic or a static arm's name")
    parser.add_argument("--top", type=int, default=0, help="only the N requests that lost most (0: all)")
    args = parser.parse_args(argv)
    with open(args.pickle, "rb") as f:
        saved = _Unpickler(f).load()
    scenario = saved["scenario"]
    for seed, (results, best_s) in enumerate(saved["per_seed"], saved["first_seed"]):
        if args.policy not in results:
            raise SystemExit(f"policy {args.policy!r} not in the saved runs: {sorted(results)}")
        runs = results[args.policy]
        losses = [lost_s(r, best_s, scenario) for r in runs]
        wall = sum(r.wall_s for r in runs)
        print(f"seed {seed} {args.policy}: lost {sum(losses):.3f} s of {wall:.2f} s")
        order = sorted(range(len(runs)), key=lambda i: -losses[i])[: args.top] if args.top else range(len(runs))
        for i in order:
            print(describe(i, runs[i], losses[i], scenario))


if __name__ == "__main__":
    main()
