"""Build a draft/target model pair, reproducibly, from text on every machine.

    python -m pairs.build --out models/default-pair [--quick] [--force]
    python -m pairs.build --family smollm2 --out models/smollm2-chat [--target-only]
        (the main job's pair: a pretrained chat target and a draft distilled on its own
        answers; see pairs.smollm2)
    python -m pairs.build --family smollm2-eagle --out models/smollm2-eagle [--target-only]
        (the same target and a one-layer feature draft; see pairs.smollm2_eagle)

The default family (stdlib-gpt2, pairs.stdlib_gpt2) trains a byte-level BPE tokenizer, a small
GPT-2 target and a smaller distilled GPT-2 draft on the Python standard library's own sources.
Fixed seeds and step counts make the weights the same on every build on the same machine with
the same thread count. Progress goes to stderr; the last stdout line is key=value pairs.

Folder layout (dsd.pair_manifest.verify_pair checks it before anyone loads it):

    tokenizer.json, tokenizer_config.json   shared by both models
    target/, draft/                         save_pretrained folders (config, safetensors)
    manifest.json
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from pairs import smollm2, smollm2_eagle, stdlib_gpt2

FAMILY_CHOICES = ("stdlib-gpt2", "smollm2", "smollm2-eagle")  # pairs.stdlib_gpt2, pairs.smollm2, ...


def make_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a misspelt option must fail, not match a longer one by prefix.
    parser = argparse.ArgumentParser(
        prog="python -m pairs.build",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--family", choices=FAMILY_CHOICES, default="stdlib-gpt2")
    parser.add_argument("--quick", action="store_true", help="toy sizes, seconds (tests)")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--target-steps", type=int, help="stdlib-gpt2 only")
    parser.add_argument("--draft-steps", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], help="stdlib-gpt2 only")
    parser.add_argument("--epochs", type=float, help="smollm2 only")
    parser.add_argument("--draft-layers", type=int, help="smollm2 only")
    parser.add_argument("--vocab-keep", type=int, help="smollm2 only")
    parser.add_argument(
        "--tvd-weight", type=float, help="smollm2 only: weight of the acceptance term in the draft's loss (0: off)"
    )
    parser.add_argument(
        "--data-rounds", type=int, help="smollm2 only: answer every training prompt this often, a new seed each"
    )
    parser.add_argument("--data-cache", type=Path, help="smollm2 only: keep the target's answers here")
    parser.add_argument(
        "--prompts",
        type=Path,
        help="smollm2 only: the training instructions (default workloads/train_instructions.jsonl)",
    )
    parser.add_argument("--samples-per-prompt", type=int, help="smollm2 only: answers to each instruction a round")
    parser.add_argument(
        "--feature-layers",
        type=int,
        nargs="+",
        help="smollm2-eagle only: the target layers the draft reads (fused when several)",
    )
    parser.add_argument(
        "--answer-batches",
        type=str,
        help="smollm2-eagle only: answer only these batches of the first round, e.g. 0-9,19-23",
    )
    parser.add_argument(
        "--rollout-steps", type=int, help="smollm2-eagle only: draft steps per block the training simulates"
    )
    parser.add_argument(
        "--init-draft",
        type=Path,
        help="train on from this draft folder (models/smollm2-eagle/draft for smollm2-eagle, "
        "models/smollm2-chat/draft for smollm2), keeping its vocabulary",
    )
    parser.add_argument(
        "--target-only",
        action="store_true",
        help="smollm2 only: write target/ into a shipped pair folder and verify it",
    )
    return parser


def parse_args(argv: list[str] | None):
    """-> PairBuildConfig, Smollm2PairConfig for --family smollm2, EaglePairConfig for
    --family smollm2-eagle (TargetOnly with --target-only)."""
    parser = make_parser()
    args = parser.parse_args(argv)
    overrides = _given(
        seed=args.seed,
        target_steps=args.target_steps,
        draft_steps=args.draft_steps,
        threads=args.threads,
        precision=args.precision,
    )
    overrides["overwrite"] = args.force
    smollm2_only = _given(
        epochs=args.epochs,
        draft_layers=args.draft_layers,
        vocab_keep=args.vocab_keep,
        tvd_weight=args.tvd_weight,
        data_rounds=args.data_rounds,
        data_cache=args.data_cache,
        prompts_path=args.prompts,
        samples_per_prompt=args.samples_per_prompt,
        init_draft=args.init_draft,
    )
    eagle_only = _given(
        feature_layers=args.feature_layers,
        rollout_steps=args.rollout_steps,
        answer_batches=_ranges(parser, args.answer_batches),
    )
    if eagle_only and args.family != "smollm2-eagle":
        parser.error(f"--{_flag(sorted(eagle_only)[0])} applies to --family smollm2-eagle only")
    if args.family == "smollm2-eagle":
        for name in ("target_steps", "precision", "draft_steps", "draft_layers"):
            if name in overrides or name in smollm2_only:
                parser.error(f"--{_flag(name)} does not apply to --family smollm2-eagle")
        overrides.update(smollm2_only, **eagle_only)
        if args.target_only:
            return TargetOnly(args.out)
        if args.quick:
            return smollm2_eagle.quick_config(args.out, **overrides)
        return smollm2_eagle.EaglePairConfig(out_dir=args.out, **overrides)
    if args.family == "smollm2":
        for name in ("target_steps", "precision", "draft_steps"):
            if name in overrides:
                parser.error(f"--{_flag(name)} does not apply to --family smollm2")
        overrides.update(smollm2_only)
        if args.target_only:
            return TargetOnly(args.out)
        if args.quick:
            return smollm2.quick_config(args.out, **overrides)
        return smollm2.Smollm2PairConfig(out_dir=args.out, **overrides)
    if smollm2_only or args.target_only:
        parser.error(f"--{_flag(sorted(smollm2_only or ['target_only'])[0])} applies to --family smollm2 only")
    if args.quick:
        return stdlib_gpt2.quick_config(args.out, **overrides)
    return stdlib_gpt2.PairBuildConfig(out_dir=args.out, **overrides)


def _given(**options) -> dict:
    """The options given on the command line (an absent one is None: its config default holds)."""
    return {name: value for name, value in options.items() if value is not None}


def _flag(field: str) -> str:
    """A config field's command-line option: prompts_path -> prompts, data_rounds -> data-rounds."""
    return {"prompts_path": "prompts"}.get(field, field).replace("_", "-")


def _ranges(parser, text: str | None) -> tuple[int, ...] | None:
    """ "0-9,19-23" -> (0, ..., 9, 19, ..., 23)."""
    if text is None:
        return None
    try:
        numbers = []
        for part in text.split(","):
            low, _, high = part.partition("-")
            numbers += range(int(low), int(high or low) + 1)
        return tuple(numbers)
    except ValueError:
        parser.error(f"--answer-batches: expected ranges such as 0-9,19-23, got {text!r}")


@dataclass(frozen=True)
class TargetOnly:
    out_dir: Path


def summary_line(manifest: dict, out_dir: Path) -> str:
    agreement = manifest["heldout_alpha"]["greedy"] if "heldout_alpha" in manifest else manifest["greedy_agreement"]
    fields = {
        "agreement": f"{agreement:.4f}",
        "build_s": f"{manifest['build_s']:.1f}",
        **{f"{k}_s": f"{v:.1f}" for k, v in manifest["phases_s"].items()},
        "target_params": manifest["target"]["params"],
        "draft_params": manifest["draft"]["params"],
        "bytes": sum(f["bytes"] for f in manifest["files"].values()),
        "out": out_dir,
    }
    return " ".join(f"{k}={v}" for k, v in fields.items())


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if isinstance(config, TargetOnly):
        manifest = smollm2.materialize_target(config.out_dir)
        print(f"target=ok files={len(manifest['files'])} out={config.out_dir}", flush=True)
        return 0
    if isinstance(config, smollm2.Smollm2PairConfig):
        manifest = smollm2.build_smollm2_pair(config)
    elif isinstance(config, smollm2_eagle.EaglePairConfig):
        manifest = smollm2_eagle.build_eagle_pair(config)
    else:
        manifest = stdlib_gpt2.build_pair(config)
    print(summary_line(manifest, config.out_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
