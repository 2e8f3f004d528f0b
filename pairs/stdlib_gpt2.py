"""The default pair (family stdlib-gpt2): a byte-level BPE tokenizer, a small GPT-2 target
pre-trained and a smaller GPT-2 draft distilled from it, all on the Python standard library's
own sources (pairs.corpus).

Phases: read the corpus, train the tokenizer, encode, pre-train the target, distil the draft,
measure their greedy agreement on held-out text, save both as Hugging Face folders, and write
manifest.json (file hashes, build parameters, versions, phase times, measured figures; see
dsd.pair_manifest). Fixed seeds and step counts make the weights the same on every build on the
same machine with the same thread count.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
import torch

from dsd.backends.machine import cpu_flags
from dsd.pair_manifest import MANIFEST_FORMAT, write_manifest
from dsd.provenance import git_commit
from pairs import corpus as corpus_mod
from pairs import train
from pairs.common import PhaseTimer, building, log, resolve_bf16, torch_settings, versions, warmup_steps

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
        positive = [
            "vocab_size",
            "target_layers",
            "target_d_model",
            "target_heads",
            "draft_layers",
            "draft_d_model",
            "draft_heads",
            "n_positions",
            "seq_len",
            "batch_size",
            "target_steps",
            "draft_steps",
            "eval_tokens",
            "threads",
            "train_chars",
        ]
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"PairBuildConfig.{name} must be a positive int, got {value!r}")
        for name in ["target_lr", "draft_lr", "distill_temperature"]:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"PairBuildConfig.{name} must be > 0, got {value!r}")
        for name, low, high in [
            ("heldout_pct", 0.0, 50.0),
            ("warmup_pct", 0.0, 100.0),
            ("distill_kl_weight", 0.0, 1.0),
        ]:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"PairBuildConfig.{name} must be in [{low}, {high}], got {value!r}")
        if self.heldout_pct == 0:
            raise ValueError("PairBuildConfig.heldout_pct must be > 0: agreement is measured on held-out text, got 0")
        for prefix in ["target", "draft"]:
            d_model, heads = getattr(self, f"{prefix}_d_model"), getattr(self, f"{prefix}_heads")
            if d_model % heads:
                raise ValueError(
                    f"PairBuildConfig.{prefix}_d_model={d_model} is not divisible by {prefix}_heads={heads}"
                )
        if self.seq_len > self.n_positions:
            raise ValueError(f"PairBuildConfig.seq_len={self.seq_len} exceeds n_positions={self.n_positions}")
        if self.vocab_size < 257:
            raise ValueError(f"PairBuildConfig.vocab_size must hold 256 bytes + EOS, got {self.vocab_size}")
        if self.draft_d_model > self.target_d_model:
            raise ValueError(
                f"PairBuildConfig.draft_d_model={self.draft_d_model} exceeds target_d_model={self.target_d_model}"
            )
        if self.draft_init not in ("pca", "random"):
            raise ValueError(f"PairBuildConfig.draft_init must be 'pca' or 'random', got {self.draft_init!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"PairBuildConfig.precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"PairBuildConfig.seed must be an int >= 0, got {self.seed!r}")


def quick_config(out_dir: Path, **overrides) -> PairBuildConfig:
    """The real pipeline at toy sizes, for tests: seconds instead of minutes."""
    fields = dict(
        out_dir=out_dir,
        train_chars=400_000,
        vocab_size=512,
        seq_len=64,
        batch_size=2,
        target_steps=3,
        draft_steps=3,
        eval_tokens=512,
    )
    return PairBuildConfig(**{**fields, **overrides})


def build_params(config: PairBuildConfig) -> dict:
    """Everything that decides the weights; the output folder and overwrite flag do not."""
    params = dataclasses.asdict(config)
    del params["out_dir"], params["overwrite"]
    return params


@dataclass(frozen=True)
class TrainingData:
    """The corpus as the models see it: the tokenizer and both token streams."""

    corpus: corpus_mod.Corpus
    tok: tokenizers.Tokenizer
    eos_id: int
    train_stream: np.ndarray
    heldout_stream: np.ndarray


@dataclass(frozen=True)
class TrainedPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    target_losses: list[float]
    draft_losses: list[float]
    agreement: float


# ---- the build ---------------------------------------------------------------------------------


def build_pair(config: PairBuildConfig) -> dict:
    """Run every phase and return the manifest (also written to config.out_dir)."""
    with building(config.out_dir, config.overwrite) as work_dir:
        timer, bf16 = PhaseTimer(), resolve_bf16(config.precision, cpu_flags())
        with torch_settings(config.threads):
            data = prepare_data(config, timer)
            pair = train_pair(config, data, bf16, timer)
            with timer.phase("save"):
                save_tokenizer(data.tok, work_dir, config.n_positions)
                pair.target.save_pretrained(work_dir / "target", safe_serialization=True)
                pair.draft.save_pretrained(work_dir / "draft", safe_serialization=True)
        return write_manifest(work_dir, pair_manifest(config, bf16, data, pair, timer))


def prepare_data(config: PairBuildConfig, timer: PhaseTimer) -> TrainingData:
    """Phases corpus, tokenizer and encode."""
    with timer.phase("corpus"):
        corpus = corpus_mod.read_corpus(corpus_mod.stdlib_dir(), config.heldout_pct)
        train_texts = corpus_mod.take_chars(corpus.train, config.train_chars, config.seed)
        heldout_texts = [d.text for d in corpus.heldout]
    with timer.phase("tokenizer"):
        tok = train.train_tokenizer(train_texts, config.vocab_size)
        if tok.get_vocab_size() != config.vocab_size:
            raise RuntimeError(
                f"tokenizer reached {tok.get_vocab_size()} tokens, not "
                f"vocab_size={config.vocab_size}: raise train_chars"
            )
        eos_id = tok.token_to_id(train.EOS_TOKEN)
    with timer.phase("encode"):
        train_stream = train.encode_stream(tok, train_texts, eos_id)
        # Only as much held-out text as the agreement needs, in sorted order.
        heldout_stream = train.encode_prefix(tok, heldout_texts, eos_id, config.eval_tokens)
        log(f"[encode] train {len(train_stream)} tokens, held-out {len(heldout_stream)} tokens")
    return TrainingData(corpus, tok, eos_id, train_stream, heldout_stream)


def train_pair(config: PairBuildConfig, data: TrainingData, bf16: bool, timer: PhaseTimer) -> TrainedPair:
    """Phases target, draft and eval."""
    seed = config.seed
    target_cfg = train.gpt2_config(
        config.vocab_size,
        config.target_layers,
        config.target_d_model,
        config.target_heads,
        config.n_positions,
        data.eos_id,
    )
    draft_cfg = train.gpt2_config(
        config.vocab_size,
        config.draft_layers,
        config.draft_d_model,
        config.draft_heads,
        config.n_positions,
        data.eos_id,
    )
    with timer.phase("target"):
        target = train.new_model(target_cfg, seed)
        target_losses = train.train_target(
            target,
            data.train_stream,
            np.random.default_rng(seed),
            config.target_steps,
            config.batch_size,
            config.seq_len,
            config.target_lr,
            warmup_steps(config.target_steps, config.warmup_pct),
            bf16,
            log,
        )
    with timer.phase("draft"):
        draft = train.new_model(draft_cfg, seed + 1)
        if config.draft_init == "pca":
            train.init_draft_from_target(draft, target)
        draft_losses = train.distill_draft(
            draft,
            target,
            data.train_stream,
            np.random.default_rng(seed + 1),
            config.draft_steps,
            config.batch_size,
            config.seq_len,
            config.draft_lr,
            warmup_steps(config.draft_steps, config.warmup_pct),
            config.distill_kl_weight,
            config.distill_temperature,
            bf16,
            log,
        )
    with timer.phase("eval"):
        agreement = train.greedy_agreement(draft, target, data.heldout_stream, config.eval_tokens, config.seq_len)
        log(f"[eval] greedy agreement {agreement:.4f}")
    return TrainedPair(target, draft, target_losses, draft_losses, agreement)


def pair_manifest(
    config: PairBuildConfig, bf16: bool, data: TrainingData, pair: TrainedPair, timer: PhaseTimer
) -> dict:
    """Everything but the file hashes, which write_manifest adds."""
    return {
        "format": MANIFEST_FORMAT,
        "family": "stdlib-gpt2",
        "build_params": build_params(config),
        "bf16_autocast": bf16,
        "corpus": data.corpus.description,
        "tokenizer": {
            "kind": "byte-level BPE",
            "vocab_size": data.tok.get_vocab_size(),
            "eos_token": train.EOS_TOKEN,
            "eos_token_id": data.eos_id,
        },
        "vocab_size": config.vocab_size,
        "eos_token_id": data.eos_id,
        "target": {"params": train.param_count(pair.target), "final_loss": round(pair.target_losses[-1], 4)},
        "draft": {"params": train.param_count(pair.draft), "final_loss": round(pair.draft_losses[-1], 4)},
        "heldout_tokens_scored": min(len(data.heldout_stream), config.eval_tokens),
        "greedy_agreement": round(pair.agreement, 4),
        "versions": versions(),
        "git_commit": git_commit(),
        **timer.manifest_fields(),
    }


def save_tokenizer(tok: tokenizers.Tokenizer, folder: Path, model_max_length: int) -> None:
    """tokenizer.json for PreTrainedTokenizerFast(tokenizer_file=...), tokenizer_config.json so
    that AutoTokenizer.from_pretrained(folder) also knows EOS. Written by hand, because
    save_pretrained under transformers 5 names a class that transformers 4 lacks."""
    tok.save(str(folder / "tokenizer.json"))
    eos = train.EOS_TOKEN
    tokenizer_config = {
        "tokenizer_class": TOKENIZER_CLASS,
        "bos_token": eos,
        "eos_token": eos,
        "unk_token": eos,
        "pad_token": eos,
        "add_bos_token": False,
        "add_eos_token": False,
        # The default clean-up deletes spaces before punctuation and breaks the round trip.
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
