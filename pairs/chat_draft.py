"""A draft for a pretrained chat target: the target's first layers under a head over the
tokens the target actually writes, distilled on the target's own chat answers (pairs.chat_data).

Most of a small LM's decode step is its vocabulary head (SmolLM2: 49152 x 576). The draft keeps
only the `vocab_keep` tokens most frequent in the target's answers; every other token maps to one
shared "unknown" input row and is never proposed. Its logits for those tokens are -inf (the
backend fills them in, dsd/backends/torch_lm.py), so speculative sampling stays exact: the
target's residual covers whatever the draft cannot propose.

Loss on each answer position: KL(target || draft) over the target's kept top-k logits (the part of
them inside the draft's vocabulary, renormalised) plus a little cross-entropy on the token the
target sampled, plus the acceptance term: the total-variation distance between the two
distributions at the deployment's temperature, 1 - sum_x min(p_T(x), q_T(x)), which is one minus
the probability that speculative sampling accepts the draft's token (the quantity the draft is
for; DistillSpec, Zhou et al. 2024, distil with it).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from dsd.backends.vocab_map import VocabMap
from pairs.chat_data import ChatSample
from pairs.common import log


@dataclass(frozen=True)
class ChatDraftConfig:
    layers: int = 6  # the target's first layers
    vocab_keep: int = 8192  # tokens the draft can propose
    epochs: float = 4.0
    batch_size: int = 16
    lr: float = 3e-4
    warmup_steps: int = 20
    kl_weight: float = 0.8
    tvd_weight: float = 0.0  # of the acceptance term, added to the KL + CE mix
    tvd_temperature: float = 0.7
    seed: int = 1234

    def __post_init__(self) -> None:
        for name in ["layers", "vocab_keep", "batch_size", "warmup_steps"]:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ChatDraftConfig.{name} must be a positive int, got {value!r}")
        if not self.epochs > 0 or not self.lr > 0:
            raise ValueError(f"ChatDraftConfig: epochs and lr must be > 0, got {self.epochs!r}, {self.lr!r}")
        if not 0 <= self.kl_weight <= 1:
            raise ValueError(f"ChatDraftConfig.kl_weight must be in [0, 1], got {self.kl_weight!r}")
        if not self.tvd_weight >= 0 or not self.tvd_temperature > 0:
            raise ValueError(
                f"ChatDraftConfig: tvd_weight must be >= 0 and tvd_temperature > 0, "
                f"got {self.tvd_weight!r}, {self.tvd_temperature!r}"
            )


def frequent_tokens(samples: list[ChatSample], keep: int, always: list[int]) -> list[int]:
    """The `keep` tokens most frequent in the answers (the target's top-k candidates count too,
    at a tenth), `always` first; ties broken by id so the choice is deterministic."""
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(s.answer_ids)
        counts.update({int(t): 0.1 for t in s.top_ids[:, :8].ravel()})
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    kept = list(dict.fromkeys(always + ranked))[:keep]
    return sorted(kept)


@torch.no_grad()
def new_draft(
    target: transformers.PreTrainedModel, config: ChatDraftConfig, vocab: VocabMap
) -> transformers.PreTrainedModel:
    """The target's first `layers` layers and final norm; tied embeddings over the kept tokens
    (the target's rows) plus one unknown row (their mean)."""
    cfg = target.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("layer_types", None)
    cfg.update(num_hidden_layers=config.layers, vocab_size=len(vocab.kept) + 1, tie_word_embeddings=True)
    draft = type(target)(type(target.config).from_dict(cfg))
    source = target.state_dict()
    for key, value in draft.state_dict().items():
        if key.startswith("model.layers.") or key == "model.norm.weight":
            value.copy_(source[key])
    rows = target.model.embed_tokens.weight[torch.tensor(vocab.kept)]
    draft.model.embed_tokens.weight.copy_(torch.cat([rows, rows.mean(0, keepdim=True)]))
    draft.tie_weights()
    return draft


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # [B, L] draft ids, right-padded
    attention: torch.Tensor  # [B, L]
    rows: torch.Tensor  # [N] batch row of each answer position
    cols: torch.Tensor  # [N] column whose logits predict it
    top_ids: torch.Tensor  # [N, k] draft ids of the target's top tokens (unknown = dropped)
    top_logits: torch.Tensor  # [N, k] their logits
    sampled: torch.Tensor  # [N] draft id of the token the target sampled


def make_batch(samples: list[ChatSample], to_draft: torch.Tensor) -> Batch:
    seqs = [s.prompt_ids + s.answer_ids[:-1] for s in samples]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention = torch.zeros(len(seqs), width, dtype=torch.long)
    rows, cols = [], []
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        ids[i, : len(seq)] = to_draft[torch.tensor(seq)]
        attention[i, : len(seq)] = 1
        first = len(s.prompt_ids) - 1
        rows += [i] * len(s.answer_ids)
        cols += range(first, first + len(s.answer_ids))
    top_ids = torch.from_numpy(np.concatenate([s.top_ids for s in samples])).long()
    top_logits = torch.from_numpy(np.concatenate([s.top_logits for s in samples])).float()
    sampled = torch.tensor([t for s in samples for t in s.answer_ids])
    return Batch(
        ids, attention, torch.tensor(rows), torch.tensor(cols), to_draft[top_ids], top_logits, to_draft[sampled]
    )


def distill_loss(
    logits: torch.Tensor,
    batch: Batch,
    unknown_id: int,
    kl_weight: float,
    tvd_weight: float = 0.0,
    tvd_temperature: float = 1.0,
) -> torch.Tensor:
    """logits: [B, L, K+1] -> kl_weight * KL over the target's in-vocabulary top tokens
    + (1 - kl_weight) * CE on the sampled token + tvd_weight * (1 - acceptance at tvd_temperature)."""
    return position_loss(
        logits[batch.rows, batch.cols, :unknown_id],
        batch.top_ids,
        batch.top_logits,
        batch.sampled,
        unknown_id,
        kl_weight,
        tvd_weight,
        tvd_temperature,
    )


def position_loss(
    picked: torch.Tensor,
    top_ids: torch.Tensor,
    top_logits: torch.Tensor,
    sampled: torch.Tensor,
    unknown_id: int,
    kl_weight: float,
    tvd_weight: float = 0.0,
    tvd_temperature: float = 1.0,
) -> torch.Tensor:
    """distill_loss on the answer positions' draft logits alone: picked [N, K]; top_ids [N, k]
    (draft ids), top_logits [N, k], sampled [N] as in Batch."""
    # a position none of whose top tokens the draft's vocabulary keeps gives p no support: left out
    representable = (top_ids != unknown_id).any(-1)  # [N]
    picked, top_ids, top_logits, sampled = (t[representable] for t in (picked, top_ids, top_logits, sampled))
    picked = picked.float()
    if not len(picked):
        return picked.sum()
    log_q = F.log_softmax(picked, dim=-1)  # [N, K]
    known = top_ids != unknown_id  # [N, k]
    log_p = F.log_softmax(top_logits.masked_fill(~known, float("-inf")), dim=-1)
    p = log_p.exp()
    safe_ids = top_ids.clamp(max=unknown_id - 1)
    kl = (p * (log_p.masked_fill(~known, 0.0) - log_q.gather(1, safe_ids))).sum(-1).mean()
    sampled_known = sampled != unknown_id
    ce = F.nll_loss(log_q[sampled_known], sampled[sampled_known]) if bool(sampled_known.any()) else log_q.sum() * 0
    loss = kl_weight * kl + (1 - kl_weight) * ce
    if tvd_weight > 0:
        loss = loss + tvd_weight * (1 - acceptance(picked, top_logits, safe_ids, known, tvd_temperature)).mean()
    return loss


def acceptance(
    draft_logits: torch.Tensor, top_logits: torch.Tensor, top_ids: torch.Tensor, known: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[N] sum_x min(p_T(x), q_T(x)): p over the target's known top tokens (top_ids [N, k] into
    the draft's [N, K] logits), q the draft's whole distribution; 1 where the two agree."""
    q = F.softmax(draft_logits / temperature, dim=-1).gather(1, top_ids)  # [N, k]
    p = F.softmax((top_logits / temperature).masked_fill(~known, float("-inf")), dim=-1)
    return torch.minimum(p, q).masked_fill(~known, 0.0).sum(-1)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_draft(
    draft: transformers.PreTrainedModel, samples: list[ChatSample], vocab: VocabMap, config: ChatDraftConfig
) -> list[float]:
    """Epochs over the samples in shuffled batches of similar length (less padding)."""
    rng = np.random.default_rng(config.seed)
    to_draft = vocab.to_draft()
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].answer_ids))
    batches = [order[i : i + config.batch_size] for i in range(0, len(order), config.batch_size)]
    steps = max(1, round(config.epochs * len(batches)))
    opt = torch.optim.AdamW(
        [p for p in draft.parameters() if p.requires_grad], lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    draft.train()
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        if step % len(batches) == 0:
            rng.shuffle(batches)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, config.lr, config.warmup_steps)
        batch = make_batch([samples[i] for i in batches[step % len(batches)]], to_draft)
        logits = draft(input_ids=batch.input_ids, attention_mask=batch.attention).logits
        loss = distill_loss(
            logits, batch, vocab.unknown_id, config.kl_weight, config.tvd_weight, config.tvd_temperature
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0 or step == steps - 1:
            log(f"[draft] step {step + 1}/{steps} loss {losses[-1]:.3f} elapsed {time.perf_counter() - t0:.0f}s")
    draft.eval()
    return losses


@dataclass(frozen=True)
class Acceptance:
    alpha_sampled: float  # mean over answer positions of sum_x min(p(x), q(x))
    alpha_greedy: float  # share of answer positions where the argmaxes agree
    positions: int


@torch.no_grad()
def heldout_acceptance(
    draft, target, vocab: VocabMap, samples: list[ChatSample], temperature: float, top_k: int | None, top_p: float
) -> Acceptance:
    """Teacher-forced on the target's own answers: the acceptance a round sees at each position,
    at the deployment's sampling (alpha_sampled) and greedily."""
    from dsd.speculation.verification import probs_from_logits

    to_draft = vocab.to_draft()
    total_min, agree, n = 0.0, 0, 0
    for s in samples:
        seq = torch.tensor([s.prompt_ids + s.answer_ids[:-1]])
        first = len(s.prompt_ids) - 1
        p_logits = target(input_ids=seq).logits[0, first:]  # [A, V]
        q_logits = vocab.full_logits(draft(input_ids=to_draft[seq]).logits[0, first:])  # [A, V]
        p = probs_from_logits(p_logits, temperature, top_k, top_p)
        q = probs_from_logits(q_logits, temperature, top_k, top_p)
        total_min += float(torch.minimum(p, q).sum())
        agree += int((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
        n += p_logits.shape[0]
    return Acceptance(total_min / n, agree / n, n)
