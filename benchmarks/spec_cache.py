"""The speculation cache on the real pair: what a batched draft pass over B branches costs, how
often the cache holds the verdict (against the one-guess protocol's survival), and, from a main
job's folder, the cached mode's crossover with co-located SD beside its prediction.

    python benchmarks/spec_cache.py [--pair models/smollm2-chat] [--prompts 8] [--sweep results/crossover]
        [--no-calibrate] [--no-batch-curve]

In process, one thread pinned to --cpu, in the precision ``dtype = "auto"`` chooses on this CPU unless --dtype. The batch curve: B forks of
one 100-token context, each fed one new position in one batched pass of the draft (median of
--passes), over the one-sequence step (``batch{B}_over_step``). The hit rates: the evaluation
prompts (workloads/instructions.jsonl, the draft never trained on them) decoded in the cached
mode and in the one-guess pipelined mode by the protocol code on the simulator's virtual clock
with the real models (dsd.simulation.one_client), gamma 2, T 0.7 / top-p 0.9 as the main job samples, one
seed per prompt, the prompts one edge run's requests (what the fills learn carries over;
--no-calibrate ranks the outcomes on the draft's distribution as is): ``hit_rate`` (a branch
held the verdict, complete or part-way),
``hit_rate_predicted`` (the edge's own estimate, summed over its branches, averaged),
``baseline_hit_rate`` (one-guess verdicts that kept the speculation alive), and ``hit_rate_at``
(the share of verdicts whose outcome ranked within the first b candidates: the hit rate b
branches give). With --sweep, the measured and predicted ``cached_vs_colocated`` crossover of
that folder's summary.json (of a main job's folder: its sweep on --pair; ``crossover_ms`` with
its 95% interval, ``crossover_predicted_ms`` out of sample: predicted from the calibration points
before the others ran), and the one-guess baseline's ``pipelined_vs_colocated`` beside it. Progress goes to stderr; the last line is key=value.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.hf import HfBackendConfig  # noqa: E402
from dsd.backends.machine import CpuCapability  # noqa: E402
from dsd.backends.protocol import LogitsRequest, SamplingParams  # noqa: E402
from dsd.backends.torch_lm import TorchLM, TorchLMConfig  # noqa: E402
from dsd.cache.filler import CacheMemory  # noqa: E402
from dsd.simulation.one_client import LinkCosts, simulate_dsd  # noqa: E402
from dsd.cache.speculation_cache import CacheConfig  # noqa: E402
from dsd.speculation.stopping import StopRule  # noqa: E402
from orchestrator.records.suite_folder import sweep_crossovers  # noqa: E402
from dsd.drive.driver import DriverConfig

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 2, 4, 8, 16, 32, 48)
GAMMA, MAX_NEW_TOKENS, PROMPT_TOKENS = 2, 48, 96
SAMPLING = dict(temperature=0.7, top_p=0.9)


def batch_curve_s(draft: TorchLM, passes: int) -> dict[int, float]:
    """Median seconds of one batched pass over B forked branches, one new position each."""
    context = [(7 * i + 11) % 40_000 for i in range(100)]
    draft.logits("base", context, 1)
    out = {}
    for b in BATCHES:
        samples = []
        for r in range(passes + 1):
            for i in range(b):
                draft.fork("base", f"branch{i}", len(context))
            requests = [LogitsRequest(f"branch{i}", context + [(13 * i + r) % 40_000], 1) for i in range(b)]
            start = time.perf_counter()
            draft.logits_batch(requests)
            if r:
                samples.append(time.perf_counter() - start)
        out[b] = statistics.median(samples)
        print(f"batch {b}: {1e3 * out[b]:.1f} ms", file=sys.stderr, flush=True)
    for i in range(max(BATCHES)):
        draft.release(f"branch{i}")
    return out


def hit_rates(draft: TorchLM, target: TorchLM, prompts: list[list[int]], cache: CacheConfig) -> dict:
    link = LinkCosts(t_draft_s=0.014, t_verify_s=0.06, rtt_s=0.02)  # virtual: what the fill has time for
    records, survived, verdicts = [], 0, 0
    memory = CacheMemory()  # one edge's run: the fills learn across its requests
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(seed=i, **SAMPLING)
        stop = StopRule(MAX_NEW_TOKENS, target.eos_token_id)
        cached = simulate_dsd(
            draft,
            target,
            prompt,
            stop,
            link,
            DriverConfig(GAMMA, "cached", cache=cache),
            sampling=sampling,
            seq_id=f"cached-{i}",
            cache_memory=memory,
        )
        records += [r.cache for r in cached.generation.rounds if r.cache is not None]
        guess = simulate_dsd(
            draft,
            target,
            prompt,
            stop,
            link,
            DriverConfig(GAMMA, "pipelined", max_in_flight=2),
            sampling=sampling,
            seq_id=f"guess-{i}",
        )
        live = sum(not r.stale for r in guess.generation.rounds)
        verdicts += live
        survived += live - guess.edge.epoch  # every verdict that refuted the guess restarted
        print(f"prompt {i}: {len(records)} cached rounds so far", file=sys.stderr, flush=True)
    n = len(records)
    at = {b: round(sum(0 <= r.rank < b for r in records) / n, 4) for b in (1, 4, 8, 16, 32, 48)}
    return {
        "rounds": n,
        "hit_rate": round(sum(r.hit for r in records) / n, 4),
        "hit_rate_complete": round(sum(r.hit and r.depth == GAMMA for r in records) / n, 4),
        "hit_rate_predicted": round(sum(r.predicted_hit for r in records) / n, 4),
        "baseline_hit_rate": round(survived / verdicts, 4),
        "branches_p50": statistics.median(r.branches for r in records),
        "hit_rate_at": "{" + ",".join(f"{b}:{v}" for b, v in at.items()) + "}",
    }


def cache_crossover(folder: Path, pair: str) -> dict:
    crossovers = sweep_crossovers(folder, pair)
    crossover = crossovers.get("cached_vs_colocated", {})
    baseline = crossovers.get("pipelined_vs_colocated", {})
    return {
        "crossover_ms": crossover.get("measured_rtt_ms"),
        "crossover_ci_low_ms": crossover.get("ci_low"),
        "crossover_ci_high_ms": crossover.get("ci_high"),
        "crossover_predicted_ms": crossover.get("predicted_rtt_ms_oos"),
        "baseline_crossover_ms": baseline.get("measured_rtt_ms"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=REPO / "models" / "smollm2-chat")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    parser.add_argument("--passes", type=int, default=12)
    parser.add_argument("--max-branches", type=int, default=CacheConfig.max_branches)
    parser.add_argument("--cpu", type=int, default=None)
    parser.add_argument("--no-calibrate", action="store_true", help="rank outcomes on the draft's distribution as is")
    parser.add_argument("--no-batch-curve", action="store_true", help="skip the batched passes' timing")
    parser.add_argument("--sweep", type=Path, help="a main job's output folder (results/crossover) or a sweep's")
    args = parser.parse_args(argv)
    if not (args.pair / "target" / "config.json").is_file():
        parser.error(
            f"--pair {args.pair}: no target/ (python -m pairs.build --family smollm2 --out {args.pair} --target-only)"
        )
    os.sched_setaffinity(0, {args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from pairs import chat_data, smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(args.pair))
    prompts = [
        chat_data.render(tokenizer, p)[-PROMPT_TOKENS:]
        for p in chat_data.read_prompts(smollm2.EVAL_PROMPTS)[: args.prompts]
    ]
    backend = HfBackendConfig(pair_path=str(args.pair), dtype=args.dtype)  # refuses what this CPU cannot run
    target = TorchLM.load(TorchLMConfig(str(args.pair / "target"), backend.dtype))
    draft = TorchLM.load(TorchLMConfig(str(args.pair / "draft"), backend.draft_dtype))
    figures = {}
    if not args.no_batch_curve:
        curve = batch_curve_s(draft, args.passes)
        figures = {f"batch{b}_over_step": round(curve[b] / curve[1], 3) for b in BATCHES}
        figures["t_draft_step_ms"] = round(1e3 * curve[1], 2)
    figures |= hit_rates(
        draft, target, prompts, CacheConfig(max_branches=args.max_branches, calibrate=not args.no_calibrate)
    )
    if args.sweep is not None:
        figures |= cache_crossover(args.sweep, args.pair.name)
    figures |= {
        "prompts": args.prompts,
        "dtype": backend.dtype,
        "draft_dtype": backend.draft_dtype,
        "cpu": f'"{CpuCapability.of_this_machine().describe()}"',
        "calibrate": not args.no_calibrate,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
