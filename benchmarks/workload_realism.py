"""Is the main job's workload a real one? Run its prompts and sampling on its model pair
(co-located SD, in process: the outputs and acceptances are those of every mode, the network only
changes the time) and report how often drafts were accepted and whether the outputs loop.

Goals: alpha in 0.5..0.85 (published pairs: 0.6-0.8), distinct-4-gram p50 >= 0.6
(a looping output is near 0.1), at least 32 distinct prompts.

    python benchmarks/workload_realism.py [--experiment experiments/crossover.toml]
        [--temperature T] [--top-p P] [--top-k K] [--source heldout|jsonl ... --path FILE]

Prints one row per prompt, then a last line: alpha= distinct4_p50= prompts= tokens=
(alpha: maximum likelihood over all rounds; distinct4_p50: median over requests).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.factory import load_pair  # noqa: E402
from dsd.drive.generation import generate_colocated  # noqa: E402
from dsd.speculation.stopping import StopRule  # noqa: E402
from orchestrator.spec.experiment import load_experiment  # noqa: E402
from orchestrator.records.request_stats import distinct_ngram_ratio  # noqa: E402
from orchestrator.spec.workload import experiment_prompts  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", default=str(Path(__file__).resolve().parents[1] / "experiments/crossover.toml"))
    parser.add_argument("--temperature", type=float, help="override the experiment's first sampling setting")
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--source", help="override [workload] source (with --path)")
    parser.add_argument("--path", default="")
    parser.add_argument("--quiet", action="store_true", help="only the last line")
    args = parser.parse_args(argv)

    experiment = load_experiment(Path(args.experiment))
    if args.source:
        experiment = dataclasses.replace(
            experiment, workload=dataclasses.replace(experiment.workload, source=args.source, path=args.path)
        )
    setting = experiment.sampling_settings()[0]
    overrides = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k}
    setting = dataclasses.replace(setting, **{k: v for k, v in overrides.items() if v is not None})
    prompts = experiment_prompts(experiment)
    draft, target = load_pair(experiment.backend)
    gamma = experiment.gamma[0]
    stop = StopRule(experiment.max_new_tokens, target.eos_token_id)

    accepted = failures = tokens = 0
    distinct = []
    if not args.quiet:
        print(
            f"{'prompt':>6} {'tokens':>6} {'alpha':>6} {'distinct4':>9}  (T={setting.temperature:g} "
            f"top_k={setting.top_k} top_p={setting.top_p:g} gamma={gamma})"
        )
    for index, prompt in enumerate(prompts):
        out = generate_colocated(draft, target, prompt, gamma, stop, setting.params(index), seq_id=f"w{index}")
        request_accepted = sum(r.accepted for r in out.rounds)
        request_failures = sum(r.accepted < r.proposed for r in out.rounds)
        accepted, failures, tokens = accepted + request_accepted, failures + request_failures, tokens + len(out.tokens)
        distinct.append(distinct_ngram_ratio(out.tokens))
        if not args.quiet:
            print(f"{index:>6} {len(out.tokens):>6} {out.alpha_measured:>6.3f} {distinct[-1]:>9.3f}")
    alpha = accepted / (accepted + failures) if accepted + failures else float("nan")
    print(
        f"alpha={alpha:.3f} distinct4_p50={statistics.median(distinct):.3f} "
        f"prompts={len({tuple(p) for p in prompts})} tokens={tokens}"
    )


if __name__ == "__main__":
    main()
