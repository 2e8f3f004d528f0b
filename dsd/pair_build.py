"""Build the project's default offline draft/target pair, reproducibly, from text on every machine.

    python -m dsd.pair_build --out models/default-pair [--quick] [--force]
    python -m dsd.pair_build --family smollm2 --out ~/.cache/dsd-testbed/smollm2-pair  (optional,
        a pretrained target; see dsd.pair_smollm2)

Phases: read the corpus (dsd.corpus), train a byte-level BPE tokenizer, pre-train a small GPT-2
target, distil a smaller GPT-2 draft from it, measure their greedy agreement on held-out text,
save both as Hugging Face folders, and write manifest.json (file hashes, build parameters,
versions, phase times, measured figures). Fixed seeds and step counts make the weights the same
on every build on the same machine with the same thread count. Progress goes to stderr; the last
stdout line is key=value pairs.

Folder layout (`verify_pair` checks it before anyone loads it):

    tokenizer.json, tokenizer_config.json   shared by both models
    target/, draft/                         save_pretrained folders (config, safetensors)
    manifest.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# Before transformers is imported (huggingface_hub reads it once): nothing here may reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from dsd import corpus as corpus_mod  # noqa: E402
from dsd import pair_train  # noqa: E402

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "dsd-pair/1"
TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # the name every transformers version resolves


@dataclass(frozen=True)
class PairBuildConfig:
    out_dir: Path
    seed: int = 1234
    heldout_pct: float = 5.0  # share of stdlib files kept out of training, by path hash
    train_chars: int = 12_000_000  # seeded sample of training files to tokenize and train on
    vocab_size: int = 4096
    target_layers: int = 4
    target_d_model: int = 256
    target_heads: int = 4
    draft_layers: int = 1
    draft_d_model: int = 128
    draft_heads: int = 2
    n_positions: int = 1024
    # NOTE: positions >= seq_len keep their random init: past 512 tokens of context the pair's
    # predictions degrade (still deterministic, so exactness tests are unaffected).
    seq_len: int = 512
    batch_size: int = 4
    target_steps: int = 240
    target_lr: float = 3e-3
    draft_steps: int = 100
    draft_lr: float = 5e-3
    warmup_pct: float = 10.0
    draft_init: str = "pca"  # "pca": embeddings projected from the target's; or "random"
    distill_kl_weight: float = 0.9  # the rest of the loss is next-token cross-entropy
    distill_temperature: float = 1.0
    eval_tokens: int = 16_384  # held-out positions scored for greedy agreement
    threads: int = 2
    precision: str = "auto"  # "auto": bf16 autocast only where the CPU has AMX
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        positive = ["vocab_size", "target_layers", "target_d_model", "target_heads",
                    "draft_layers", "draft_d_model", "draft_heads", "n_positions", "seq_len",
                    "batch_size", "target_steps", "draft_steps", "eval_tokens", "threads",
                    "train_chars"]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"PairBuildConfig.{name} must be a positive int, got {value!r}")
        for name in ["target_lr", "draft_lr", "distill_temperature"]:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"PairBuildConfig.{name} must be > 0, got {value!r}")
        for name, low, high in [("heldout_pct", 0.0, 50.0), ("warmup_pct", 0.0, 100.0),
                                ("distill_kl_weight", 0.0, 1.0)]:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"PairBuildConfig.{name} must be in [{low}, {high}], "
                                 f"got {value!r}")
        if self.heldout_pct == 0:
            raise ValueError("PairBuildConfig.heldout_pct must be > 0: agreement is measured "
                             "on held-out text, got 0")
        for prefix in ["target", "draft"]:
            d_model, heads = getattr(self, f"{prefix}_d_model"), getattr(self, f"{prefix}_heads")
            if d_model % heads:
                raise ValueError(f"PairBuildConfig.{prefix}_d_model={d_model} is not divisible "
                                 f"by {prefix}_heads={heads}")
        if self.seq_len > self.n_positions:
            raise ValueError(f"PairBuildConfig.seq_len={self.seq_len} exceeds "
                             f"n_positions={self.n_positions}")
        if self.vocab_size < 257:
            raise ValueError(f"PairBuildConfig.vocab_size must hold 256 bytes + EOS, "
                             f"got {self.vocab_size}")
        if self.draft_d_model > self.target_d_model:
            raise ValueError(f"PairBuildConfig.draft_d_model={self.draft_d_model} exceeds "
                             f"target_d_model={self.target_d_model}")
        if self.draft_init not in ("pca", "random"):
            raise ValueError(f"PairBuildConfig.draft_init must be 'pca' or 'random', "
                             f"got {self.draft_init!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"PairBuildConfig.precision must be 'auto', 'fp32' or 'bf16', "
                             f"got {self.precision!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"PairBuildConfig.seed must be an int >= 0, got {self.seed!r}")


def quick_config(out_dir: Path, **overrides) -> PairBuildConfig:
    """The real pipeline at toy sizes, for tests: seconds instead of minutes."""
    fields = dict(out_dir=out_dir, train_chars=400_000, vocab_size=512, seq_len=64,
                  batch_size=2, target_steps=3, draft_steps=3, eval_tokens=512)
    return PairBuildConfig(**{**fields, **overrides})


def build_params(config: PairBuildConfig) -> dict:
    """Everything that decides the weights; the output folder and overwrite flag do not."""
    params = dataclasses.asdict(config)
    del params["out_dir"], params["overwrite"]
    return params


# ---- edges: clocks, CPU flags, versions, files -------------------------------------------------

def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def resolve_bf16(precision: str, flags: set[str]) -> bool:
    # Without AMX (or at least AVX512-BF16) bf16 matmuls are emulated: 20-40x slower here.
    return precision == "bf16" or (precision == "auto" and "amx_bf16" in flags)


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_tree(folder: Path) -> dict[str, dict]:
    """Every file under folder except the manifest, by POSIX relative path."""
    return {
        p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST
    }


@contextlib.contextmanager
def torch_settings(threads: int) -> Iterator[None]:
    """Deterministic kernels and a fixed thread count for the build, restored afterwards (the
    caller may be a test process with its own settings)."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


class PhaseTimer:
    """Wall time per phase, and this process's CPU time beside it: on a shared machine a wall
    time well above cpu_s / threads means the build was waiting for other work."""

    def __init__(self) -> None:
        self.t0_s = time.perf_counter()
        self.phases_s: dict[str, float] = {}
        self.phases_cpu_s: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start_s, start_cpu_s = time.perf_counter(), time.process_time()
        log(f"[{name}] start, elapsed {start_s - self.t0_s:.1f}s")
        yield
        self.phases_s[name] = round(time.perf_counter() - start_s, 3)
        self.phases_cpu_s[name] = round(time.process_time() - start_cpu_s, 3)
        log(f"[{name}] done in {self.phases_s[name]:.1f}s (cpu {self.phases_cpu_s[name]:.1f}s)")

    def total_s(self) -> float:
        return round(time.perf_counter() - self.t0_s, 3)


# ---- saving and checking -----------------------------------------------------------------------

def save_tokenizer(tok: tokenizers.Tokenizer, folder: Path, model_max_length: int) -> None:
    """tokenizer.json for PreTrainedTokenizerFast(tokenizer_file=...), tokenizer_config.json so
    that AutoTokenizer.from_pretrained(folder) also knows EOS. Written by hand, because
    save_pretrained under transformers 5 names a class that transformers 4 lacks."""
    tok.save(str(folder / "tokenizer.json"))
    eos = pair_train.EOS_TOKEN
    tokenizer_config = {
        "tokenizer_class": TOKENIZER_CLASS,
        "bos_token": eos, "eos_token": eos, "unk_token": eos, "pad_token": eos,
        "add_bos_token": False, "add_eos_token": False,
        # The default clean-up deletes spaces before punctuation and breaks the round trip.
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def write_manifest(folder: Path, manifest: dict) -> dict:
    manifest = {**manifest, "files": hash_tree(folder)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


class PairIntegrityError(RuntimeError):
    """The pair folder differs from what its manifest recorded."""


def verify_pair(folder: Path | str) -> dict:
    """Re-hash every file the manifest lists; raise PairIntegrityError naming each missing,
    changed or unlisted file. Returns the manifest."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise PairIntegrityError(f"{manifest_path}: missing; not a built pair folder")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise PairIntegrityError(f"{manifest_path}: format {manifest.get('format')!r}, "
                                 f"expected {MANIFEST_FORMAT!r}")
    expected, problems = manifest["files"], []
    actual = {p.relative_to(folder).as_posix() for p in folder.rglob("*")
              if p.is_file() and p.name != MANIFEST}
    for relpath, entry in sorted(expected.items()):
        path = folder / relpath
        if not path.is_file():
            problems.append(f"missing: {relpath}")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"sha256 mismatch: {relpath}")
    # An unlisted file may change what from_pretrained loads (e.g. a stray weights index).
    problems += [f"not in manifest: {p}" for p in sorted(actual - set(expected))]
    if problems:
        raise PairIntegrityError(f"{folder}: " + "; ".join(problems))
    return manifest


def load_pair(folder: Path | str):
    """verify_pair, then (tokenizer, target, draft, manifest), both models in eval mode."""
    folder = Path(folder)
    manifest = verify_pair(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    target = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "target")).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "draft")).eval()
    return tokenizer, target, draft, manifest


# ---- the build ---------------------------------------------------------------------------------

def prepare_out_dir(out_dir: Path, overwrite: bool) -> Path:
    """Build into a sibling work folder and rename at the end: a crash never leaves a half pair
    under the real name."""
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass --force to replace it")
    work_dir = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    return work_dir


def finish_out_dir(work_dir: Path, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    work_dir.rename(out_dir)


def build_pair(config: PairBuildConfig) -> dict:
    """Run every phase and return the manifest (also written to config.out_dir)."""
    out_dir = config.out_dir
    work_dir = prepare_out_dir(out_dir, config.overwrite)
    timer, seed = PhaseTimer(), config.seed
    bf16 = resolve_bf16(config.precision, cpu_flags())
    try:
        with torch_settings(config.threads):
            with timer.phase("corpus"):
                corpus = corpus_mod.read_corpus(corpus_mod.stdlib_dir(), config.heldout_pct)
                train_texts = corpus_mod.take_chars(corpus.train, config.train_chars, seed)
                heldout_texts = [d.text for d in corpus.heldout]
            with timer.phase("tokenizer"):
                tok = pair_train.train_tokenizer(train_texts, config.vocab_size)
                if tok.get_vocab_size() != config.vocab_size:
                    raise RuntimeError(f"tokenizer reached {tok.get_vocab_size()} tokens, not "
                                       f"vocab_size={config.vocab_size}: raise train_chars")
                eos_id = tok.token_to_id(pair_train.EOS_TOKEN)
            with timer.phase("encode"):
                train_stream = pair_train.encode_stream(tok, train_texts, eos_id)
                # Only as much held-out text as the agreement needs, in sorted order.
                heldout_stream = pair_train.encode_prefix(tok, heldout_texts, eos_id,
                                                          config.eval_tokens)
                log(f"[encode] train {len(train_stream)} tokens, "
                    f"held-out {len(heldout_stream)} tokens")
            target_cfg = pair_train.gpt2_config(config.vocab_size, config.target_layers,
                                                config.target_d_model, config.target_heads,
                                                config.n_positions, eos_id)
            draft_cfg = pair_train.gpt2_config(config.vocab_size, config.draft_layers,
                                               config.draft_d_model, config.draft_heads,
                                               config.n_positions, eos_id)
            with timer.phase("target"):
                target = pair_train.new_model(target_cfg, seed)
                target_losses = pair_train.train_target(
                    target, train_stream, np.random.default_rng(seed), config.target_steps,
                    config.batch_size, config.seq_len, config.target_lr,
                    warmup_steps(config.target_steps, config.warmup_pct), bf16, log)
            with timer.phase("draft"):
                draft = pair_train.new_model(draft_cfg, seed + 1)
                if config.draft_init == "pca":
                    pair_train.init_draft_from_target(draft, target)
                draft_losses = pair_train.distill_draft(
                    draft, target, train_stream, np.random.default_rng(seed + 1),
                    config.draft_steps, config.batch_size, config.seq_len, config.draft_lr,
                    warmup_steps(config.draft_steps, config.warmup_pct),
                    config.distill_kl_weight, config.distill_temperature, bf16, log)
            with timer.phase("eval"):
                agreement = pair_train.greedy_agreement(draft, target, heldout_stream,
                                                        config.eval_tokens, config.seq_len)
                log(f"[eval] greedy agreement {agreement:.4f}")
            with timer.phase("save"):
                save_tokenizer(tok, work_dir, config.n_positions)
                target.save_pretrained(work_dir / "target", safe_serialization=True)
                draft.save_pretrained(work_dir / "draft", safe_serialization=True)
        manifest = {
            "format": MANIFEST_FORMAT,
            "family": "stdlib-gpt2",
            "build_params": build_params(config),
            "bf16_autocast": bf16,
            "corpus": corpus.description,
            "tokenizer": {"kind": "byte-level BPE", "vocab_size": tok.get_vocab_size(),
                          "eos_token": pair_train.EOS_TOKEN, "eos_token_id": eos_id},
            "vocab_size": config.vocab_size,
            "eos_token_id": eos_id,
            "target": {"params": pair_train.param_count(target),
                       "final_loss": round(target_losses[-1], 4)},
            "draft": {"params": pair_train.param_count(draft),
                      "final_loss": round(draft_losses[-1], 4)},
            "heldout_tokens_scored": min(len(heldout_stream), config.eval_tokens),
            "greedy_agreement": round(agreement, 4),
            "versions": versions(),
            "git_commit": git_commit(),
            "phases_s": timer.phases_s,
            "phases_cpu_s": timer.phases_cpu_s,
            "build_s": timer.total_s(),
        }
        manifest = write_manifest(work_dir, manifest)
        finish_out_dir(work_dir, out_dir)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise
    return manifest


def warmup_steps(steps: int, warmup_pct: float) -> int:
    return max(1, round(steps * warmup_pct / 100))


# ---- command line ------------------------------------------------------------------------------

def parse_args(argv: list[str] | None):
    """-> PairBuildConfig, or Smollm2PairConfig for --family smollm2."""
    # allow_abbrev=False: a misspelt option must fail, not match a longer one by prefix.
    parser = argparse.ArgumentParser(prog="python -m dsd.pair_build", description=__doc__,
                                     allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--family", choices=["stdlib-gpt2", "smollm2"], default="stdlib-gpt2")
    parser.add_argument("--quick", action="store_true", help="toy sizes, seconds (tests)")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--target-steps", type=int, help="stdlib-gpt2 only")
    parser.add_argument("--draft-steps", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16"], help="stdlib-gpt2 only")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in [("seed", args.seed), ("target_steps", args.target_steps),
                                   ("draft_steps", args.draft_steps), ("threads", args.threads),
                                   ("precision", args.precision)] if v is not None}
    overrides["overwrite"] = args.force
    if args.family == "smollm2":
        from dsd import pair_smollm2  # imports this module: only when asked for
        for name in ("target_steps", "precision"):
            if name in overrides:
                parser.error(f"--{name.replace('_', '-')} does not apply to --family smollm2")
        if args.quick:
            return pair_smollm2.quick_config(args.out, **overrides)
        return pair_smollm2.Smollm2PairConfig(out_dir=args.out, **overrides)
    if args.quick:
        return quick_config(args.out, **overrides)
    return PairBuildConfig(out_dir=args.out, **overrides)


def summary_line(manifest: dict, out_dir: Path) -> str:
    fields = {
        "agreement": f"{manifest['greedy_agreement']:.4f}",
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
    if isinstance(config, PairBuildConfig):
        manifest = build_pair(config)
    else:
        from dsd import pair_smollm2
        manifest = pair_smollm2.build_smollm2_pair(config)
    print(summary_line(manifest, config.out_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
