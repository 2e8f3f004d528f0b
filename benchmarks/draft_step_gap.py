"""What an idle gap before a draft block costs the draft's step: blocks of gamma sampled draft
steps as the edge drafts them (dsd.speculation.drafting.pick_token on the draft's logits, a growing context), separated by a
pause spun on the same core, against the same blocks back to back.

    python benchmarks/draft_step_gap.py [--pair models/smollm2-chat] [--cpu 0] [--gaps-ms 0,5,30,60,120]
        [--dtype auto]

One thread, pinned to --cpu, in the draft's precision ``dtype = "auto"`` chooses on this CPU unless
--dtype. Prints per gap
``gap_ms= step_ms= first_step_ms= ratio=`` (medians over the blocks; ratio: against gap 0).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig  # noqa: E402
from dsd.backends.protocol import SamplingParams  # noqa: E402
from dsd.backends.torch_lm import TorchLM, TorchLMConfig  # noqa: E402
from dsd.speculation.drafting import pick_token  # noqa: E402

GAMMA, CONTEXT_TOKENS, NEW_TOKENS, REQUESTS = 2, 96, 48, 4
SAMPLING = SamplingParams(temperature=0.7, top_p=0.9)


def spin(seconds: float) -> None:
    end_s = time.perf_counter() + seconds
    while time.perf_counter() < end_s:
        pass


def block_times_ms(draft: TorchLM, gap_s: float) -> tuple[float, float]:
    """Median per-step and first-step time over REQUESTS requests of NEW_TOKENS tokens."""
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    steps_ms, firsts_ms = [], []
    for request in range(REQUESTS):
        seq_id = f"gap{gap_s}-{request}"
        tokens = [rng.randrange(2, 40_000) for _ in range(CONTEXT_TOKENS)]
        while len(tokens) < CONTEXT_TOKENS + NEW_TOKENS:
            block = []
            for _ in range(GAMMA):
                start_s = time.perf_counter()
                token, _ = pick_token(draft.logits(seq_id, tokens + block, 1), SAMPLING, generator)
                steps_ms.append(1e3 * (time.perf_counter() - start_s))
                firsts_ms += steps_ms[-1:] if not block else []
                block.append(token)
            tokens += block[: rng.randrange(GAMMA + 1)] + [rng.randrange(2, 40_000)]
            spin(gap_s)
        draft.release(seq_id)
    return statistics.median(steps_ms), statistics.median(firsts_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="models/smollm2-chat")
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--gaps-ms", default="0,5,30,60,120")
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=(AUTO, *DTYPE_NAMES),
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.sched_setaffinity(0, [args.cpu])
    backend = HfBackendConfig(pair_path=args.pair, dtype=args.dtype)  # refuses what this CPU cannot run
    print(f"dtype={backend.draft_dtype}", flush=True)
    draft = TorchLM.load(TorchLMConfig(str(Path(args.pair) / "draft"), backend.draft_dtype))
    block_times_ms(draft, 0.0)  # warm-up
    baseline_ms = None
    for gap_ms in [float(g) for g in args.gaps_ms.split(",")]:
        step_ms, first_ms = block_times_ms(draft, gap_ms / 1e3)
        baseline_ms = baseline_ms or step_ms
        print(
            f"gap_ms={gap_ms:g} step_ms={step_ms:.2f} first_step_ms={first_ms:.2f} ratio={step_ms / baseline_ms:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
