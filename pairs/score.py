"""Score a built pair's draft on any prompt set: the target answers each prompt, then the draft
is teacher-forced on those answers (alpha at the given sampling, and greedy agreement), overall
and per category when the prompts file has them (workloads/README.md).

    python -m pairs.score --pair models/smollm2-chat --prompts workloads/chat_eval.jsonl --dtype float32

A layer draft (draft_kind causal_lm) has one alpha at every draft step. A feature draft (eagle)
runs on its own features after its first step, so it is scored per step over a block of
``--gamma`` (pairs.eagle_draft.heldout_acceptance, as benchmarks/feature_draft.py scores it), and
its alpha is the one per-token alpha with the same expected tokens per round at that gamma
(dsd.analytic.latency_model.alpha_for_tokens_per_round). Prints one JSON line; with categories, a table
of them on stderr first. ``--per-category N`` scores the first N items of each category only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig
from dsd.backends.vocab_map import VocabMap
from dsd.analytic.latency_model import alpha_for_tokens_per_round, tokens_per_round_by_step
from dsd.pair_manifest import draft_kind
from pairs import chat_data, chat_draft, eagle_draft

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class ScoreConfig:
    pair: Path
    prompts: Path
    max_new_tokens: int = 64
    temperature: float = 0.7  # the main job's sampling (experiments/crossover.toml)
    top_p: float = 0.9
    seed: int = 77
    dtype: str = "float32"  # the target's; "auto" is resolved before (HfBackendConfig)
    draft_dtype: str = "float32"
    gamma: int = 4  # a feature draft's block: the steps it is scored over
    per_category: int = 0  # > 0: only the first this many items of each category

    def __post_init__(self) -> None:
        for name in ("dtype", "draft_dtype"):
            if getattr(self, name) not in TORCH_DTYPES:
                raise ValueError(
                    f"ScoreConfig.{name} must be one of {sorted(TORCH_DTYPES)}, got {getattr(self, name)!r}"
                )
        if not isinstance(self.per_category, int) or self.per_category < 0:
            raise ValueError(f"ScoreConfig.per_category must be an int >= 0, got {self.per_category!r}")
        for name in ("max_new_tokens", "gamma"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ScoreConfig.{name} must be a positive int, got {value!r}")
        if not self.temperature > 0:
            raise ValueError(f"ScoreConfig.temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"ScoreConfig.top_p must be in (0, 1], got {self.top_p!r}")


@dataclass(frozen=True)
class StepScore:
    """Acceptance by draft step (one step for a layer draft), with the positions behind each."""

    sampled: list[float]
    greedy: list[float]
    positions: list[int]


def score_pair(config: ScoreConfig) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(str(config.pair))
    target = AutoModelForCausalLM.from_pretrained(str(config.pair / "target"), dtype=TORCH_DTYPES[config.dtype]).eval()
    items = stratified(chat_data.read_items(config.prompts), config.per_category)
    with tempfile.TemporaryDirectory(prefix="dsd-score-") as folder:  # the items answered, as a file
        prompts = Path(folder) / "prompts.jsonl"
        chat_data.write_items(items, prompts)
        answers = chat_data.answer_prompts(
            target,
            tokenizer,
            chat_data.ChatDataConfig(
                prompts,
                samples_per_prompt=1,
                max_new_tokens=config.max_new_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                top_logits=1,
                seed=config.seed,
            ),
        )  # no distillation
    kind = pair_draft_kind(config.pair)
    score = draft_scorer(kind, config, target)
    by_category = {}
    for category in dict.fromkeys(item.category for item in items):
        by_category[category] = score([a for a, item in zip(answers, items) if item.category == category])
    record = {
        "pair": str(config.pair),
        "prompts": str(config.prompts),
        "draft_kind": kind,
        "answers": len(answers),
        "dtype": config.dtype,
        "draft_dtype": config.draft_dtype,
        **summary(pooled(list(by_category.values())), kind, config.gamma),
        "sampled_at": {"temperature": config.temperature, "top_p": config.top_p},
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "per_category": config.per_category,
    }
    if set(by_category) != {""}:
        record["by_category"] = {
            c or "uncategorized": {"answers": sum(i.category == c for i in items), **summary(s, kind, config.gamma)}
            for c, s in by_category.items()
        }
    return record


def stratified(items: list[chat_data.PromptItem], per_category: int) -> list[chat_data.PromptItem]:
    """The first per_category items of each category, in the file's order (all of them at 0)."""
    if not per_category:
        return items
    seen: dict[str, int] = {}
    kept = []
    for item in items:
        seen[item.category] = seen.get(item.category, 0) + 1
        if seen[item.category] <= per_category:
            kept.append(item)
    return kept


def pair_draft_kind(pair: Path) -> str:
    manifest = pair / "manifest.json"
    return draft_kind(json.loads(manifest.read_text()) if manifest.is_file() else {})


def draft_scorer(kind: str, config: ScoreConfig, target):
    """A function from the target's answers to the draft's StepScore on them."""
    folder = config.pair / "draft"
    vocab = VocabMap.load(folder)
    if kind == "eagle":
        from dsd.backends.eagle_model import load_eagle

        eagle = load_eagle(folder, TORCH_DTYPES[config.draft_dtype])

        def score_feature_draft(answers) -> StepScore:
            with torch.inference_mode():
                (steps,) = eagle_draft.heldout_acceptance(
                    eagle, target, vocab, answers, config.gamma, config.temperature, config.top_p
                ).values()
            reached = [n > 0 for n in steps.positions]  # answers shorter than gamma reach no later step
            return StepScore(
                [a if r else 0.0 for a, r in zip(steps.sampled, reached)],
                [a if r else 0.0 for a, r in zip(steps.greedy, reached)],
                steps.positions,
            )

        return score_feature_draft
    draft = AutoModelForCausalLM.from_pretrained(str(folder), dtype=TORCH_DTYPES[config.draft_dtype]).eval()

    def score_layer_draft(answers) -> StepScore:
        sampled = chat_draft.heldout_acceptance(draft, target, vocab, answers, config.temperature, None, config.top_p)
        greedy = chat_draft.heldout_acceptance(draft, target, vocab, answers, 1.0, 1, 1.0)
        return StepScore([sampled.alpha_sampled], [greedy.alpha_greedy], [sampled.positions])

    return score_layer_draft


def pooled(scores: list[StepScore]) -> StepScore:
    """The score of the union of the answers, each step's mean weighted by its positions."""
    positions = [sum(s.positions[k] for s in scores) for k in range(len(scores[0].positions))]

    def mean(name: str, k: int) -> float:
        return sum(getattr(s, name)[k] * s.positions[k] for s in scores if s.positions[k]) / max(positions[k], 1)

    return StepScore(
        [mean("sampled", k) for k in range(len(positions))],
        [mean("greedy", k) for k in range(len(positions))],
        positions,
    )


def summary(score: StepScore, kind: str, gamma: int) -> dict:
    if kind != "eagle":
        return {
            "alpha_sampled": round(score.sampled[0], 4),
            "alpha_greedy": round(score.greedy[0], 4),
            "positions": score.positions[0],
        }
    return {
        "alpha_sampled": round(alpha_for_tokens_per_round(tokens_per_round_by_step(score.sampled), gamma), 4),
        "alpha_greedy": round(alpha_for_tokens_per_round(tokens_per_round_by_step(score.greedy), gamma), 4),
        "positions": score.positions[0],
        "alpha_sampled_by_step": [round(a, 4) for a in score.sampled],
        "alpha_greedy_by_step": [round(a, 4) for a in score.greedy],
        "tokens_per_round": round(tokens_per_round_by_step(score.sampled), 4),
    }


def category_table(record: dict) -> str:
    rows = [f"{'category':<16} {'answers':>7} {'positions':>9} {'alpha':>6} {'greedy':>6}"]
    for name, s in [*record.get("by_category", {}).items(), ("overall", record)]:
        rows.append(
            f"{name:<16} {s['answers']:>7} {s['positions']:>9} {s['alpha_sampled']:>6.3f} {s['alpha_greedy']:>6.3f}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, required=True, help="a built pair folder (target/, draft/)")
    parser.add_argument(
        "--prompts",
        type=Path,
        required=True,
        help='jsonl, one {"prompt": ...} per line, optionally with "turns" and "category"',
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=77)
    parser.add_argument("--gamma", type=int, default=4, help="a feature draft's block, scored step by step")
    parser.add_argument(
        "--dtype",
        choices=[AUTO, *TORCH_DTYPES],
        default=AUTO,
        help="'auto': the precision timed on this machine (dsd.backends.precision)",
    )
    parser.add_argument(
        "--per-category",
        type=int,
        default=0,
        help="score only the first N items of each category (a stratified sample)",
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not (args.pair / "target").is_dir() or not (args.pair / "draft").is_dir():
        parser.error(
            f"--pair {args.pair}: expected target/ and draft/ inside (for the shipped pair, "
            f"python -m pairs.build --family smollm2 --out {args.pair} --target-only)"
        )
    torch.set_num_threads(args.threads)
    backend = HfBackendConfig(str(args.pair.resolve()), dtype=args.dtype)
    dtypes = (backend.dtype, backend.draft_dtype)
    if not set(dtypes) <= set(TORCH_DTYPES):  # "auto" chooses among these two
        parser.error(
            f"--dtype {args.dtype}: resolved to {dtypes}, scoring runs in {sorted(TORCH_DTYPES)} (of {DTYPE_NAMES})"
        )
    try:
        config = ScoreConfig(
            args.pair,
            args.prompts,
            args.max_new_tokens,
            args.temperature,
            args.top_p,
            args.seed,
            *dtypes,
            gamma=args.gamma,
            per_category=args.per_category,
        )
    except ValueError as exc:  # named by its flag
        parser.error(re.sub(r"ScoreConfig\.(\w+)", lambda m: "--" + m[1].replace("_", "-"), str(exc)))
    record = score_pair(config)
    if "by_category" in record:
        print(category_table(record), file=sys.stderr, flush=True)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
