"""Score a built pair's draft on any prompt set: the target answers each prompt, then the draft
is teacher-forced on those answers (alpha at the given sampling, and greedy agreement).

    python -m pairs.score --pair models/smollm2-chat --prompts workloads/instructions.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dsd.backends.hf import HfBackendConfig
from dsd.backends.vocab_map import VocabMap
from pairs import chat_data, chat_draft


def score_pair(pair: Path, prompts: Path, max_new_tokens: int, temperature: float, top_p: float,
               seed: int, dtype: str) -> dict:
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(str(pair))
    target = AutoModelForCausalLM.from_pretrained(str(pair / "target"), dtype=torch_dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(pair / "draft"), dtype=torch_dtype).eval()
    config = chat_data.ChatDataConfig(prompts, samples_per_prompt=1, max_new_tokens=max_new_tokens,
                                      temperature=temperature, top_p=top_p, seed=seed)
    answers = chat_data.answer_prompts(target, tokenizer, config)
    vocab = VocabMap.load(str(pair / "draft"))
    sampled = chat_draft.heldout_acceptance(draft, target, vocab, answers, temperature, None, top_p)
    greedy = chat_draft.heldout_acceptance(draft, target, vocab, answers, 1.0, 1, 1.0)
    return {"pair": str(pair), "prompts": str(prompts), "answers": len(answers),
            "positions": sampled.positions, "dtype": dtype,
            "alpha_sampled": round(sampled.alpha_sampled, 4), "alpha_greedy": round(greedy.alpha_greedy, 4),
            "sampled_at": {"temperature": temperature, "top_p": top_p}, "seed": seed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, required=True, help="a built pair folder (target/, draft/)")
    parser.add_argument("--prompts", type=Path, required=True, help='jsonl, one {"prompt": ...} per line')
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=77)
    parser.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not (args.pair / "target").is_dir() or not (args.pair / "draft").is_dir():
        parser.error(f"--pair {args.pair}: expected target/ and draft/ inside (for the shipped pair, "
                     f"python -m pairs.build --family smollm2 --out {args.pair} --target-only)")
    torch.set_num_threads(args.threads)
    dtype = HfBackendConfig(str(args.pair.resolve()), dtype=args.dtype).dtype
    print(json.dumps(score_pair(args.pair, args.prompts, args.max_new_tokens, args.temperature,
                                args.top_p, args.seed, dtype)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
