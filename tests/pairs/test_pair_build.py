"""The model pairs' build (the pairs package) and the committed default pair it produced."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from dsd.pair_manifest import PairIntegrityError, verify_pair
from pairs import build, chat_draft, common, corpus, smollm2, stdlib_gpt2, train
from pairs.stdlib_gpt2 import PairBuildConfig, quick_config
from tests.checks import every

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIR = REPO / "models" / "default-pair"

SNIPPET = (
    "def área(r: float) -> float:\n"
    '\t"""Tabs, unicode ☃, trailing spaces   \n'
    '    and  double  spaces ."""\n'
    "    return 3.14159 * r ** 2  # done\r\n"
    "\n\n"
)


@pytest.fixture(scope="module")
def quick_pair(tmp_path_factory) -> tuple[Path, dict]:
    out_dir = tmp_path_factory.mktemp("pair") / "quick-pair"
    manifest = stdlib_gpt2.build_pair(quick_config(out_dir))
    return out_dir, manifest


def copy_pair(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


# ---- the quick build, end to end ---------------------------------------------------------------


def test_quick_build_writes_the_documented_layout(quick_pair):
    out_dir, manifest = quick_pair
    for name in [
        "manifest.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "target/config.json",
        "target/model.safetensors",
        "draft/config.json",
        "draft/model.safetensors",
    ]:
        assert (out_dir / name).is_file(), name
    assert not out_dir.with_name(out_dir.name + ".building").exists()
    assert json.loads((out_dir / "manifest.json").read_text()) == manifest


def test_quick_build_models_load_and_match_the_manifest(quick_pair):
    out_dir, manifest = quick_pair
    target = transformers.AutoModelForCausalLM.from_pretrained(out_dir / "target")
    draft = transformers.AutoModelForCausalLM.from_pretrained(out_dir / "draft")
    assert train.param_count(target) == manifest["target"]["params"]
    assert train.param_count(draft) == manifest["draft"]["params"]
    assert manifest["draft"]["params"] < manifest["target"]["params"]
    for model in (target, draft):
        assert model.config.vocab_size == manifest["vocab_size"] == 512
        assert model.config.eos_token_id == manifest["eos_token_id"]
    ids = torch.tensor([[1, 2, 3, manifest["eos_token_id"]]])
    assert target(input_ids=ids).logits.shape == (1, 4, 512)
    assert draft(input_ids=ids).logits.shape == (1, 4, 512)


def test_quick_build_tokenizer_round_trips_python_source_exactly(quick_pair):
    out_dir, manifest = quick_pair
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(out_dir)
    for tok in (fast, auto):
        ids = tok.encode(SNIPPET)
        assert tok.decode(ids) == SNIPPET
        assert max(ids) < manifest["vocab_size"]
    assert auto.eos_token_id == manifest["eos_token_id"]
    assert auto.encode(train.EOS_TOKEN) == [manifest["eos_token_id"]]


def test_quick_build_manifest_records_params_hashes_and_figures(quick_pair):
    out_dir, manifest = quick_pair
    params = manifest["build_params"]
    assert params["seed"] == 1234 and params["target_steps"] == 3 and params["seq_len"] == 64
    assert "out_dir" not in params
    assert len(manifest["corpus"]["sha256"]) == 64
    assert manifest["corpus"]["files_train"] > 10 * manifest["corpus"]["files_heldout"] > 0
    assert set(manifest["phases_s"]) == {"corpus", "tokenizer", "encode", "target", "draft", "eval", "save"}
    assert manifest["build_s"] >= sum(manifest["phases_s"].values()) * 0.99
    assert 0.0 <= manifest["greedy_agreement"] <= 1.0
    assert manifest["versions"]["torch"] == torch.__version__
    assert {"target/model.safetensors", "draft/model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert verify_pair(out_dir) == manifest


def test_summary_line_is_key_value_pairs_with_agreement_and_build_time(quick_pair):
    out_dir, manifest = quick_pair
    fields = dict(kv.split("=", 1) for kv in build.summary_line(manifest, out_dir).split())
    assert float(fields["agreement"]) == pytest.approx(manifest["greedy_agreement"], abs=1e-4)
    assert float(fields["build_s"]) == pytest.approx(manifest["build_s"], abs=0.1)
    assert int(fields["target_params"]) == manifest["target"]["params"]


def test_build_refuses_to_overwrite_without_force(quick_pair):
    out_dir, _ = quick_pair
    with pytest.raises(FileExistsError, match="--force"):
        stdlib_gpt2.build_pair(quick_config(out_dir))


def test_torch_settings_apply_inside_and_restore_afterwards():
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with common.torch_settings(threads=2):
        assert torch.get_num_threads() == 2
        assert torch.are_deterministic_algorithms_enabled()
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before


@pytest.mark.slow
def test_quick_build_is_reproducible(quick_pair, tmp_path):
    out_dir, manifest = quick_pair
    again = stdlib_gpt2.build_pair(quick_config(tmp_path / "again"))
    for name in ["tokenizer.json", "target/model.safetensors", "draft/model.safetensors"]:
        assert again["files"][name]["sha256"] == manifest["files"][name]["sha256"], name
    assert again["greedy_agreement"] == manifest["greedy_agreement"]


# ---- verify_pair -------------------------------------------------------------------------------


def test_verify_pair_detects_a_tampered_file(quick_pair, tmp_path):
    pair = copy_pair(quick_pair[0], tmp_path)
    weights = pair / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(PairIntegrityError, match="sha256 mismatch: draft/model.safetensors"):
        verify_pair(pair)


def test_verify_pair_detects_a_missing_file(quick_pair, tmp_path):
    pair = copy_pair(quick_pair[0], tmp_path)
    (pair / "tokenizer.json").unlink()
    with pytest.raises(PairIntegrityError, match="missing: tokenizer.json"):
        verify_pair(pair)


def test_verify_pair_detects_an_unlisted_file(quick_pair, tmp_path):
    pair = copy_pair(quick_pair[0], tmp_path)
    (pair / "target" / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(PairIntegrityError, match="not in manifest: target/model.safetensors"):
        verify_pair(pair)


def test_verify_pair_rejects_a_folder_without_manifest(tmp_path):
    with pytest.raises(PairIntegrityError, match="manifest.json: missing"):
        verify_pair(tmp_path)


# ---- configuration and command line ------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", 0),
        ("vocab_size", 100),
        ("target_steps", -1),
        ("draft_steps", 2.5),
        ("batch_size", True),
        ("target_lr", 0.0),
        ("heldout_pct", 0),
        ("heldout_pct", 75.0),
        ("distill_kl_weight", 1.5),
        ("precision", "fp16"),
        ("seed", -3),
        ("threads", 0),
    ],
)
def test_config_rejects_bad_values_naming_field_and_value(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"{field}.*{value!r}"):
        PairBuildConfig(out_dir=tmp_path, **{field: value})


def test_config_rejects_heads_that_do_not_divide_the_width(tmp_path):
    with pytest.raises(ValueError, match="draft_d_model=128 is not divisible by draft_heads=3"):
        PairBuildConfig(out_dir=tmp_path, draft_heads=3)


def test_config_rejects_sequences_longer_than_the_position_table(tmp_path):
    with pytest.raises(ValueError, match="seq_len=2048 exceeds n_positions=1024"):
        PairBuildConfig(out_dir=tmp_path, seq_len=2048)


def test_config_rejects_misspelt_options(tmp_path):
    with pytest.raises(TypeError):
        PairBuildConfig(out_dir=tmp_path, target_step=10)


def test_cli_quick_and_overrides_map_onto_the_config(tmp_path):
    config = build.parse_args(["--out", str(tmp_path), "--quick", "--draft-steps", "7"])
    assert config == quick_config(tmp_path, draft_steps=7)
    full = build.parse_args(["--out", str(tmp_path), "--force"])
    assert full == PairBuildConfig(out_dir=tmp_path, overwrite=True)
    with pytest.raises(SystemExit):
        build.parse_args(["--out", str(tmp_path), "--target-step", "3"])


def test_bf16_only_when_asked_or_on_amx():
    assert common.resolve_bf16("auto", {"avx2", "amx_bf16"})
    assert not common.resolve_bf16("auto", {"avx2", "avx512f"})
    assert common.resolve_bf16("bf16", set())
    assert not common.resolve_bf16("fp32", {"amx_bf16"})


# ---- corpus and training helpers ---------------------------------------------------------------


def test_heldout_split_is_by_path_and_about_the_asked_share():
    paths = [f"pkg{i}/mod{i}.py" for i in range(4000)]
    share = sum(corpus.is_heldout(p, 5.0) for p in paths) / len(paths)
    assert 0.04 < share < 0.06
    assert [corpus.is_heldout(p, 5.0) for p in paths[:50]] == [corpus.is_heldout(p, 5.0) for p in paths[:50]]


def test_corpus_excludes_site_packages_and_is_sorted():
    sources = corpus.list_sources(corpus.stdlib_dir())
    rel = [p.relative_to(corpus.stdlib_dir()).as_posix() for p in sources]
    assert rel == sorted(rel, key=lambda r: r.split("/"))
    assert not any("site-packages" in r.split("/") for r in rel)
    assert "os.py" in rel


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [train.lr_at(s, 100, 1.0, 10) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0)
    assert every(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01)


def test_distill_loss_is_zero_kl_for_identical_logits():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    assert train.distill_loss(logits, logits, ids, 1.0, 2.0).item() == pytest.approx(0.0, abs=1e-6)
    assert train.distill_loss(logits, torch.zeros_like(logits), ids, 1.0, 1.0) > 0


def test_greedy_agreement_is_one_for_a_model_with_itself():
    config = train.gpt2_config(64, 1, 16, 2, 32, eos_token_id=0)
    model = train.new_model(config, seed=0).eval()
    stream = np.arange(100) % 64
    assert train.greedy_agreement(model, model, stream, 64, 16) == 1.0


# ---- the committed default pair ----------------------------------------------------------------


@pytest.mark.model
def test_committed_default_pair_verifies_and_loads():
    tokenizer, target, draft, manifest = common.load_pair(DEFAULT_PAIR)
    assert manifest["greedy_agreement"] >= 0.5
    assert manifest["vocab_size"] == 4096 == target.config.vocab_size == draft.config.vocab_size
    assert tokenizer.eos_token_id == manifest["eos_token_id"]
    assert tokenizer.decode(tokenizer.encode(SNIPPET)) == SNIPPET
    assert train.param_count(target) == manifest["target"]["params"]
    assert train.param_count(draft) == manifest["draft"]["params"]


@pytest.mark.model
def test_committed_default_pair_agrees_on_heldout_text():
    manifest = verify_pair(DEFAULT_PAIR)
    tok = Tokenizer.from_file(str(DEFAULT_PAIR / "tokenizer.json"))
    docs = corpus.read_corpus(corpus.stdlib_dir(), manifest["build_params"]["heldout_pct"])
    stream = train.encode_prefix(tok, [d.text for d in docs.heldout], manifest["eos_token_id"], 4096)
    target = transformers.AutoModelForCausalLM.from_pretrained(DEFAULT_PAIR / "target").eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(DEFAULT_PAIR / "draft").eval()
    seq_len = manifest["build_params"]["seq_len"]
    assert train.greedy_agreement(draft, target, stream, 4096, seq_len) >= 0.5


# ---- the optional SmolLM2 pair (pairs.smollm2) ----------------------------------------------


def tiny_llama() -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_new_draft_keeps_the_first_layers_and_the_kept_tokens_rows():
    from dsd.backends.vocab_map import VocabMap

    target = tiny_llama()
    vocab = VocabMap([2, 3, 5, 7, 11], 64)
    draft = chat_draft.new_draft(target, chat_draft.ChatDraftConfig(layers=2, vocab_keep=5), vocab)
    assert draft.config.num_hidden_layers == 2 and draft.config.vocab_size == 6
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    assert torch.equal(draft.model.embed_tokens.weight[:5], target.model.embed_tokens.weight[[2, 3, 5, 7, 11]])
    assert draft.lm_head.weight is draft.model.embed_tokens.weight


def test_distillation_moves_a_draft_towards_the_target_answers():
    """A few steps on the target's own (here: tiny, random) answers lower the distillation loss."""
    from dsd.backends.vocab_map import VocabMap
    from pairs.chat_data import ChatSample

    target = tiny_llama()
    rng = np.random.default_rng(0)
    samples = []
    with torch.no_grad():
        for i in range(8):
            prompt = rng.integers(1, 64, size=5).tolist()
            answer = rng.integers(1, 64, size=6).tolist()
            logits = target(input_ids=torch.tensor([prompt + answer[:-1]])).logits[0, 4:]
            top = torch.topk(logits, 8, dim=-1)
            samples.append(
                ChatSample(prompt, answer, top.indices.numpy().astype(np.int32), top.values.numpy().astype(np.float16))
            )
    vocab = VocabMap(chat_draft.frequent_tokens(samples, 48, [0]), 64)
    config = chat_draft.ChatDraftConfig(layers=1, vocab_keep=48, epochs=30, batch_size=4, lr=3e-3, warmup_steps=2)
    draft = chat_draft.new_draft(target, config, vocab)
    losses = chat_draft.train_draft(draft, samples, vocab, config)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])


def test_a_position_whose_top_tokens_the_draft_does_not_keep_leaves_the_loss_finite():
    unknown = 10
    picked = torch.randn(3, unknown, requires_grad=True)
    top_ids = torch.tensor([[1, 2], [unknown, unknown], [3, unknown]])
    top_logits, sampled = torch.randn(3, 2), torch.tensor([1, unknown, 3])
    loss = chat_draft.position_loss(picked, top_ids, top_logits, sampled, unknown, 0.8, 4.0, 0.7)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(picked.grad).all() and not picked.grad[1].any()
    kept = [0, 2]  # the position left out: the same loss as without it
    same = chat_draft.position_loss(
        picked[kept], top_ids[kept], top_logits[kept], sampled[kept], unknown, 0.8, 4.0, 0.7
    )
    assert float(same) == pytest.approx(float(loss))
    only = chat_draft.position_loss(picked[1:2], top_ids[1:2], top_logits[1:2], sampled[1:2], unknown, 0.8, 4.0, 0.7)
    assert float(only) == 0.0


def test_acceptance_term_is_the_overlap_of_the_two_tempered_distributions():
    """sum_x min(p_T, q_T): 1 for equal logits, the closed form for two tokens, and the loss's
    term falls as the draft's logits move towards the target's."""
    from pairs.chat_draft import Batch, acceptance, distill_loss

    logits = torch.tensor([[2.0, 0.0, -1.0]])
    ids, known = torch.tensor([[0, 1, 2]]), torch.ones(1, 3, dtype=torch.bool)
    assert acceptance(logits, logits, ids, known, 0.7).item() == pytest.approx(1.0)
    p = torch.softmax(torch.tensor([1.0, 0.0]) / 0.5, 0)
    q = torch.softmax(torch.tensor([0.0, 1.0]) / 0.5, 0)
    two = acceptance(
        torch.tensor([[0.0, 1.0]]),
        torch.tensor([[1.0, 0.0]]),
        torch.tensor([[0, 1]]),
        torch.ones(1, 2, dtype=torch.bool),
        0.5,
    )
    assert two.item() == pytest.approx(torch.minimum(p, q).sum().item())
    batch = Batch(
        torch.zeros(1, 1, dtype=torch.long),
        torch.ones(1, 1, dtype=torch.long),
        torch.tensor([0]),
        torch.tensor([0]),
        ids,
        logits,
        torch.tensor([0]),
    )
    far = torch.tensor([[[-1.0, 0.0, 2.0, 0.0]]])
    near = torch.tensor([[[1.5, 0.0, -0.5, 0.0]]])
    only_tvd = [distill_loss(x, batch, 3, 0.0, 1.0, 0.7) - distill_loss(x, batch, 3, 0.0, 0.0) for x in (far, near)]
    assert 0 < only_tvd[1] < only_tvd[0] <= 1.0
    with pytest.raises(ValueError, match="tvd_weight"):
        chat_draft.ChatDraftConfig(tvd_weight=-1.0)


def test_save_dequantized_round_trips_through_from_pretrained(tmp_path):
    target = tiny_llama()
    target.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf"}
    smollm2.save_dequantized(target, tmp_path / "target")
    saved = json.loads((tmp_path / "target" / "config.json").read_text())
    assert "quantization_config" not in saved
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    assert torch.equal(loaded(input_ids=ids).logits, target(input_ids=ids).logits)


def test_smollm2_config_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match=r"draft_layers.*0"):
        smollm2.Smollm2PairConfig(out_dir=tmp_path, draft_layers=0)
    with pytest.raises(ValueError, match=r"kl_weight.*2"):
        smollm2.Smollm2PairConfig(out_dir=tmp_path, kl_weight=2)
    with pytest.raises(ValueError, match=r"tvd_weight.*-1"):
        smollm2.Smollm2PairConfig(out_dir=tmp_path, tvd_weight=-1.0)


def test_cli_family_smollm2_rejects_options_of_the_other_family(tmp_path):
    config = build.parse_args(
        ["--out", str(tmp_path), "--family", "smollm2", "--epochs", "2", "--data-rounds", "2", "--tvd-weight", "4"]
    )
    assert config == smollm2.Smollm2PairConfig(out_dir=tmp_path, epochs=2.0, data_rounds=2, tvd_weight=4.0)
    for option in (["--target-steps", "9"], ["--draft-steps", "9"]):
        with pytest.raises(SystemExit):
            build.parse_args(["--out", str(tmp_path), "--family", "smollm2", *option])
    with pytest.raises(SystemExit):
        build.parse_args(["--out", str(tmp_path), "--epochs", "2"])
    with pytest.raises(SystemExit):
        build.parse_args(["--out", str(tmp_path), "--data-rounds", "2"])


def test_every_training_prompts_file_stays_apart_from_every_evaluation_set():
    from pairs import chat_data

    train_files = sorted((REPO / "workloads").glob("train_instructions*.jsonl"))
    assert smollm2.TRAIN_PROMPTS in train_files and smollm2.WIDE_TRAIN_PROMPTS in train_files
    for path in train_files:
        train = chat_data.read_prompts(path)
        assert len(set(train)) == len(train) >= 200, path
        for eval_path in smollm2.EVALUATION_SETS:
            smollm2.check_prompts_apart(path, eval_path)
    evaluation = chat_data.read_prompts(smollm2.EVAL_PROMPTS)
    assert len(set(evaluation)) == len(evaluation) >= 40


def test_prompts_that_copy_or_reword_an_evaluation_item_are_refused(tmp_path):
    from pairs import chat_data

    chat = chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS)
    passage = next(i for i in chat if i.category == "summarization").prompt.split("\n\n")[1]
    reply = next(i for i in chat if i.turns).turns[1][1]
    leaks = [
        ("  " + chat_data.read_prompts(smollm2.EVAL_PROMPTS)[3].upper(), smollm2.EVAL_PROMPTS),
        (f"Rewrite this more formally: {' '.join(passage.split()[20:30])} and so on.", smollm2.CHAT_EVAL_PROMPTS),
        (f"Is this a good answer? {' '.join(reply.split()[:12])}", smollm2.CHAT_EVAL_PROMPTS),
        ("TIPS for staying productive when working from home, please!", smollm2.CHAT_EVAL_PROMPTS),
    ]
    leaked = tmp_path / "train.jsonl"
    for leak, evaluation in leaks:
        leaked.write_text(json.dumps({"prompt": "Something else."}) + "\n" + json.dumps({"prompt": leak}) + "\n")
        with pytest.raises(ValueError, match="comes too close to"):
            smollm2.check_prompts_apart(leaked, evaluation)
    apart = tmp_path / "apart.jsonl"  # a shared 9-word opening is a template, not a copy
    apart.write_text(json.dumps({"prompt": "Write a Python function that returns the n-th prime."}) + "\n")
    smollm2.check_prompts_apart(apart, smollm2.EVAL_PROMPTS)


def test_the_chat_evaluation_mix_spans_the_categories_with_provenance_on_every_line():
    from collections import Counter

    from pairs import chat_data

    items = chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS)
    counts = Counter(i.category for i in items)
    assert len(items) >= 200 and len({i.text() for i in items}) == len(items)
    assert set(counts) >= {
        "writing",
        "conversation",
        "explanation",
        "advice",
        "summarization",
        "extraction",
        "math",
        "coding",
        "translation",
    }
    assert min(counts.values()) >= 15, counts
    assert every(i.source.startswith("written for this project, 20") for i in items)
    assert every(i.turns for i in items if i.category == "conversation")


def test_an_item_with_earlier_turns_renders_them_through_the_chat_template_before_its_prompt():
    from transformers import AutoTokenizer

    from pairs import chat_data

    tokenizer = AutoTokenizer.from_pretrained(REPO / "models" / "smollm2-chat")
    item = next(i for i in chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS) if i.turns)
    text = tokenizer.decode(chat_data.render(tokenizer, item.prompt, item.turns))
    (_, first), (_, reply) = item.turns
    assert text.index(first) < text.index(reply) < text.index(item.prompt)
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|im_start|>user") == 2
    items = chat_data.read_items(smollm2.CHAT_EVAL_PROMPTS)
    rendered = chat_data.render_file(tokenizer, smollm2.CHAT_EVAL_PROMPTS)
    assert rendered[items.index(item)] == chat_data.render(tokenizer, item.prompt, item.turns)


def test_a_prompts_line_with_an_unknown_key_or_turns_out_of_order_is_refused(tmp_path):
    from pairs import chat_data

    path = tmp_path / "prompts.jsonl"
    bad = [
        ({"prompt": "Hi.", "categroy": "writing"}, "unknown key"),
        ({"prompt": "Hi.", "turns": [{"role": "assistant", "content": "Hello."}]}, "'turns' must"),
        ({"prompt": "Hi.", "turns": [{"role": "user", "content": "Hello."}]}, "'turns' must"),
        ({"prompt": "Hi.", "source": 3}, "'source' must be a string"),
    ]
    for record, message in bad:
        path.write_text(json.dumps(record) + "\n")
        with pytest.raises(ValueError, match=message):
            chat_data.read_items(path)
    path.write_text(
        json.dumps(
            {
                "prompt": "And in May?",
                "turns": [{"role": "user", "content": "Rain in April?"}, {"role": "assistant", "content": "Often."}],
            }
        )
        + "\n"
    )
    assert chat_data.read_items(path) == [
        chat_data.PromptItem("And in May?", (("user", "Rain in April?"), ("assistant", "Often.")))
    ]
    assert chat_data.read_prompts(path) == ["And in May?"]


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_quick_build_loads_and_verifies_and_a_second_trains_on_from_its_draft(tmp_path):
    try:
        smollm2.find_gguf()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": p}) + "\n"
            for p in ["Name a colour.", "Say hello.", "Count to three.", "Name a fruit."]
        )
    )
    manifest = smollm2.build_smollm2_pair(smollm2.quick_config(tmp_path / "pair", prompts_path=prompts))
    tokenizer, target, draft, loaded = common.load_pair(tmp_path / "pair")
    assert loaded == manifest
    assert target.config.num_hidden_layers == 30 and draft.config.num_hidden_layers == 1
    assert tokenizer.decode(tokenizer.encode(SNIPPET, add_special_tokens=False)) == SNIPPET
    assert 0.0 <= manifest["heldout_alpha"]["sampled"] <= 1.0
    assert manifest["step_times"]["t_draft_over_t_ar"] > 0

    from dsd.pair_manifest import sha256_file

    first = tmp_path / "pair" / "draft"
    continued = smollm2.build_smollm2_pair(
        smollm2.quick_config(tmp_path / "continued", prompts_path=prompts, init_draft=first, seed=7)
    )
    start = continued["continued_from"]
    assert start["draft_sha256"] == sha256_file(first / "model.safetensors") and start["manifest_git_commit"]
    assert 0.0 <= start["heldout_alpha_before"]["sampled"] <= 1.0
    assert (tmp_path / "continued" / "draft" / "vocab_map.json").read_text() == (first / "vocab_map.json").read_text()
    assert continued["build_params"]["init_draft"] == str(first)
    assert sha256_file(tmp_path / "continued" / "draft" / "model.safetensors") != start["draft_sha256"]
    for wrong, error in (
        (dict(init_draft=first, draft_layers=2), "draft_layers"),
        (dict(init_draft=tmp_path), "lacks"),
    ):
        with pytest.raises(ValueError, match=error):
            smollm2.build_smollm2_pair(smollm2.quick_config(tmp_path / "wrong", prompts_path=prompts, **wrong))
        assert not (tmp_path / "wrong").exists()


# ---- package boundaries ------------------------------------------------------------------------


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_decoding_core_does_not_import_the_training_package():
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "dsd").rglob("*.py")
        if any(m == "pairs" or m.startswith("pairs.") for m in imported_modules(p))
    ]
    assert offenders == []


# a family is a module of pairs/ that pairs.build runs (its --family choices); the feature draft's
# family builds on the layer pair's (the same target, prompt sets and checks), by design
BUILDS_ON = {"pairs.smollm2_eagle": {"pairs.smollm2"}}


def test_pair_families_import_neither_each_other_nor_the_command_line():
    """A family imports no other family (but the one it builds on) and not pairs.build; the
    shared modules the families import (training, corpora, chat data) import no family, so no
    family reaches another through them. Tools over a family (its prompts, scores) may."""
    from pairs import build

    families = {f"pairs.{choice.replace('-', '_')}" for choice in build.FAMILY_CHOICES}
    assert {"pairs.stdlib_gpt2", "pairs.smollm2", "pairs.smollm2_eagle"} <= families
    imports = {f"pairs.{p.stem}": imported_modules(p) for p in (REPO / "pairs").glob("*.py")}
    shared = {m for f in families for m in imports[f] if m in imports and m not in families}
    assert {"pairs.common", "pairs.train", "pairs.chat_data"} <= shared
    for family in families:
        others = families - {family} - BUILDS_ON.get(family, set())
        assert not imports[family] & (others | {"pairs.build"}), (family, imports[family] & others)
    for module in shared:
        assert not imports[module] & (families | {"pairs.build"}), (module, imports[module] & families)


def test_dsdbed_build_pair_hands_every_option_to_the_build(capsys):
    from orchestrator import cli

    # Refused by pairs.build's own parser, before anything is built: the options got there.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build-pair", "--out", "/nonexistent/pair", "--family", "smollm2", "--target-steps", "3"])
    assert exit_info.value.code == 2
    assert "--target-steps does not apply to --family smollm2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["analyze", "results/x", "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_scoring_a_folder_without_target_and_draft_is_one_clear_error(tmp_path, capsys):
    from pairs import score

    with pytest.raises(SystemExit):
        score.main(["--pair", str(tmp_path), "--prompts", str(smollm2.EVAL_PROMPTS)])
    assert "expected target/ and draft/" in capsys.readouterr().err


class _ToyChatTokenizer:
    """The two things chat_data needs of a tokenizer, over tiny_llama's 64 ids."""

    pad_token_id, eos_token_id = 0, 1

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return [2 + ord(c) % 60 for c in messages[0]["content"][:8]]


def test_answering_resumes_from_its_partial_file_exactly_where_it_stopped(tmp_path, monkeypatch):
    from pairs import chat_data

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["one", "two two", "three"]))
    config = chat_data.ChatDataConfig(
        prompts, samples_per_prompt=2, max_new_tokens=4, top_logits=4, batch_size=2, seed=5
    )
    target, tokenizer = tiny_llama(), _ToyChatTokenizer()
    whole = chat_data.answer_prompts(target, tokenizer, config)

    partial, real_batch, calls = tmp_path / "answers.partial.npz", chat_data.answer_batch, []

    def stop_at_the_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(chat_data, "answer_batch", stop_at_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        chat_data.answer_prompts(target, tokenizer, config, partial)
    monkeypatch.undo()
    assert len(chat_data.load_samples(partial)) == 4
    resumed = chat_data.answer_prompts(target, tokenizer, config, partial)
    assert [s.answer_ids for s in resumed] == [s.answer_ids for s in whole]
    assert every(np.array_equal(a.top_ids, b.top_ids) for a, b in zip(resumed, whole))

    prompts.write_text(json.dumps({"prompt": "another"}) + "\n")
    with pytest.raises(ValueError, match="delete it"):
        chat_data.answer_prompts(target, tokenizer, config, partial)
