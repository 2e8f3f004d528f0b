"""The feature draft drafting for several sessions at once: one batched pass a draft step
(``EagleLM.logits_batch``) against one pass per session and step, as a co-located server's
drafting (dsd.speculation.drafting.run_draft_jobs) and the edge's speculation cache (dsd.cache.filler) ask it.

    python benchmarks/eagle_batch.py [--eagle models/smollm2-eagle] [--batch-sizes 1,2,4,8]
        [--gamma 4] [--repeats 15] [--dtype auto] [--threads 1]

Each session holds one of the evaluation prompts (chat-rendered, 30-90 tokens) with the target's
features known for all of it (random values of the features' scale: the step's cost does not
depend on them), and drafts a block of gamma tokens, greedily, from the end of its prompt. A
repeat drafts every session's block both ways, the two interleaved (a shared machine drifts):
one session after another, then all of them batched; the sessions' caches are cropped back to
their prompts before each. Printed per session count: the median time of a draft step (all
sessions' next token) each way, their ratio, and whether both ways drafted the same tokens.
Progress to stderr; the last line is key=value figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.eagle_lm import EagleLM  # noqa: E402
from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig  # noqa: E402
from dsd.backends.machine import cpu_model  # noqa: E402
from dsd.backends.protocol import LogitsRequest  # noqa: E402
from dsd.features import FeatureBlock  # noqa: E402


def prompts(eagle_dir: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from pairs import chat_data, smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(eagle_dir))
    texts = chat_data.read_prompts(smollm2.EVAL_PROMPTS)[:count]
    return [chat_data.render(tokenizer, text) for text in texts]


def draft_blocks(draft: EagleLM, contexts: list[list[int]], gamma: int, batched: bool) -> tuple[list[float], list]:
    """(seconds of each draft step, each session's drafted tokens), every session from its prompt."""
    for i, context in enumerate(contexts):
        draft.crop(f"s{i}", len(context))
    blocks = [[] for _ in contexts]
    step_s = []
    for _ in range(gamma):
        requests = [
            LogitsRequest(f"s{i}", context + block, 1) for i, (context, block) in enumerate(zip(contexts, blocks))
        ]
        start = time.perf_counter()
        if batched:
            rows = draft.logits_batch(requests)
        else:
            rows = [draft.logits(r.seq_id, r.tokens, r.n_last) for r in requests]
        step_s.append(time.perf_counter() - start)
        for block, row in zip(blocks, rows):
            block.append(int(row[-1].argmax()))
    return step_s, blocks


def measure(draft: EagleLM, contexts: list[list[int]], gamma: int, repeats: int) -> dict:
    scale = 3.0
    for i, context in enumerate(contexts):
        draft.release(f"s{i}")
        draft.add_features(f"s{i}", FeatureBlock(0, scale * torch.randn(len(context), draft.feature_width)))
        draft.logits(f"s{i}", context, 1)  # the prompt's positions, cached once
    alone, batched, same = [], [], True
    for repeat in range(repeats + 1):  # the first repeat warms up, dropped
        steps_alone, blocks_alone = draft_blocks(draft, contexts, gamma, batched=False)
        steps_batched, blocks_batched = draft_blocks(draft, contexts, gamma, batched=True)
        same = same and blocks_alone == blocks_batched
        if repeat:
            alone += steps_alone
            batched += steps_batched
    return {
        "alone_ms": 1e3 * statistics.median(alone),
        "batched_ms": 1e3 * statistics.median(batched),
        "same_tokens": int(same),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eagle", type=Path, default=Path("models/smollm2-eagle"))
    parser.add_argument("--batch-sizes", default="1,2,4,8")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=(AUTO, *DTYPE_NAMES),
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    counts = [int(x) for x in args.batch_sizes.split(",")]
    if not counts or min(counts) < 1 or max(counts) > 40 or args.gamma < 1 or args.repeats < 1:
        parser.error("--batch-sizes: session counts in 1..40 (the evaluation prompts); --gamma, --repeats: at least 1")
    torch.set_num_threads(args.threads)
    dtype = HfBackendConfig(pair_path=str(args.eagle), dtype=args.dtype).draft_dtype  # refuses what this CPU cannot run
    draft = EagleLM.load(args.eagle / "draft", dtype)
    contexts = prompts(args.eagle, max(counts))
    print(f"cpu={cpu_model()!r} threads={args.threads} dtype={dtype} gamma={args.gamma}")
    figures = {}
    for count in counts:
        result = measure(draft, contexts[:count], args.gamma, args.repeats)
        ratio = result["alone_ms"] / result["batched_ms"]
        print(
            f"sessions {count:2d}: a draft step {result['alone_ms']:7.2f} ms one by one, "
            f"{result['batched_ms']:7.2f} ms batched ({ratio:.2f}x), same tokens {result['same_tokens']}",
            file=sys.stderr,
            flush=True,
        )
        figures.update(
            {
                f"step_ms_alone_b{count}": f"{result['alone_ms']:.3f}",
                f"step_ms_batched_b{count}": f"{result['batched_ms']:.3f}",
                f"batched_speedup_b{count}": f"{ratio:.3f}",
                f"same_tokens_b{count}": str(result["same_tokens"]),
            }
        )
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
