"""Prompts for a run: the experiment's ``[workload]``, tokenized by the TARGET's own tokenizer.

    [workload]
    source = "jsonl"            # heldout | jsonl | lines | document | datasets
    path = "workloads/instructions.jsonl"
    n_prompts = 40              # the pool; default: what one point runs (warmup + requests)
    max_prompt_tokens = 64      # windows are this long; longer prompts keep their last tokens
    shuffle_seed = 0            # default: the experiment's seed
    stratify = true             # jsonl: one prompt of each category, then the next of each, ...

Sources: ``heldout`` windows of the Python standard library files the default pair never
trained on (pairs/corpus.py); ``jsonl`` one object per line, ``{"prompt": "..."}``, chat
``{"messages": [{"role": ..., "content": ...}, ...]}``, ours ``{"prompt": ..., "turns": [earlier
{"role", "content"}, ...]}`` (the conversation so far, then the prompt) or MT-Bench / Spec-Bench
``{"turns": ["...", ...]}`` (first turn), chat rendered with the target tokenizer's chat template
when it has one (a ``{"prompt": ...}`` too, as one user turn: an instruction-tuned target answers
instructions as a chat; without a template it is the text itself); ``lines`` a text file, one prompt per non-empty line; ``document`` a text file
cut into windows of max_prompt_tokens; ``datasets`` a Hugging Face ``datasets`` folder
(``save_to_disk``) with ``column`` (and ``split`` for a DatasetDict).

A jsonl line may carry a ``category`` (workloads/README.md): the pool keeps each prompt's
(``experiment_categories``), every request row carries it and the analysis breaks acceptance
and latency down by it. A synthetic backend has no tokenizer: from a jsonl file it takes one
prompt of random ids per line, and the lines' categories.

When the pool holds more prompts than a point runs, the points take turns through it: every
(repeat, RTT) slot gets the next prompts, and the modes, gammas and sampling settings of one
slot share them, so comparisons at one RTT stay paired. With ``rotate = "repeat"`` every RTT of
a repeat runs the same prompts too, so a comparison across RTTs (a crossover, a prediction from
the RTT-0 calibration points) is paired as well.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

from dsd.backends.factory import BackendConfig, HfBackendConfig
from dsd.checks import check, is_int
from dsd.text import encode_prompt, target_tokenizer  # noqa: F401 - target_tokenizer re-exported
from orchestrator.common.toml_tables import config_from_table

SOURCES = ("heldout", "jsonl", "lines", "document", "datasets")
ROTATIONS = ("rtt", "repeat")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_INSTRUCTIONS = PROJECT_ROOT / "workloads" / "instructions.jsonl"


@dataclass(frozen=True)
class Workload:
    source: str = "heldout"
    path: str = ""
    column: str = ""  # datasets: the column holding prompts (text or chat messages)
    split: str = ""  # datasets: the split of a DatasetDict
    n_prompts: int = 0  # 0: warmup_requests + requests
    max_prompt_tokens: int = 0  # 0: the experiment's prompt_tokens
    shuffle_seed: int = -1  # -1: the experiment's seed
    rotate: str = "rtt"  # "rtt": each (repeat, RTT) slot its own prompts; "repeat": every RTT of a repeat the same
    stratify: bool = False  # jsonl: the shuffled pool dealt out a category at a time (one of each, then the next)

    def __post_init__(self) -> None:
        check(self.source in SOURCES, "workload.source", self.source, f"one of {SOURCES}")
        check(self.rotate in ROTATIONS, "workload.rotate", self.rotate, f"one of {ROTATIONS}")
        if self.source == "heldout":
            check(not self.path, "workload.path", self.path, "empty for source 'heldout'")
        else:
            check(
                isinstance(self.path, str) and resolve(self.path).exists(),
                "workload.path",
                self.path,
                "an existing file or folder (relative paths: from here, else from the project root)",
            )
        check(
            bool(self.column) == (self.source == "datasets"),
            "workload.column",
            self.column,
            "a column name with source 'datasets' only",
        )
        check(not self.split or self.source == "datasets", "workload.split", self.split, "only with source 'datasets'")
        check(self.stratify in (False, True), "workload.stratify", self.stratify, "true or false")
        check(
            not self.stratify or self.source == "jsonl", "workload.stratify", self.stratify, "only with source 'jsonl'"
        )
        for name, low in (("n_prompts", 0), ("max_prompt_tokens", 0), ("shuffle_seed", -1)):
            value = getattr(self, name)
            check(is_int(value) and value >= low, f"workload.{name}", value, f"a whole number >= {low}")


def parse_workload(table, source: str = "experiment") -> Workload:
    """The [workload] table -> Workload; a bad or unknown key is a ValueError naming it."""
    return config_from_table(Workload, table, "workload", source)


def resolve(path: str) -> Path:
    """A workload file (load_experiment has made a file's relative path absolute from its folder)."""
    return Path(path).expanduser()


# ---- the pool ---------------------------------------------------------------------------------


def experiment_prompts(experiment) -> list[list[int]]:
    """The experiment's prompt pool (token ids of its target)."""
    workload: Workload = experiment.workload
    per_point = experiment.warmup_requests + experiment.requests
    n_prompts = workload.n_prompts or per_point
    max_tokens = workload.max_prompt_tokens or experiment.prompt_tokens
    seed = experiment.seed if workload.shuffle_seed < 0 else workload.shuffle_seed
    return load_prompts(experiment.backend, workload, n_prompts, max_tokens, seed)


def load_prompts(
    backend: BackendConfig, workload: Workload, n_prompts: int, max_tokens: int, seed: int
) -> list[list[int]]:
    # NOTE: only hf pairs have a tokenizer here; any other backend takes random ids below its
    # vocab_size (a backend kind with a tokenizer must be added to target_tokenizer).
    if not isinstance(backend, HfBackendConfig):
        if workload.source not in ("heldout", "jsonl"):
            raise ValueError(
                f"experiment key 'workload.source': {workload.source!r} needs a tokenizer; "
                f"the {backend.kind} backend has none (it takes random token ids)"
            )
        if workload.source == "jsonl":
            _check_enough(workload, len(_records(workload)), n_prompts)
        rng = random.Random(seed)
        # Never the EOS id (0): a prompt is context, not a finished sequence.
        return [[rng.randrange(1, backend.vocab_size) for _ in range(max_tokens)] for _ in range(n_prompts)]
    tokenizer = target_tokenizer(backend)
    if workload.source == "heldout":
        return _windows(tokenizer, _heldout_texts(backend), n_prompts, max_tokens, seed, "held-out text")
    if workload.source == "document":
        text = resolve(workload.path).read_text(encoding="utf-8")
        return _windows(tokenizer, [text], n_prompts, max_tokens, seed, workload.path)
    records = _records(workload)
    _check_enough(workload, len(records), n_prompts)
    order = pool_order(
        workload, _line_categories(workload) if workload.source == "jsonl" else [""] * len(records), seed
    )
    return [_encode(tokenizer, records[i])[-max_tokens:] for i in order[:n_prompts]]


def experiment_categories(experiment) -> list[str]:
    """The category of each prompt of experiment_prompts' pool, in its order; empty strings where
    the workload has none."""
    workload: Workload = experiment.workload
    n_prompts = workload.n_prompts or experiment.warmup_requests + experiment.requests
    if workload.source != "jsonl":
        return [""] * n_prompts
    categories = _line_categories(workload)
    seed = experiment.seed if workload.shuffle_seed < 0 else workload.shuffle_seed
    shuffled = isinstance(experiment.backend, HfBackendConfig)  # random ids stand in for the others' lines
    return [categories[i] for i in pool_order(workload, categories, seed, shuffled)[:n_prompts]]


def pool_order(workload: Workload, categories: list[str], seed: int, shuffled: bool = True) -> list[int]:
    """The lines' indices in the pool's order: shuffled with ``seed``, then with ``stratify`` dealt
    out a category at a time in the order the categories first come (the first of each, then the
    second of each, ...), so any first n prompts hold the categories as evenly as n allows."""
    order = list(range(len(categories)))
    if shuffled:
        random.Random(seed).shuffle(order)
    if not workload.stratify:
        return order
    by_category: dict[str, list[int]] = {}
    for i in order:
        by_category.setdefault(categories[i], []).append(i)
    rounds = itertools.zip_longest(*by_category.values())
    return [i for dealt in rounds for i in dealt if i is not None]


def _line_categories(workload: Workload) -> list[str]:
    lines = filter(str.strip, resolve(workload.path).read_text(encoding="utf-8").splitlines())
    return [str(obj.get("category", "")) if isinstance(obj, dict) else "" for obj in map(json.loads, lines)]


def _check_enough(workload: Workload, n_records: int, n_prompts: int) -> None:
    if n_records < n_prompts:
        raise ValueError(
            f"experiment key 'workload.n_prompts': {workload.path} holds {n_records} prompts, "
            f"fewer than the {n_prompts} asked for"
        )


def make_prompts(backend: BackendConfig, n_prompts: int, prompt_tokens: int, seed: int) -> list[list[int]]:
    """Windows of held-out text (or random ids for synthetic models): the default workload."""
    return load_prompts(backend, Workload(), n_prompts, prompt_tokens, seed)


def describe(pool: list[list[int]]) -> dict:
    """What sweep.json records about the prompts."""
    lengths = sorted(map(len, pool))
    return {
        "prompts": len(pool),
        "distinct_prompts": len({tuple(p) for p in pool}),
        "prompt_tokens_min": lengths[0],
        "prompt_tokens_max": lengths[-1],
    }


# ---- sources ------------------------------------------------------------------------------------


def _heldout_texts(backend: BackendConfig) -> list[str]:
    from pairs import corpus

    manifest = Path(backend.pair_path).expanduser() / "manifest.json"
    heldout_pct = 5.0
    if not backend.target_path and manifest.is_file():
        heldout_pct = json.loads(manifest.read_text())["build_params"]["heldout_pct"]
    return [d.text for d in corpus.read_corpus(corpus.stdlib_dir(), heldout_pct).heldout]


def _windows(tokenizer, texts: list[str], n_prompts: int, window: int, seed: int, what: str) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    tokenizer.model_max_length = 1 << 62  # whole documents are encoded, then cut: no warning
    for _ in range(50 * n_prompts):
        if len(prompts) == n_prompts:
            break
        ids = tokenizer.encode(rng.choice(texts), add_special_tokens=False)
        if len(ids) <= window:
            continue
        start = rng.randrange(0, len(ids) - window)
        prompts.append(ids[start : start + window])
    if len(prompts) < n_prompts:
        raise ValueError(f"{what} too short for {n_prompts} prompts of {window} tokens")
    return prompts


def _records(workload: Workload) -> list:
    """Prompt records: a string, or a list of chat messages."""
    path = resolve(workload.path)
    if workload.source == "lines":
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if workload.source == "datasets":
        return _dataset_records(path, workload.column, workload.split)
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(_record(json.loads(line)))
        except (json.JSONDecodeError, ValueError) as error:
            raise ValueError(f"{workload.path} line {number}: {error}") from None
    return records


class Instruction(str):
    """A jsonl ``{"prompt": ...}``: one user turn where the target has a chat template, else the
    text itself."""


def _record(obj):
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        if obj.get("turns"):  # the conversation so far (workloads/README.md), then the prompt
            from pairs import chat_data  # imports torch: only for a file that has conversations

            return chat_data.item_from_record(obj, "the line", json.dumps(obj)).messages()
        return Instruction(obj["prompt"])
    if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
        return _messages(obj["messages"])
    if isinstance(obj, dict) and isinstance(obj.get("turns"), list) and obj["turns"]:
        return [{"role": "user", "content": str(obj["turns"][0])}]
    raise ValueError('expected {"prompt": "..."}, {"messages": [...]} or {"turns": ["..."]}')


def _messages(messages: list) -> list[dict]:
    if not messages or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise ValueError('messages must be a non-empty list of {"role": str, "content": str}')
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _dataset_records(path: Path, column: str, split: str) -> list:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            "experiment key 'workload.source': 'datasets' needs the Hugging Face `datasets` "
            "package: pip install datasets"
        ) from None
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ValueError(f"experiment key 'workload.split': expected one of {sorted(data)}, got {split!r}")
        data = data[split]
    if column not in data.column_names:
        raise ValueError(f"experiment key 'workload.column': expected one of {data.column_names}, got {column!r}")
    return [value if isinstance(value, str) else _messages(value) for value in data[column]]


def _encode(tokenizer, record) -> list[int]:
    if isinstance(record, Instruction) and getattr(tokenizer, "chat_template", None):
        record = [{"role": "user", "content": str(record)}]
    return encode_prompt(tokenizer, record)
