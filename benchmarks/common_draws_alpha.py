"""Do keyed draws (dsd.speculation.draws) change acceptance? Co-located SD in process on the real pair, each
request once with draws keyed by block position and once with one sequential generator, on the
same prompts and seeds: the two acceptance rates should agree within their noise.

    python benchmarks/common_draws_alpha.py [--pair models/smollm2-chat] [--prompts 8] [--seeds 5] [--dtype auto]

In the precision ``dtype = "auto"`` chooses on this CPU unless --dtype, one thread, gamma 2, the
main job's sampling (temperature 0.7, top-p 0.9), answers of at most 48 tokens to the first
--prompts evaluation instructions. Prints last
``requests= keyed_accept_rate= sequential_accept_rate= diff= diff_se= dtype= draft_dtype=`` (accepted
over proposed draft tokens; diff_se: the standard error of the per-request paired difference).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig  # noqa: E402
from dsd.backends.protocol import SamplingParams  # noqa: E402
from dsd.drive.generation import generate_colocated  # noqa: E402
from dsd.speculation.draws import Draws  # noqa: E402
from dsd.speculation.stopping import StopRule  # noqa: E402

GAMMA, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS = 2, 48, 96


class SequentialDraws:
    """One generator for the whole request, whatever the position: the draws before dsd.speculation.draws."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def at(self, position: int, role: str) -> torch.Generator:
        return self.generator


def accept_counts(draft, target, prompt: list[int], seed: int, draws, seq_id: str) -> tuple[int, int]:
    sampling = SamplingParams(temperature=0.7, seed=seed, top_p=0.9)
    rounds = generate_colocated(
        draft, target, prompt, GAMMA, StopRule(MAX_NEW_TOKENS, target.eos_token_id), sampling, seq_id, draws
    ).rounds
    return sum(r.accepted for r in rounds), sum(r.proposed for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="models/smollm2-chat")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=(AUTO, *DTYPE_NAMES),
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer
    from pairs import chat_data, smollm2

    backend = HfBackendConfig(pair_path=args.pair, dtype=args.dtype)  # refuses what this CPU cannot run
    draft, target = backend.load()
    tokenizer = AutoTokenizer.from_pretrained(args.pair)
    prompts = [
        chat_data.render(tokenizer, p)[:MAX_PROMPT_TOKENS]
        for p in chat_data.read_prompts(smollm2.EVAL_PROMPTS)[: args.prompts]
    ]
    totals = {"keyed": [0, 0], "sequential": [0, 0]}
    diffs = []
    for i, prompt in enumerate(prompts):
        for s in range(args.seeds):
            seed = 1000 * i + s
            rates = {}
            for name, draws in (("keyed", Draws(seed)), ("sequential", SequentialDraws(seed))):
                accepted, proposed = accept_counts(draft, target, prompt, seed, draws, f"{name}-{i}-{s}")
                totals[name][0] += accepted
                totals[name][1] += proposed
                rates[name] = accepted / proposed
            diffs.append(rates["keyed"] - rates["sequential"])
    keyed, sequential = (totals[k][0] / totals[k][1] for k in ("keyed", "sequential"))
    print(
        f"requests={len(diffs)} keyed_accept_rate={keyed:.4f} sequential_accept_rate={sequential:.4f} "
        f"diff={keyed - sequential:+.4f} diff_se={statistics.stdev(diffs) / math.sqrt(len(diffs)):.4f} "
        f"dtype={backend.dtype} draft_dtype={backend.draft_dtype}"
    )


if __name__ == "__main__":
    main()
