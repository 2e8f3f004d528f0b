"""The target's own chat answers, the draft's training data: each training instruction rendered
with the target's chat template, answered by the target at the deployment's sampling, and the
target's top-k logits at every answer position kept for logit distillation.

The answers are sequence-level distillation data (the draft learns the text the target writes);
the kept logits are the target's whole distribution up to the k-th token (logit distillation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pairs.common import log


@dataclass(frozen=True)
class ChatDataConfig:
    prompts_path: Path
    samples_per_prompt: int = 2
    max_new_tokens: int = 128
    temperature: float = 0.7
    top_p: float = 0.9
    top_logits: int = 64  # how many of the target's logits to keep per answer position
    batch_size: int = 48
    seed: int = 1234

    def __post_init__(self) -> None:
        for name in ["samples_per_prompt", "max_new_tokens", "top_logits", "batch_size"]:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ChatDataConfig.{name} must be a positive int, got {value!r}")
        if not self.temperature > 0:
            raise ValueError(f"ChatDataConfig.temperature must be > 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"ChatDataConfig.top_p must be in (0, 1], got {self.top_p!r}")


@dataclass(frozen=True)
class ChatSample:
    prompt_ids: list[int]  # the chat-rendered instruction, ending where the answer starts
    answer_ids: list[int]  # the target's sampled answer (its end-of-turn token included)
    top_ids: np.ndarray  # [len(answer_ids), k] int32: the target's k most likely tokens
    top_logits: np.ndarray  # [len(answer_ids), k] float16: their raw logits (temperature 1)


ROLES = ("user", "assistant")
ITEM_KEYS = ("prompt", "turns", "category", "source")


@dataclass(frozen=True)
class PromptItem:
    """One line of a prompts file (workloads/README.md): the user's message, and optionally the
    conversation before it, the item's category and where it comes from."""

    prompt: str
    turns: tuple[tuple[str, str], ...] = ()  # earlier (role, content): user first, then alternating
    category: str = ""
    source: str = ""

    def messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.turns] + [
            {"role": "user", "content": self.prompt}
        ]

    def text(self) -> str:
        """Everything the item says, earlier turns included (what an overlap check compares)."""
        return "\n".join(content for _, content in self.turns) + "\n" + self.prompt


def read_items(path: Path) -> list[PromptItem]:
    items = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            items.append(item_from_record(json.loads(line), f"{path}:{number}", line))
    return items


def item_from_record(record, where: str, line: str) -> PromptItem:
    """One line's item, its keys, turns and strings checked (``where`` names it in an error)."""
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise ValueError(f'{where}: expected {{"prompt": "..."}}, got {line[:80]!r}')
    unknown = sorted(set(record) - set(ITEM_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a line holds {list(ITEM_KEYS)}")
    turns = record.get("turns", [])
    if (
        not isinstance(turns, list)
        or len(turns) % 2
        or any(
            not isinstance(t, dict)
            or set(t) != {"role", "content"}
            or t["role"] != ROLES[i % 2]
            or not isinstance(t["content"], str)
            for i, t in enumerate(turns)
        )
    ):
        raise ValueError(
            f'{where}: \'turns\' must be a list of {{"role", "content"}} that alternates '
            f"{ROLES[0]}, {ROLES[1]}, ... and ends with the {ROLES[1]}, got {turns!r:.120}"
        )
    for key in ("category", "source"):
        if not isinstance(record.get(key, ""), str):
            raise ValueError(f"{where}: {key!r} must be a string, got {record[key]!r}")
    return PromptItem(
        record["prompt"],
        tuple((t["role"], t["content"]) for t in turns),
        record.get("category", ""),
        record.get("source", ""),
    )


def write_items(items: list[PromptItem], path: Path) -> None:
    """The lines read_items reads back as these items."""
    lines = []
    for item in items:
        record: dict = {"prompt": item.prompt}
        if item.turns:
            record["turns"] = [{"role": role, "content": content} for role, content in item.turns]
        record.update({key: getattr(item, key) for key in ("category", "source") if getattr(item, key)})
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    Path(path).write_text("".join(lines))


def read_prompts(path: Path) -> list[str]:
    """The final user messages only (for the sets without earlier turns)."""
    return [item.prompt for item in read_items(path)]


def render(tokenizer, prompt: str, turns: tuple[tuple[str, str], ...] = ()) -> list[int]:
    """The conversation through the target's chat template, ending where the answer starts."""
    ids = tokenizer.apply_chat_template(PromptItem(prompt, turns).messages(), add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def render_file(tokenizer, path: Path, samples_per_prompt: int = 1) -> list[list[int]]:
    """Every item of a prompts file rendered, each samples_per_prompt times in a row."""
    return [render(tokenizer, item.prompt, item.turns) for item in read_items(path) for _ in range(samples_per_prompt)]


@torch.inference_mode()
def answer_batch(
    target, tokenizer, prompts_ids: list[list[int]], config: ChatDataConfig, generator_seed: int
) -> list[ChatSample]:
    """Sample one answer per prompt in one left-padded batch; keep each position's top logits."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts_ids)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts_ids])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts_ids])
    torch.manual_seed(generator_seed)
    out = target.generate(
        input_ids=input_ids,
        attention_mask=attention,
        do_sample=True,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=0,
        max_new_tokens=config.max_new_tokens,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    logits = torch.stack(out.logits, dim=1)  # [B, steps, vocab]
    top = torch.topk(logits, config.top_logits, dim=-1)
    samples = []
    for row, prompt in enumerate(prompts_ids):
        answer = out.sequences[row, width:].tolist()
        if tokenizer.eos_token_id in answer:
            answer = answer[: answer.index(tokenizer.eos_token_id) + 1]
        n = len(answer)
        samples.append(
            ChatSample(
                prompt,
                answer,
                top.indices[row, :n].numpy().astype(np.int32),
                top.values[row, :n].numpy().astype(np.float16),
            )
        )
    return samples


def answer_prompts(target, tokenizer, config: ChatDataConfig, partial: Path | None = None) -> list[ChatSample]:
    """Every prompt answered samples_per_prompt times, batch by batch (each batch seeded on its
    own, so a run resumed from ``partial`` answers exactly as one that was never stopped). With
    ``partial``, the answers so far are kept there after every batch and read back on a rerun."""
    rendered = render_file(tokenizer, config.prompts_path, config.samples_per_prompt)
    samples = _resumed(partial, rendered, config.batch_size)
    for start in range(len(samples), len(rendered), config.batch_size):
        batch = rendered[start : start + config.batch_size]
        samples += answer_batch(target, tokenizer, batch, config, config.seed + start)
        if partial is not None:
            save_samples(samples, partial, compress=False)
        log(f"[chat-data] {len(samples)}/{len(rendered)} answers, {sum(len(s.answer_ids) for s in samples)} tokens")
    return samples


def _resumed(partial: Path | None, rendered: list[list[int]], batch_size: int) -> list[ChatSample]:
    if partial is None or not Path(partial).is_file():
        return []
    samples = load_samples(partial)
    if (
        (len(samples) % batch_size and len(samples) != len(rendered))
        or len(samples) > len(rendered)
        or any(s.prompt_ids != r for s, r in zip(samples, rendered))
    ):
        raise ValueError(
            f"{partial}: {len(samples)} answers that are not the first batches of "
            f"these {len(rendered)} prompts; delete it to answer from the start"
        )
    log(f"[chat-data] resuming after {len(samples)} answers kept in {partial}")
    return samples


def save_samples(samples: list[ChatSample], path: Path, compress: bool = True) -> None:
    """Written to a temporary file, then renamed: a stop mid-write leaves the old file whole."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp.npz")
    (np.savez_compressed if compress else np.savez)(
        temporary,
        prompt_lengths=np.array([len(s.prompt_ids) for s in samples], dtype=np.int32),
        answer_lengths=np.array([len(s.answer_ids) for s in samples], dtype=np.int32),
        prompt_ids=np.array([t for s in samples for t in s.prompt_ids], dtype=np.int32),
        answer_ids=np.array([t for s in samples for t in s.answer_ids], dtype=np.int32),
        top_ids=np.concatenate([s.top_ids for s in samples]),
        top_logits=np.concatenate([s.top_logits for s in samples]),
    )
    temporary.replace(path)


def load_samples(path: Path) -> list[ChatSample]:
    with np.load(path) as npz:
        data = {name: npz[name] for name in npz.files}  # each read decompresses: once
    samples, p0, a0 = [], 0, 0
    for p_len, a_len in zip(data["prompt_lengths"], data["answer_lengths"]):
        samples.append(
            ChatSample(
                data["prompt_ids"][p0 : p0 + p_len].tolist(),
                data["answer_ids"][a0 : a0 + a_len].tolist(),
                data["top_ids"][a0 : a0 + a_len],
                data["top_logits"][a0 : a0 + a_len],
            )
        )
        p0, a0 = p0 + p_len, a0 + a_len
    return samples


def distinct_4gram(ids: list[int]) -> float:
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0
