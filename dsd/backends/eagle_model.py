"""The feature draft's network (EAGLE, Li et al. 2024; EAGLE-3's fused features and training-time
test, Li et al. 2025): one decoder layer at the target's width that reads the target's feature at
position j - 1 and the token at j, and predicts the feature at j; the target's final norm and its
tied embedding, restricted to the kept vocabulary, turn a feature into logits.

    u_j = fc([emb_norm(E[x_j]), feat_norm(f_{j-1})])        # 2d -> d
    h_j = f_{j-1} + o(attn(u_j))                             # the residual stream starts at the feature
    h_j = h_j + mlp(post_norm(h_j))                          # predicted f_j
    logits_j = norm(h_j) @ E[:K]^T                           # predicts x_{j+1}

After the first draft step f_{j-1} is the draft's own h_{j-1}. A fused draft's feature is
``fuse([low, mid, top])`` (3d -> d), computed where the target runs (the cloud); its ``fuse``
weights travel with the draft folder but the edge never uses them.

Positions: draft position j reads f_{j-1}, zeros at j = 0 (no feature before it); rotary position
ids are the sequence positions j.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG_FILE = "eagle_config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_kept: int  # K: the head's rows; the embedding has K + 1 (unknown last)
    feature_layers: tuple[int, ...]  # the target's layers (0-based outputs) the feature reads
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        for name in ("hidden_size", "heads", "kv_heads", "head_dim", "intermediate_size", "vocab_kept"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EagleConfig.{name} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"EagleConfig.heads {self.heads} must be a multiple of kv_heads {self.kv_heads}")
        if not self.feature_layers or min(self.feature_layers) < 0:
            raise ValueError(f"EagleConfig.feature_layers must be target layer indices, got {self.feature_layers!r}")

    @property
    def fused(self) -> bool:
        return len(self.feature_layers) > 1

    def save(self, folder: Path) -> None:
        (Path(folder) / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path | str) -> EagleConfig:
        return cls(**json.loads((Path(folder) / CONFIG_FILE).read_text()))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [..., n, head_dim] for integer positions [..., n] (Llama's layout: halves)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = positions.float()[..., None] * inv_freq  # [..., n, hd/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, n, hd]; cos/sin [..., n, hd] broadcast over heads."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos.unsqueeze(-3) + rotated * sin.unsqueeze(-3)).to(x.dtype)


class EagleDraft(nn.Module):
    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        c = self.config = config
        d = c.hidden_size
        self.fuse = nn.Linear(len(c.feature_layers) * d, d, bias=False) if c.fused else None
        self.embed = nn.Embedding(c.vocab_kept + 1, d)
        self.emb_norm = RMSNorm(d, c.rms_eps)
        self.feat_norm = RMSNorm(d, c.rms_eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.q_proj = nn.Linear(d, c.heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(d, c.kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(d, c.kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * c.head_dim, d, bias=False)
        self.post_norm = RMSNorm(d, c.rms_eps)
        self.gate_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, d, bias=False)
        self.norm = RMSNorm(d, c.rms_eps)

    # ---- the pieces every forward shares --------------------------------------------------------

    def fuse_features(self, layer_outputs: torch.Tensor) -> torch.Tensor:
        """[..., n_layers * d] (the target's layer outputs, concatenated in feature_layers order)
        -> the feature [..., d]; a top-only draft's feature is its one layer's output."""
        return layer_outputs if self.fuse is None else self.fuse(layer_outputs)

    def project(self, token_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """token_ids [..., n] (draft ids), features [..., n, d] (f_{j-1}) -> u [..., n, d]."""
        u: torch.Tensor = self.fc(torch.cat([self.emb_norm(self.embed(token_ids)), self.feat_norm(features)], dim=-1))
        return u

    def qkv(self, u: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """u [B, n, d], positions [B, n] -> q [B, H, n, hd], k and v [B, KV, n, hd] (rotated)."""
        c = self.config
        B, n, _ = u.shape
        q = self.q_proj(u).view(B, n, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(u).view(B, n, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(u).view(B, n, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rotary(positions, c.head_dim, c.rope_theta)
        return apply_rotary(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rotary(k, cos.to(k.dtype), sin.to(k.dtype)), v

    def finish(self, features: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """features [B, n, d] (the residual's start), attended [B, H, n, hd] -> h [B, n, d]."""
        B, H, n, hd = attended.shape
        h: torch.Tensor = features + self.o_proj(attended.transpose(1, 2).reshape(B, n, H * hd))
        x = self.post_norm(h)
        mlp: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return h + mlp

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., d] -> logits [..., K] over the kept tokens (the unknown row is never proposed)."""
        normed: torch.Tensor = self.norm(h)
        return normed @ self.embed.weight[: self.config.vocab_kept].T

    # ---- training: every position at once, rollouts on the draft's own features -----------------

    def rollout(
        self, token_ids: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """Training-time test: step 0 reads the true features; step k at index i reads step
        k - 1's output at i - 1 and attends to step-0 keys up to i - k and to step s's key at
        i - k + s (s = 1..k), as the draft's cache holds them at its k-th draft token.
        token_ids [B, n] (x_j), features [B, n, d] (true f_{j-1}), positions [B, n] (j)
        -> [h_0, ..., h_{steps-1}], each [B, n, d] (h_k[:, i] is meaningful for i >= k)."""
        c = self.config
        group = c.heads // c.kv_heads
        scale = c.head_dim**-0.5
        n = token_ids.shape[1]
        keys, values, outputs = [], [], []
        inputs = features
        for k in range(steps):
            q, key, value = self.qkv(self.project(token_ids, inputs), positions)
            key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)  # [B, H, n, hd]
            keys.append(key)
            values.append(value)
            scores = [(q @ keys[0].transpose(-1, -2)) * scale]  # [B, H, n, n]
            allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-k)
            scores[0] = scores[0].masked_fill(~allowed, float("-inf"))
            for s in range(1, k + 1):
                shifted = _shift(keys[s], k - s)  # [B, H, n, hd]
                diag = (q * shifted).sum(-1, keepdim=True) * scale  # [B, H, n, 1]
                if k - s:
                    diag[:, :, : k - s] = float("-inf")
                scores.append(diag)
            weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
            attended = weights[..., :n] @ values[0]
            for s in range(1, k + 1):
                attended = attended + weights[..., n + s - 1 : n + s] * _shift(values[s], k - s)
            h = self.finish(inputs, attended)
            outputs.append(h)
            inputs = _shift(h, 1)  # the next step reads h at i - 1
        return outputs


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x [..., n, e] moved `by` places later along n (the first `by` rows zero)."""
    if by == 0:
        return x
    return torch.cat([torch.zeros_like(x[..., :by, :]), x[..., :-by, :]], dim=-2)


def save_eagle(model: EagleDraft, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    import safetensors.torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.config.save(folder)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})


def is_eagle_folder(folder: Path | str) -> bool:
    """Whether ``folder`` holds a feature draft (rather than a Hugging Face model)."""
    return (Path(folder).expanduser() / CONFIG_FILE).is_file()


def load_eagle(folder: Path | str, dtype: torch.dtype = torch.float32) -> EagleDraft:
    import safetensors.torch

    folder = Path(folder)
    model = EagleDraft(EagleConfig.load(folder))
    model.load_state_dict(safetensors.torch.load_file(str(folder / WEIGHTS_FILE)))
    return model.to(dtype).eval()
