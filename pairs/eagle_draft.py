"""Training the feature draft (dsd.backends.eagle_model) on the target's answers and features,
and its held-out acceptance.

Teacher: the target's distributions at every answer position (its kept top-k logits,
pairs.chat_data), with pairs.chat_draft's loss (KL + a little CE + the acceptance term at the
deployment's temperature). Rollouts (EAGLE-3's training-time test, HASS): step k of a position
reads the draft's own feature from step k - 1, so the draft learns to draft its k-th token of a
block as it will at run time; step k's loss is weighted step_decay ** k. A block starts at an
answer position (the first draft of a request follows the prompt), so step k counts only
positions at least k past the answer's start.

Held-out acceptance is teacher-forced as pairs.chat_draft.heldout_acceptance measures the layer
draft: the target reads the held-out answer, and at each answer position the draft proposes with
the true tokens; step k's acceptance is that of a block's (k+1)-th token when its first k were
accepted. The features go through the wire's packing (dsd.features) first.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from dsd.backends.eagle_model import EagleConfig, EagleDraft, load_eagle
from dsd.backends.vocab_map import VocabMap
from dsd.features import round_trip
from dsd.speculation.verification import probs_from_logits
from pairs.chat_data import ChatSample
from pairs.chat_draft import lr_at, position_loss
from pairs.common import log
from dsd.backends.feature_target import LayerTap
from pairs.eagle_features import FeatureSet, sequence


@dataclass(frozen=True)
class EagleTrainConfig:
    feature_layers: tuple[int, ...]
    vocab_keep: int = 12288
    epochs: float = 2.0
    batch_size: int = 16
    lr: float = 5e-4
    warmup_steps: int = 30
    kl_weight: float = 0.8
    tvd_weight: float = 4.0
    tvd_temperature: float = 0.7
    rollout_steps: int = 4  # draft tokens per block the training simulates
    step_decay: float = 0.8
    bf16: bool = True  # autocast the forward (fast on a CPU with AMX)
    seed: int = 1234
    checkpoint_every_s: float = 300.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        for name in ("vocab_keep", "batch_size", "warmup_steps", "rollout_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EagleTrainConfig.{name} must be a positive int, got {value!r}")
        for name in ("epochs", "lr", "tvd_temperature", "checkpoint_every_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"EagleTrainConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.kl_weight <= 1 or not self.tvd_weight >= 0 or not 0 < self.step_decay <= 1:
            raise ValueError(
                f"EagleTrainConfig: kl_weight in [0, 1], tvd_weight >= 0, step_decay in (0, 1]; "
                f"got {self.kl_weight!r}, {self.tvd_weight!r}, {self.step_decay!r}"
            )
        if not self.feature_layers:
            raise ValueError("EagleTrainConfig.feature_layers must name at least one target layer")


@torch.no_grad()
def new_eagle(target, feature_layers: tuple[int, ...], vocab: VocabMap) -> EagleDraft:
    """A draft whose layer starts as the identity on its feature (output projections zero: at
    the start of training the draft proposes what the target's feature at j - 1 says, measured
    a better start than the target's last layer whole); attention and MLP otherwise the target's
    last layer's, its head the target's final norm and tied embedding over the kept tokens
    (frozen), a fused draft's fuse reading only the top."""
    tc = target.config
    top = tc.num_hidden_layers - 1
    if feature_layers[-1] != top:
        raise ValueError(f"feature_layers must end with the top layer {top}, got {feature_layers}")
    config = EagleConfig(
        tc.hidden_size,
        tc.num_attention_heads,
        tc.num_key_value_heads,
        tc.hidden_size // tc.num_attention_heads,
        tc.intermediate_size,
        len(vocab.kept),
        feature_layers,
        float(tc.rms_norm_eps),
        float((tc.rope_parameters or {}).get("rope_theta", 10000.0)),
    )
    model = EagleDraft(config)
    layer = target.model.layers[top]
    d = config.hidden_size
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        getattr(model, name).weight.copy_(getattr(layer.self_attn, name).weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(model, name).weight.copy_(getattr(layer.mlp, name).weight)
    model.o_proj.weight.zero_()
    model.down_proj.weight.zero_()
    model.post_norm.weight.copy_(layer.post_attention_layernorm.weight)
    model.norm.weight.copy_(target.model.norm.weight)
    model.feat_norm.weight.copy_(target.model.norm.weight)
    eye = torch.eye(d)
    model.fc.weight.copy_(torch.cat([eye, eye], dim=1))
    if model.fuse is not None:
        model.fuse.weight.zero_()
        model.fuse.weight[:, -d:] = eye
    rows = target.model.embed_tokens.weight[vocab.kept_tensor]
    model.embed.weight.copy_(torch.cat([rows, rows.mean(0, keepdim=True)]))
    return freeze_head(model.float())


def continued_eagle(folder: Path, target, feature_layers: tuple[int, ...]) -> tuple[EagleDraft, VocabMap]:
    """A shipped feature draft (and its kept vocabulary) to train on: the same layers it was built
    for, at the target's width, its head frozen as new_eagle freezes it."""
    folder = Path(folder)
    model = load_eagle(folder)
    vocab = VocabMap.load(folder)
    if vocab is None:
        raise ValueError(f"{folder}: no vocab_map.json; a feature draft to continue keeps its kept vocabulary")
    if model.config.vocab_kept != len(vocab.kept):
        raise ValueError(
            f"{folder}: the draft's head has {model.config.vocab_kept} rows, its vocab_map.json "
            f"keeps {len(vocab.kept)} tokens"
        )
    if model.config.feature_layers != tuple(feature_layers):
        raise ValueError(
            f"{folder}: the draft reads target layers {model.config.feature_layers}, "
            f"the build asks for {tuple(feature_layers)}"
        )
    if model.config.hidden_size != target.config.hidden_size:
        raise ValueError(
            f"{folder}: a draft of width {model.config.hidden_size}, the target's is {target.config.hidden_size}"
        )
    return freeze_head(model), vocab


def freeze_head(model: EagleDraft) -> EagleDraft:
    """The tied embedding over the kept tokens and the final norm stay the target's."""
    model.embed.weight.requires_grad_(False)
    model.norm.weight.requires_grad_(False)
    return model


@dataclass(frozen=True)
class EagleBatch:
    token_ids: torch.Tensor  # [B, L] draft ids of x_j, j = 0..L-1
    layer_outputs: torch.Tensor  # [B, L, layers * d] the target's at j - 1 (zeros at j = 0)
    positions: torch.Tensor  # [B, L] j
    rows: torch.Tensor  # [N] batch row of each answer position
    cols: torch.Tensor  # [N] position whose output predicts it
    answer_start: torch.Tensor  # [N] index of its answer's first prediction (a block's earliest start)
    top_ids: torch.Tensor  # [N, k] draft ids of the target's top tokens
    top_logits: torch.Tensor  # [N, k]
    sampled: torch.Tensor  # [N] draft id of the token the target sampled


def make_batch(samples: list[ChatSample], features: list[torch.Tensor], to_draft: torch.Tensor) -> EagleBatch:
    """features: per sample [L, layers, d] (pairs.eagle_features.FeatureSet.of)."""
    seqs = [sequence(s) for s in samples]
    n = max(len(s) for s in seqs)
    width = features[0].shape[1] * features[0].shape[2]
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    outputs = torch.zeros(len(seqs), n, width, dtype=torch.bfloat16)
    rows, cols, starts = [], [], []
    for b, (s, seq, f) in enumerate(zip(samples, seqs, features)):
        L = len(seq)
        ids[b, :L] = to_draft[torch.tensor(seq)]
        outputs[b, 1:L] = f[: L - 1].reshape(L - 1, width)
        first = len(s.prompt_ids) - 1  # position P - 1 predicts answer[0]
        rows += [b] * len(s.answer_ids)
        cols += range(first, first + len(s.answer_ids))
        starts += [first] * len(s.answer_ids)
    positions = torch.arange(n).expand(len(seqs), n)
    top_ids = torch.from_numpy(np.concatenate([s.top_ids for s in samples])).long()
    top_logits = torch.from_numpy(np.concatenate([s.top_logits for s in samples])).float()
    sampled = torch.tensor([t for s in samples for t in s.answer_ids])
    return EagleBatch(
        ids,
        outputs,
        positions,
        torch.tensor(rows),
        torch.tensor(cols),
        torch.tensor(starts),
        to_draft[top_ids],
        top_logits,
        to_draft[sampled],
    )


def rollout_loss(
    model: EagleDraft, batch: EagleBatch, config: EagleTrainConfig, unknown_id: int
) -> tuple[torch.Tensor, list[float]]:
    """The weighted sum over rollout steps of pairs.chat_draft's loss; and each step's loss."""
    features = model.fuse_features(batch.layer_outputs.to(model.fc.weight.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        outputs = model.rollout(batch.token_ids, features, batch.positions, config.rollout_steps)
        total, per_step = 0.0, []
        for k, h in enumerate(outputs):
            valid = batch.cols - k >= batch.answer_start
            if not bool(valid.any()):
                break
            logits = model.logits(h[batch.rows[valid], batch.cols[valid]])  # [N_k, K]
            loss = position_loss(
                logits,
                batch.top_ids[valid],
                batch.top_logits[valid],
                batch.sampled[valid],
                unknown_id,
                config.kl_weight,
                config.tvd_weight,
                config.tvd_temperature,
            )
            total = total + config.step_decay**k * loss
            per_step.append(float(loss.detach()))
    return total, per_step


def train_eagle(
    model: EagleDraft,
    samples: list[ChatSample],
    feature_set: FeatureSet,
    indices: list[int],
    vocab: VocabMap,
    config: EagleTrainConfig,
    checkpoint: Path | None = None,
) -> list[float]:
    """Epochs over the training answers (``indices`` into samples and feature_set) in shuffled
    batches of similar length. With ``checkpoint``, the model, optimiser and step are kept there
    every checkpoint_every_s, and a run that finds one resumes from it."""
    rng = np.random.default_rng(config.seed)
    to_draft = vocab.to_draft()
    order = sorted(indices, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].answer_ids))
    batches = [order[i : i + config.batch_size] for i in range(0, len(order), config.batch_size)]
    epoch_orders = []
    steps = max(1, round(config.epochs * len(batches)))
    for _ in range(int(np.ceil(steps / len(batches)))):
        rng.shuffle(batches)
        epoch_orders += [list(b) for b in batches]
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses, start_step = _resume(checkpoint, model, opt, config)
    model.train()
    t0_s = last_save_s = time.perf_counter()
    for step in range(start_step, steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, config.lr, config.warmup_steps)
        group_ids = epoch_orders[step]
        batch = make_batch([samples[i] for i in group_ids], [feature_set.of(i) for i in group_ids], to_draft)
        loss, per_step = rollout_loss(model, batch, config, vocab.unknown_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 20 == 0 or step == steps - 1:
            log(
                f"[eagle] step {step + 1}/{steps} loss {losses[-1]:.3f} per step "
                f"{' '.join(f'{x:.3f}' for x in per_step)} elapsed {time.perf_counter() - t0_s:.0f}s"
            )
        if checkpoint is not None and time.perf_counter() - last_save_s > config.checkpoint_every_s:
            _save_checkpoint(checkpoint, model, opt, step + 1, losses, config)
            last_save_s = time.perf_counter()
    if checkpoint is not None:
        _save_checkpoint(checkpoint, model, opt, steps, losses, config)
    model.eval()
    return losses


def _save_checkpoint(path: Path, model, opt, step: int, losses: list[float], config: EagleTrainConfig) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "step": step,
            "losses": losses,
            "config": repr(asdict(config)),
        },
        temporary,
    )
    temporary.replace(path)
    log(f"[eagle] checkpoint at step {step}: {path}")


def _resume(path: Path | None, model, opt, config: EagleTrainConfig) -> tuple[list[float], int]:
    if path is None or not Path(path).is_file():
        return [], 0
    state = torch.load(path, weights_only=False)
    if state["config"] != repr(asdict(config)):
        raise ValueError(f"{path}: a checkpoint of another training configuration; delete it to start over")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    log(f"[eagle] resuming at step {state['step']} from {path}")
    return list(state["losses"]), int(state["step"])


@dataclass(frozen=True)
class StepAcceptance:
    sampled: list[float]  # step k: mean over positions of sum_x min(p, q)
    greedy: list[float]  # step k: share of positions where the argmaxes agree
    positions: list[int]
    feature_dtype: str = "bfloat16"
    block_sampled: float = field(init=False)  # the mean over a gamma = len(sampled) block's steps
    block_greedy: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_sampled", float(np.mean(self.sampled)))
        object.__setattr__(self, "block_greedy", float(np.mean(self.greedy)))


@torch.no_grad()
def heldout_acceptance(
    model: EagleDraft,
    target,
    vocab: VocabMap,
    samples: list[ChatSample],
    steps: int,
    temperature: float,
    top_p: float,
    feature_dtypes: tuple[str, ...] = ("bfloat16",),
) -> dict[str, StepAcceptance]:
    """Per feature dtype, each step's acceptance teacher-forced on held-out answers (the module's
    docstring): sampled at (temperature, top_p) and greedy, as pairs.chat_draft measures."""
    to_draft = vocab.to_draft()
    sums = {d: np.zeros((3, steps)) for d in feature_dtypes}  # sampled, greedy, count
    tap = LayerTap(target, model.config.feature_layers)
    dtype = model.fc.weight.dtype
    try:
        for s in samples:
            seq = sequence(s)
            first = len(s.prompt_ids) - 1  # position predicting answer[0]
            p_logits = target(input_ids=torch.tensor([seq])).logits[0, first:].float()  # [A, V]
            p = probs_from_logits(p_logits, temperature, None, top_p)
            p_top = p_logits.argmax(-1)
            layer_outputs = tap.stacked()[0, :-1].flatten(-2).to(dtype)  # [L-1, layers * d]
            true = torch.cat([torch.zeros(1, layer_outputs.shape[1], dtype=dtype), layer_outputs])
            true = model.fuse_features(true).float()  # [L, d]: f_{j-1}, zeros at 0
            ids = to_draft[torch.tensor(seq)][None]
            positions = torch.arange(len(seq))[None]
            for feature_dtype in feature_dtypes:
                features = round_trip(true, feature_dtype).to(dtype)[None]
                outputs = model.rollout(ids, features, positions, steps)
                for k, h in enumerate(outputs):
                    cols = torch.arange(first + k, first + len(s.answer_ids))
                    if not len(cols):
                        break
                    q_logits = vocab.full_logits(model.logits(h[0, cols]).float())  # [n, V]
                    q = probs_from_logits(q_logits, temperature, None, top_p)
                    answer = cols - first
                    sums[feature_dtype][0, k] += float(torch.minimum(p[answer], q).sum())
                    sums[feature_dtype][1, k] += int((q_logits.argmax(-1) == p_top[answer]).sum())
                    sums[feature_dtype][2, k] += len(cols)
    finally:
        tap.close()
    return {d: StepAcceptance(list(v[0] / v[2]), list(v[1] / v[2]), [int(x) for x in v[2]], d) for d, v in sums.items()}
