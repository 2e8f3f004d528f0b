"""Tiny seeded GPT-2 pairs built in memory, for tests that need real transformer KV caches."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from dsd.backends.torch_lm import TorchLM


def tiny_pair(seed: int = 0, noise: float = 0.02, vocab: int = 97) -> tuple[TorchLM, TorchLM]:
    """A target and a draft that is the target with noise added to its weights, so drafts are
    often but not always right."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_layer=2, n_embd=32, n_head=2, n_positions=256, bos_token_id=0, eos_token_id=0
    )
    target = GPT2LMHeadModel(config).eval()
    draft = GPT2LMHeadModel(config).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * torch.randn_like(p))
    return TorchLM(draft, "tiny-draft", None), TorchLM(target, "tiny-target", None)
