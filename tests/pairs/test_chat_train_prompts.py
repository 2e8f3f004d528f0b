"""The chat training prompts (workloads/train_chat.jsonl, pairs.chat_train_prompts): the nine
categories of the evaluation mix, enough of each, no near-duplicates, apart from both evaluation sets."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pairs import chat_data, chat_train_prompts, smollm2
from tests.checks import every


def test_the_chat_training_prompts_fill_every_evaluation_category_from_both_processes():
    items = chat_data.read_items(smollm2.CHAT_TRAIN_PROMPTS)
    counts = Counter(i.category for i in items)
    evaluation = {i.category for i in chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS)}
    assert set(counts) == evaluation and len(evaluation) == 9
    assert len(items) >= 2000 and min(counts.values()) >= 150, counts
    assert every(i.source for i in items)
    sources = Counter(i.source.split(" ")[0] for i in items)
    assert sources["written"] >= 1000 and sources["derived"] >= 300, sources
    assert every(i.turns for i in items if i.category == "conversation")


def test_the_chat_training_prompts_hold_no_exact_or_near_duplicates():
    items = chat_data.read_items(smollm2.CHAT_TRAIN_PROMPTS)
    assert smollm2.near_duplicates([i.text() for i in items]) == []


def test_the_chat_training_prompts_stay_apart_from_every_evaluation_set():
    for eval_path in smollm2.EVALUATION_SETS:
        smollm2.check_prompts_apart(smollm2.CHAT_TRAIN_PROMPTS, eval_path)


def test_the_held_back_requests_cover_every_category_and_stay_apart_from_the_evaluation_mix():
    held_back = chat_data.read_items(smollm2.CHAT_HELDBACK_PROMPTS)
    mix = {i.category for i in chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS)}
    assert {i.category for i in held_back} == mix and all(i.source for i in held_back)
    assert min(sum(i.category == c for i in held_back) for c in mix) >= 4
    smollm2.check_prompts_apart(smollm2.CHAT_EVAL_PROMPTS, smollm2.CHAT_HELDBACK_PROMPTS)


def test_near_duplicates_finds_copies_changes_of_case_and_rewordings_and_the_dedup_keeps_the_first():
    texts = [
        "Write a short poem about the migration of birds in autumn.",
        "Translate into French: the museum is closed on Mondays.",
        "WRITE a short poem about the migration of birds in autumn!",
        "Write a short poem about the migration of the birds in late autumn.",
        "Write a haiku about wind turbines on a hill.",
    ]
    assert smollm2.near_duplicates(texts) == [(0, 2), (0, 3), (2, 3)]
    kept = chat_train_prompts.without_duplicates([chat_data.PromptItem(t) for t in texts])
    assert [k.prompt for k in kept] == [texts[0], texts[1], texts[4]]


def test_a_training_file_with_an_evaluation_item_appended_is_refused(tmp_path):
    leaked = tmp_path / "train.jsonl"
    item = next(i for i in chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS) if i.category == "advice")
    leaked.write_text(smollm2.CHAT_TRAIN_PROMPTS.read_text() + json.dumps({"prompt": item.prompt}) + "\n")
    with pytest.raises(ValueError, match="comes too close to"):
        smollm2.check_apart_from_evaluation(leaked)
