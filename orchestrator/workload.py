"""Prompts for a run: held-out text of the model pair's corpus, or token ids for synthetic models."""
from __future__ import annotations

import json
import random
from pathlib import Path

from dsd.backends.factory import BackendConfig


def make_prompts(backend: BackendConfig, n_prompts: int, prompt_tokens: int, seed: int) -> list[list[int]]:
    if backend.kind == "synthetic":
        rng = random.Random(seed)
        # Never the EOS id (0): a prompt is context, not a finished sequence.
        return [[rng.randrange(1, backend.vocab_size) for _ in range(prompt_tokens)] for _ in range(n_prompts)]
    return _heldout_prompts(Path(backend.pair_path), n_prompts, prompt_tokens, seed)


def _heldout_prompts(pair: Path, n_prompts: int, prompt_tokens: int, seed: int) -> list[list[int]]:
    """Windows of held-out text (files the pair never trained on), tokenized by the pair."""
    from tokenizers import Tokenizer

    from dsd import corpus

    manifest = json.loads((pair / "manifest.json").read_text())
    heldout_pct = manifest["build_params"]["heldout_pct"]
    tokenizer = Tokenizer.from_file(str(pair / "tokenizer.json"))
    documents = corpus.read_corpus(corpus.stdlib_dir(), heldout_pct).heldout
    rng = random.Random(seed)
    prompts = []
    for _ in range(50 * n_prompts):
        if len(prompts) == n_prompts:
            break
        ids = tokenizer.encode(rng.choice(documents).text).ids
        if len(ids) <= prompt_tokens:
            continue
        start = rng.randrange(0, len(ids) - prompt_tokens)
        prompts.append(ids[start:start + prompt_tokens])
    if len(prompts) < n_prompts:
        raise ValueError(f"held-out text too short for {n_prompts} prompts of {prompt_tokens} tokens")
    return prompts
