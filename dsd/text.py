"""A pair's text side: its target's own tokenizer (``target_tokenizer``), and a prompt, a text or a
chat, as the target's token ids (``encode_prompt``: a chat rendered with the tokenizer's chat
template, ending where the assistant speaks)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsd.backends.hf import HfBackendConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def target_tokenizer(backend: HfBackendConfig) -> PreTrainedTokenizerBase:
    """The target's own tokenizer: from its model folder, else from the pair folder around it."""
    from transformers import AutoTokenizer

    if backend.target_path:
        target = Path(backend.target_path).expanduser()
        candidates = [target, target.parent]
    else:
        pair = Path(backend.pair_path).expanduser()
        candidates = [pair / "target", pair]
    for folder in candidates:
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(folder))
    raise ValueError(
        f"no tokenizer beside the target: looked for tokenizer.json or tokenizer_config.json "
        f"in {', '.join(map(str, candidates))}"
    )


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, str]]) -> list[int]:
    """A text as it is (with the tokenizer's special tokens), or chat messages ({"role",
    "content"}) through the chat template; without a template, a plain transcript that ends
    where the assistant would speak."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=True)
    elif getattr(tokenizer, "chat_template", None):
        rendered: Any = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        ids = list(rendered if isinstance(rendered, list) else rendered["input_ids"])  # newer transformers: a mapping
    else:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in prompt) + "assistant:"
        ids = tokenizer.encode(text, add_special_tokens=True)
    if not ids:
        raise ValueError(f"a prompt tokenizes to nothing: {prompt!r}")
    return list(ids)
