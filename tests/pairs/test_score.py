"""pairs.score on the tiny pairs the other tests build: a layer draft and a feature draft, scored
overall and per category, at a dtype given or timed here."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from dsd.backends.eagle_model import load_eagle
from dsd.backends.vocab_map import VocabMap
from dsd.analytic.latency_model import alpha_for_tokens_per_round, tokens_per_round_by_step
from dsd.pair_manifest import MANIFEST_FORMAT, write_manifest
from pairs import chat_data, chat_draft, eagle_draft, score
from tests.dsd.test_feature_draft import VOCAB, saved_pair, tiny_target

PROMPTS = [
    {"prompt": "sun rain sun", "category": "weather"},
    {"prompt": "rain rain", "category": "weather"},
    {
        "prompt": "sun",
        "turns": [{"role": "user", "content": "rain sun"}, {"role": "assistant", "content": "sun sun rain"}],
        "category": "talk",
    },
    {"prompt": "rain sun rain sun", "category": "talk"},
    {"prompt": "sun sun", "category": "talk"},
]


def save_tokenizer(folder) -> None:
    """A word-level tokenizer over the tiny pairs' six ids, with a chat template."""
    words = {"<eos>": 0, "<unk>": 1, "user": 2, "assistant": 3, "sun": 4, "rain": 5}
    assert len(words) == VOCAB
    backend = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    tokenizer.save_pretrained(folder)


def layer_pair(folder, draft_layers: int):
    target = tiny_target()
    vocab = VocabMap(list(range(VOCAB)), VOCAB)
    draft = chat_draft.new_draft(target, chat_draft.ChatDraftConfig(layers=draft_layers, vocab_keep=VOCAB), vocab)
    target.save_pretrained(folder / "target")
    draft.save_pretrained(folder / "draft")
    vocab.save(folder / "draft")
    save_tokenizer(folder)
    write_manifest(folder, {"format": MANIFEST_FORMAT})
    return folder


def feature_pair(folder):
    saved_pair(folder)
    save_tokenizer(folder)
    return folder


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def answers_of(config: score.ScoreConfig):
    """The target's answers as score_pair has them: same prompts, sampling and seed."""
    tokenizer = AutoTokenizer.from_pretrained(config.pair)
    target = AutoModelForCausalLM.from_pretrained(config.pair / "target").eval()
    data = chat_data.ChatDataConfig(
        config.prompts,
        samples_per_prompt=1,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_logits=1,
        seed=config.seed,
    )
    return target, chat_data.answer_prompts(target, tokenizer, data)


def test_a_layer_draft_is_scored_per_category_and_overall_as_on_all_answers_at_once(tmp_path, prompts):
    config = score.ScoreConfig(layer_pair(tmp_path / "pair", 1), prompts, max_new_tokens=6)
    record = score.score_pair(config)
    assert record["draft_kind"] == "causal_lm" and record["answers"] == 5
    categories = record["by_category"]
    assert list(categories) == ["weather", "talk"] and [c["answers"] for c in categories.values()] == [2, 3]
    target, answers = answers_of(config)
    draft = AutoModelForCausalLM.from_pretrained(config.pair / "draft").eval()
    vocab = VocabMap.load(config.pair / "draft")
    whole = chat_draft.heldout_acceptance(draft, target, vocab, answers, 0.7, None, 0.9)
    weather = chat_draft.heldout_acceptance(draft, target, vocab, answers[:2], 0.7, None, 0.9)
    assert record["positions"] == whole.positions == sum(len(a.answer_ids) for a in answers)
    assert record["alpha_sampled"] == pytest.approx(whole.alpha_sampled, abs=1e-4)
    assert categories["weather"]["alpha_sampled"] == pytest.approx(weather.alpha_sampled, abs=1e-4)
    assert 0.0 < record["alpha_sampled"] < 1.0 and 0.0 <= record["alpha_greedy"] <= 1.0


def test_a_layer_draft_that_is_the_whole_target_is_always_accepted(tmp_path, prompts):
    record = score.score_pair(score.ScoreConfig(layer_pair(tmp_path / "pair", 3), prompts, max_new_tokens=6))
    assert record["alpha_greedy"] == 1.0
    assert record["alpha_sampled"] == pytest.approx(1.0, abs=1e-3)


def test_a_feature_draft_is_scored_by_step_and_its_alpha_gives_the_same_tokens_per_round(tmp_path, prompts):
    config = score.ScoreConfig(feature_pair(tmp_path / "pair"), prompts, max_new_tokens=6, gamma=3)
    record = score.score_pair(config)
    assert record["draft_kind"] == "eagle"
    target, answers = answers_of(config)
    eagle = load_eagle(config.pair / "draft", torch.float32)
    with torch.inference_mode():
        (steps,) = eagle_draft.heldout_acceptance(
            eagle, target, VocabMap.load(config.pair / "draft"), answers, 3, 0.7, 0.9
        ).values()
    assert record["alpha_sampled_by_step"] == pytest.approx(steps.sampled, abs=1e-4)
    assert record["alpha_greedy_by_step"] == pytest.approx(steps.greedy, abs=1e-4)
    assert record["positions"] == steps.positions[0] == sum(len(a.answer_ids) for a in answers)
    by_step = record["alpha_sampled_by_step"]
    assert record["alpha_sampled"] == pytest.approx(
        alpha_for_tokens_per_round(tokens_per_round_by_step(by_step), 3), abs=1e-3
    )
    assert min(by_step) - 1e-3 <= record["alpha_sampled"] <= max(by_step) + 1e-3
    talk = record["by_category"]["talk"]
    assert len(talk["alpha_sampled_by_step"]) == 3 and talk["answers"] == 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_command_scores_either_kind_of_pair_at_the_dtype_given_and_prints_a_table_of_categories(
    tmp_path, prompts, capsys, dtype
):
    for kind, pair in (("causal_lm", layer_pair(tmp_path / "layer", 1)), ("eagle", feature_pair(tmp_path / "eagle"))):
        assert (
            score.main(
                [
                    "--pair",
                    str(pair),
                    "--prompts",
                    str(prompts),
                    "--dtype",
                    dtype,
                    "--max-new-tokens",
                    "4",
                    "--threads",
                    "1",
                ]
            )
            == 0
        )
        out, err = capsys.readouterr()
        record = json.loads(out)
        assert (record["draft_kind"], record["dtype"], record["draft_dtype"]) == (kind, dtype, dtype)
        table = err.splitlines()[-3:]
        assert [row.split()[0] for row in table] == ["weather", "talk", "overall"]
        assert float(table[-1].split()[3]) == pytest.approx(record["alpha_sampled"], abs=1e-3)


def test_the_command_resolves_dtype_auto_by_timing_the_pair_here(tmp_path, prompts, capsys, monkeypatch):
    from dsd.backends import precision

    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache"))
    pair = feature_pair(tmp_path / "pair")
    assert score.main(["--pair", str(pair), "--prompts", str(prompts), "--max-new-tokens", "3", "--threads", "1"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["dtype"] in precision.CANDIDATES and record["draft_dtype"] in precision.CANDIDATES


def test_a_bad_option_is_named_by_its_flag(tmp_path, prompts, capsys):
    pair = layer_pair(tmp_path / "pair", 1)
    with pytest.raises(SystemExit):
        score.main(["--pair", str(pair), "--prompts", str(prompts), "--dtype", "float32", "--gamma", "0"])
    assert "--gamma must be a positive int, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        score.main(["--pair", str(pair), "--prompts", str(prompts), "--dtype", "float16"])


def test_a_stratified_sample_scores_the_first_items_of_each_category(tmp_path, prompts):
    config = score.ScoreConfig(layer_pair(tmp_path / "pair", 1), prompts, max_new_tokens=4, per_category=1)
    record = score.score_pair(config)
    assert record["answers"] == 2 and [c["answers"] for c in record["by_category"].values()] == [1, 1]
    items = chat_data.read_items(prompts)
    assert score.stratified(items, 1) == [items[0], items[2]] and score.stratified(items, 0) == items


def test_items_written_read_back_as_the_same_items(tmp_path):
    from pairs import smollm2

    items = chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS)
    chat_data.write_items(items, tmp_path / "copy.jsonl")
    assert chat_data.read_items(tmp_path / "copy.jsonl") == items
