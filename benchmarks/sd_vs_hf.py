"""Our co-located SD against transformers' assisted generation, on the default pair, greedy.

Same prompts, same token budget, same model objects, in one run, interleaved per prompt so that
machine noise hits every method alike; plus plain AR (ours and transformers'). Checks that all
outputs are the target's greedy tokens. Last line: key=value pairs.

    python benchmarks/sd_vs_hf.py [--pair models/default-pair] [--gamma 4] [--prompts 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsd.backends.factory import HfBackendConfig, load_pair  # noqa: E402
from dsd.drive.generation import generate_ar, generate_colocated  # noqa: E402
from dsd.speculation.stopping import StopRule  # noqa: E402
from orchestrator.spec.workload import make_prompts  # noqa: E402


def hf_generate(target, draft, prompt, gamma, max_new_tokens, eos):
    input_ids = torch.tensor([prompt])
    kwargs = dict(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos if eos is not None else 0
    )
    if draft is not None:
        draft.generation_config.num_assistant_tokens = gamma
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = draft
    with torch.inference_mode():
        out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    return out[0, len(prompt) :].tolist()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="models/default-pair")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def methods(draft, target, prompt: list[int], index: int, args, stop: StopRule) -> dict:
    """name -> a call that generates prompt's tokens that way: ours and HF's assisted generation
    (speculative), ours and HF's plain generation (AR)."""
    return {
        "ours": lambda: generate_colocated(draft, target, prompt, args.gamma, stop, seq_id=f"o{index}").tokens,
        "hf_assisted": lambda: hf_generate(
            target.model, draft.model, prompt, args.gamma, args.max_new_tokens, target.eos_token_id
        ),
        "ar": lambda: generate_ar(target, prompt, stop, seq_id=f"a{index}").tokens,
        "hf_ar": lambda: hf_generate(target.model, None, prompt, args.gamma, args.max_new_tokens, target.eos_token_id),
    }


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)

    backend = HfBackendConfig(pair_path=args.pair)
    draft, target = load_pair(backend)
    prompts = make_prompts(backend, args.prompts + 1, args.prompt_tokens, seed=0)
    stop = StopRule(args.max_new_tokens, target.eos_token_id)
    times = {"ours": [], "hf_assisted": [], "ar": [], "hf_ar": []}
    tokens = {k: 0 for k in times}
    mismatches = {k: 0 for k in times}
    for index, prompt in enumerate(prompts):
        warmup = index == 0
        runs = methods(draft, target, prompt, index, args, stop)
        outputs = {}
        for name, run in runs.items():
            start = time.perf_counter()
            outputs[name] = run()
            elapsed = time.perf_counter() - start
            if not warmup:
                times[name].append(elapsed)
                tokens[name] += len(outputs[name])
        for name in runs:
            mismatches[name] += int(outputs[name] != outputs["ar"]) if not warmup else 0
        print(
            f"prompt {index}{' (warm-up)' if warmup else ''}: "
            + ", ".join(
                f"{n} {len(outputs[n])} tok {1e3 * times[n][-1] if times[n] and not warmup else 0:.0f} ms" for n in runs
            ),
            file=sys.stderr,
        )
    tok_s = {name: tokens[name] / sum(times[name]) for name in times}
    print(f"{'method':<12} {'tok/s':>8} {'median s/prompt':>16} {'outputs != AR':>14}")
    for name in times:
        print(f"{name:<12} {tok_s[name]:>8.1f} {statistics.median(times[name]):>16.3f} {mismatches[name]:>14}")
    print(
        " ".join(
            [
                f"ours_tok_s={tok_s['ours']:.1f}",
                f"hf_assisted_tok_s={tok_s['hf_assisted']:.1f}",
                f"ar_tok_s={tok_s['ar']:.1f}",
                f"hf_ar_tok_s={tok_s['hf_ar']:.1f}",
                f"ratio_vs_hf={tok_s['ours'] / tok_s['hf_assisted']:.3f}",
                f"speedup_vs_ar={tok_s['ours'] / tok_s['ar']:.3f}",
                f"gamma={args.gamma}",
                f"prompts={args.prompts}",
                f"max_new_tokens={args.max_new_tokens}",
                f"threads={args.threads}",
                f"mismatches_ours={mismatches['ours']}",
                f"mismatches_hf_assisted={mismatches['hf_assisted']}",
            ]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
