"""Workloads: prompt sources, tokenized by the target's own tokenizer, with clear errors."""

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.spec.plan import plan_points
from orchestrator.spec.plan import prompts_for_point
from orchestrator.spec.workload import SHIPPED_INSTRUCTIONS, experiment_categories, experiment_prompts, target_tokenizer
from tests.checks import every

VOCAB = 300
TEXTS = [
    "the cat sat on the mat",
    "write a function that adds two numbers",
    "explain what a queue is",
    "a small model with its own words",
] * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def own_pair(tmp_path_factory):
    """A GPT-2 pair with its own 300-token word-level tokenizer (the default pair has 4096
    byte-level BPE tokens), saved as two model folders; the tokenizer sits in the target's."""
    root = tmp_path_factory.mktemp("own-pair")
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(
        TEXTS + [open(SHIPPED_INSTRUCTIONS).read()],
        trainers.WordLevelTrainer(vocab_size=VOCAB, special_tokens=["[UNK]", "<eos>"]),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_layer=1, n_embd=16, n_head=2, n_positions=128)
    for name in ("target", "draft"):
        GPT2LMHeadModel(config).save_pretrained(root / name)
    tokenizer.save_pretrained(root / "target")
    return root, tokenizer


def experiment(root, workload=None, **extra):
    data = {
        "name": "own",
        "requests": 3,
        "warmup_requests": 1,
        "prompt_tokens": 8,
        "backend": {"kind": "hf", "target_path": str(root / "target"), "draft_path": str(root / "draft")},
        **extra,
    }
    if workload is not None:
        data["workload"] = workload
    return experiment_from_dict(data)


def _ids(rendered) -> list[int]:
    return list(rendered if isinstance(rendered, list) else rendered["input_ids"])


def test_an_explicit_pair_is_prompted_with_its_own_tokenizer(own_pair, tmp_path):
    root, tokenizer = own_pair
    assert target_tokenizer(experiment(root).backend).vocab_size == tokenizer.vocab_size < 4096
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text("\n".join(json.dumps({"prompt": t}) for t in TEXTS[:4]) + "\n")
    prompts = experiment_prompts(
        experiment(root, {"source": "jsonl", "path": str(prompts_file), "n_prompts": 4, "max_prompt_tokens": 32})
    )
    # The pair's tokenizer has a chat template: each instruction is one user turn of it.
    expected = sorted(
        _ids(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True))
        for t in TEXTS[:4]
    )
    assert sorted(prompts) == expected
    assert every(0 <= t < tokenizer.vocab_size for p in prompts for t in p)
    # The held-out windows too are the pair's own ids.
    windows = experiment_prompts(experiment(root))
    assert len(windows) == 4 and all(len(w) == 8 and max(w) < tokenizer.vocab_size for w in windows)


def test_chat_prompts_use_the_targets_chat_template_turns_the_first_turn_and_a_conversation_all_of_it(
    own_pair, tmp_path
):
    root, tokenizer = own_pair
    path = tmp_path / "chat.jsonl"
    messages = [{"role": "user", "content": "explain what a queue is"}]
    path.write_text(
        json.dumps({"messages": messages})
        + "\n"
        + json.dumps({"question_id": 7, "turns": ["write a function", "now test it"]})
        + "\n"
        + json.dumps({"prompt": "and a stack?", "turns": [messages[0], {"role": "assistant", "content": "a line"}]})
        + "\n"
    )
    prompts = experiment_prompts(
        experiment(root, {"source": "jsonl", "path": str(path), "n_prompts": 3, "max_prompt_tokens": 64})
    )
    rendered = [
        tokenizer.encode("<user>explain what a queue is<assistant>", add_special_tokens=False),
        tokenizer.encode("<user>write a function<assistant>", add_special_tokens=False),
        tokenizer.encode(
            "<user>explain what a queue is<assistant>a line<user>and a stack?<assistant>", add_special_tokens=False
        ),
    ]
    assert sorted(prompts) == sorted(rendered)


def test_text_lines_and_document_windows_with_shuffle_seed_and_truncation(own_pair, tmp_path):
    root, tokenizer = own_pair
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(TEXTS[:4]) + "\n\n")
    by_seed = [
        experiment_prompts(
            experiment(
                root, {"source": "lines", "path": str(lines), "n_prompts": 4, "max_prompt_tokens": 3, "shuffle_seed": s}
            )
        )
        for s in (1, 2)
    ]
    assert sorted(by_seed[0]) == sorted(by_seed[1]) and by_seed[0] != by_seed[1]
    assert sorted(by_seed[0]) == sorted(tokenizer.encode(t)[-3:] for t in TEXTS[:4])  # the last 3 tokens
    document = tmp_path / "doc.txt"
    document.write_text(" ".join(TEXTS))
    windows = experiment_prompts(
        experiment(root, {"source": "document", "path": str(document), "n_prompts": 5, "max_prompt_tokens": 6})
    )
    whole = tokenizer.encode(" ".join(TEXTS))
    assert len(windows) == 5 and all(any(whole[i : i + 6] == w for i in range(len(whole))) for w in windows)


@pytest.mark.parametrize(
    "workload,message",
    [
        ({"source": "csv"}, "'workload.source'"),
        ({"source": "jsonl", "path": "/no/such/file.jsonl"}, "'workload.path'"),
        ({"source": "heldout", "path": "x"}, "'workload.path'"),
        ({"source": "jsonl", "path": str(SHIPPED_INSTRUCTIONS), "column": "text"}, "'workload.column'"),
        ({"n_prompts": -1}, "'workload.n_prompts'"),
        ({"max_prompt_tokens": 1.5}, "'workload.max_prompt_tokens'"),
        ({"sorce": "jsonl"}, r"unknown key.*\[workload\].*sorce"),
    ],
)
def test_bad_workload_tables_are_refused_naming_the_key(own_pair, workload, message):
    with pytest.raises(ValueError, match=message):
        experiment(own_pair[0], workload)


def test_too_few_prompts_and_bad_lines_are_named(own_pair, tmp_path):
    root = own_pair[0]
    with pytest.raises(ValueError, match="'workload.n_prompts'.*40 prompts"):
        experiment_prompts(experiment(root, {"source": "jsonl", "path": str(SHIPPED_INSTRUCTIONS), "n_prompts": 41}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2"):
        experiment_prompts(experiment(root, {"source": "jsonl", "path": str(bad), "n_prompts": 2}))


def test_a_datasets_folder_needs_the_datasets_package_or_is_read_by_column(own_pair, tmp_path):
    root, tokenizer = own_pair
    try:
        import datasets
    except ImportError:
        folder = tmp_path / "ds"
        folder.mkdir()
        with pytest.raises(ValueError, match="pip install datasets"):
            experiment_prompts(
                experiment(root, {"source": "datasets", "path": str(folder), "column": "q", "n_prompts": 2})
            )
        return
    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({"q": TEXTS[:4], "other": list(range(4))}).save_to_disk(str(folder))
    prompts = experiment_prompts(
        experiment(
            root, {"source": "datasets", "path": str(folder), "column": "q", "n_prompts": 4, "max_prompt_tokens": 32}
        )
    )
    assert sorted(prompts) == sorted(tokenizer.encode(t) for t in TEXTS[:4])


def test_the_shipped_instructions_are_forty_distinct_prompts():
    rows = [json.loads(line) for line in SHIPPED_INSTRUCTIONS.read_text().splitlines()]
    assert len(rows) == len({r["prompt"] for r in rows}) == 40


def test_a_pool_larger_than_a_point_is_shared_out_by_repeat_and_rtt_and_kept_paired_across_modes():
    exp = experiment_from_dict(
        {
            "name": "pool",
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic"},
            "rtt_ms": [0, 10, 20],
            "repeats": 2,
            "requests": 3,
            "warmup_requests": 1,
            "workload": {"n_prompts": 10},
        }
    )
    pool = experiment_prompts(exp)
    assert len(pool) == 10
    by_point = {p.key: prompts_for_point(pool, exp, p) for p in plan_points(exp)}
    assert every(len(v) == 4 for v in by_point.values())
    assert by_point["ar_rtt10ms_g4_c1_r0"] == by_point["sync_rtt10ms_g4_c1_r0"]  # paired modes
    assert by_point["ar_rtt0ms_g4_c1_r0"] != by_point["ar_rtt10ms_g4_c1_r0"]
    used = {tuple(p) for prompts in by_point.values() for p in prompts}
    assert used == {tuple(p) for p in pool}  # all 10 used


def test_rotate_by_repeat_gives_every_rtt_of_a_repeat_the_same_prompts():
    exp = experiment_from_dict(
        {
            "name": "pool",
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic"},
            "rtt_ms": [0, 10, 20],
            "repeats": 2,
            "requests": 3,
            "warmup_requests": 1,
            "workload": {"n_prompts": 10, "rotate": "repeat"},
        }
    )
    pool = experiment_prompts(exp)
    by_point = {p.key: prompts_for_point(pool, exp, p) for p in plan_points(exp)}
    assert by_point["ar_rtt0ms_g4_c1_r0"] == by_point["sync_rtt20ms_g4_c1_r0"]  # paired RTTs
    assert by_point["ar_rtt0ms_g4_c1_r0"] != by_point["ar_rtt0ms_g4_c1_r1"]  # repeats differ


def test_an_unknown_rotation_is_an_error_naming_the_key():
    with pytest.raises(ValueError, match="rotate"):
        experiment_from_dict(
            {
                "name": "pool",
                "profile": "toy-edge-cloud",
                "backend": {"kind": "synthetic"},
                "workload": {"rotate": "mode"},
            }
        )


def test_a_shuffled_pool_keeps_each_prompts_category_beside_it(own_pair, tmp_path):
    root, tokenizer = own_pair
    categories = {TEXTS[0]: "writing", TEXTS[1]: "coding", TEXTS[2]: "explanation", TEXTS[3]: ""}
    path = tmp_path / "mix.jsonl"
    path.write_text(
        "\n".join(json.dumps({"prompt": t, **({"category": c} if c else {})}) for t, c in categories.items()) + "\n"
    )
    exp = experiment(
        root, {"source": "jsonl", "path": str(path), "n_prompts": 4, "max_prompt_tokens": 32, "shuffle_seed": 3}
    )
    pool, pool_categories = experiment_prompts(exp), experiment_categories(exp)
    texts = [next(t for t in categories if t in tokenizer.decode(p)) for p in pool]
    assert sorted(texts) == sorted(categories) and [categories[t] for t in texts] == pool_categories
    assert pool_categories != list(categories.values())  # the seed moved them


def test_a_stratified_pool_deals_one_prompt_of_each_category_before_a_second(own_pair, tmp_path):
    root, tokenizer = own_pair
    lines = [(f"{TEXTS[0]} {i}", "writing") for i in range(6)] + [(f"{TEXTS[1]} {i}", "coding") for i in range(3)]
    lines += [(TEXTS[2], "explanation")]
    path = tmp_path / "mix.jsonl"
    path.write_text("".join(json.dumps({"prompt": t, "category": c}) + "\n" for t, c in lines))
    table = {"source": "jsonl", "path": str(path), "n_prompts": 10, "max_prompt_tokens": 32, "shuffle_seed": 3}
    plain, stratified = (experiment(root, {**table, "stratify": s}) for s in (False, True))
    categories = experiment_categories(stratified)
    assert sorted(categories[:3]) == ["coding", "explanation", "writing"]
    assert sorted(categories[3:5]) == sorted(categories[5:7]) == ["coding", "writing"]
    assert categories[7:] == ["writing"] * 3 and sorted(categories) == sorted(experiment_categories(plain))
    # the prompts follow the same order: each prompt beside its own category
    word = {"writing": "cat", "coding": "function", "explanation": "queue"}
    texts = [tokenizer.decode(p) for p in experiment_prompts(stratified)]
    assert [word[c] in text for c, text in zip(categories, texts)] == [True] * 10, (categories, texts)
    assert experiment_prompts(plain) != experiment_prompts(stratified)
    with pytest.raises(ValueError, match="workload.stratify"):
        experiment(root, {"source": "lines", "path": str(path), "stratify": True})
