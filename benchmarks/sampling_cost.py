"""What sampling costs per row on the real pair's vocabulary (49,152 tokens): the nucleus found
among the top tokens first (dsd.speculation.verification._nucleus) against sorting the whole row, and the
draw over the nucleus (dsd.speculation.verification.sample_index) against torch.multinomial over the row.

    python benchmarks/sampling_cost.py [--pair models/smollm2-chat] [--passes 200] [--dtype auto]

Rows: the target's logits over one evaluation instruction's answer (the target in the precision
``dtype = "auto"`` chooses on this CPU unless --dtype, greedy answer of 48 tokens), at the main
job's sampling (temperature 0.7, top-p 0.9). Prints last
``rows= full_sort_ms= top_first_ms= ratio= share_top64= share_top1024= row_draw_ms=
support_draw_ms= draw_ratio=`` (per row, medians of the passes; the ratios are the new way over the
old, below 1 is faster; share_topK: rows whose nucleus lies in their top K tokens).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig  # noqa: E402
from dsd.backends.torch_lm import TorchLM, TorchLMConfig  # noqa: E402
from dsd.drive.generation import generate_ar  # noqa: E402
from dsd.speculation.stopping import StopRule  # noqa: E402
from dsd.speculation.verification import NUCLEUS_FIRST_KS, _nucleus, _nucleus_by_sort, sample_index  # noqa: E402

TEMPERATURE, TOP_P = 0.7, 0.9


def answer_rows(pair: Path, dtype: str) -> torch.Tensor:
    from transformers import AutoTokenizer
    from pairs import chat_data, smollm2

    tokenizer = AutoTokenizer.from_pretrained(str(pair))
    prompt = chat_data.render(tokenizer, chat_data.read_prompts(smollm2.EVAL_PROMPTS)[0])
    target = TorchLM.load(TorchLMConfig(str(pair / "target"), dtype))
    answer = generate_ar(target, prompt, StopRule(max_new_tokens=48)).tokens
    return target.logits("rows", prompt + answer, len(answer))


def per_row_ms(work, rows: torch.Tensor, passes: int) -> float:
    times = []
    for _ in range(passes):
        row = rows[len(times) % len(rows)].unsqueeze(0)
        start = time.perf_counter()
        work(row)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=Path("models/smollm2-chat"))
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=(AUTO, *DTYPE_NAMES),
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    args = parser.parse_args(argv)
    if not (args.pair / "target").is_dir():
        parser.error(
            f"{args.pair}/target missing: python -m pairs.build --family smollm2 --out {args.pair} --target-only"
        )
    torch.set_num_threads(1)
    dtype = HfBackendConfig(pair_path=str(args.pair), dtype=args.dtype).dtype  # refuses what this CPU cannot run
    probs = torch.softmax(answer_rows(args.pair, dtype).float() / TEMPERATURE, dim=-1)
    sorted_mass = torch.sort(probs, dim=-1, descending=True).values.cumsum(-1)
    shares = " ".join(
        f"share_top{k}={float((sorted_mass[:, k - 2] >= TOP_P).float().mean()):.3f}" for k in NUCLEUS_FIRST_KS
    )
    full_ms = per_row_ms(lambda row: _nucleus_by_sort(row, TOP_P), probs, args.passes)
    fast_ms = per_row_ms(lambda row: _nucleus(row, TOP_P), probs, args.passes)
    nuclei = _nucleus(probs, TOP_P)
    generator = torch.Generator().manual_seed(0)
    row_draw_ms = per_row_ms(lambda row: torch.multinomial(row[0], 1, generator=generator), nuclei, args.passes)
    support_draw_ms = per_row_ms(lambda row: sample_index(row[0], generator), nuclei, args.passes)
    print(
        f"rows={len(probs)} full_sort_ms={full_ms:.3f} top_first_ms={fast_ms:.3f} "
        f"ratio={fast_ms / full_ms:.3f} {shares} row_draw_ms={row_draw_ms:.3f} "
        f"support_draw_ms={support_draw_ms:.3f} draw_ratio={support_draw_ms / row_draw_ms:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
