"""The feature draft (dsd.backends.eagle_model, eagle_lm, feature_target) and the target's features
on their way to it (dsd.features, services.wire, services.wire_size), on a tiny Llama target:
encoding, sizes and int8's per-row scale; the training's rollout is the backend's drafting; the q
the verifier's rejection sampling uses is the q each token was drawn from; greedy DSD equals the
target's greedy tokens and sampled DSD is exact (chi-square) with the draft reading features."""

import json
import random

import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM

from dsd.drive import verifier_session
from dsd.backends.eagle_lm import EagleLM
from dsd.backends.eagle_model import save_eagle
from dsd.backends.feature_target import FeatureTorchLM, LayerTap
from dsd.backends.hf import HfBackendConfig
from dsd.backends.protocol import LogitsRequest, SamplingParams
from dsd.backends.torch_lm import TorchLM
from dsd.backends.vocab_map import VocabMap
from dsd.drive.generation import generate_ar
from dsd.features import FEATURE_DTYPES, FeatureBlock, ProvidesFeatures, TakesFeatures, decode, encode, encoded_bytes
from dsd.pair_manifest import MANIFEST_FORMAT, write_manifest
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from dsd.speculation.verification import probs_from_logits, sampling_probs
from pairs import eagle_draft
from services import wire, wire_size
from dsd.drive.driver import DriverConfig

VOCAB, PROMPT, LENGTH = 6, [1, 2, 3], 3
COSTS = LinkCosts(t_draft_s=0.001, t_verify_s=0.002, rtt_s=0.01)


def tiny_target(seed: int = 3) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(3.0)  # tied head: a spread-out next token
    return model


def tiny_pair(layers=(0, 1, 2), noise: float = 0.5, seed: int = 3):
    """(EagleLM, FeatureTorchLM) over a tiny Llama: the draft started as the build starts it,
    then moved off the identity so that it is often wrong."""
    target = tiny_target(seed)
    vocab = VocabMap(list(range(VOCAB)), VOCAB)
    model = eagle_draft.new_eagle(target, layers, vocab)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(noise * torch.randn_like(p) * p.abs().mean().clamp(min=0.05))
    draft = EagleLM(model.eval(), vocab, "eagle", 0)
    return draft, FeatureTorchLM(target, "target", 0, layers, model.fuse)


# ---- the features on the wire ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FEATURE_DTYPES)
def test_features_round_trip_in_each_dtype_with_the_size_the_header_says(dtype):
    values = torch.randn(5, 64) * torch.tensor([0.1, 1.0, 10.0, 100.0, 3.0])[:, None]
    data = encode(FeatureBlock(41, values), dtype)
    block, got_dtype = decode(data)
    assert (block.start, block.values.shape, got_dtype) == (41, (5, 64), dtype)
    assert len(data) == encoded_bytes(5, 64, dtype) == 9 + 5 * (128 if dtype == "bfloat16" else 64 + 4)
    if dtype == "bfloat16":
        assert torch.equal(block.values, values.to(torch.bfloat16).float())
    else:  # one scale per row, max |x| / 127: every row keeps its error within half its step
        step = values.abs().amax(-1, keepdim=True) / 127
        assert bool(((block.values - values).abs() <= step / 2 + 1e-6).all())
        assert float((block.values - values).abs().max()) > 0.01  # the large rows lose detail


def test_decoding_bytes_that_do_not_fit_their_header_is_an_error():
    data = encode(FeatureBlock(0, torch.ones(2, 8)), "int8")
    for bad in (data[:-1], data + b"\0", data[:5]):
        with pytest.raises(ValueError, match="features"):
            decode(bad)


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_a_verdict_with_features_round_trips_and_its_predicted_size_is_its_encoded_size(rows):
    features = encode(FeatureBlock(299, torch.randn(rows, 576)), "bfloat16")
    message = wire.Verified(1000, 3, 300, 4, rows - 1, 1234, False, 0.001, 0.002, 1, features)
    assert wire.decode(wire.encode(message)) == message
    vocab, rng = 49_152, random.Random(rows)
    sizes = [
        len(
            wire.encode(
                wire.Verified(1000 + i, 3, 300, 4, rows - 1, rng.randrange(vocab), False, 0.001, 0.002, 1, features)
            )
        )
        for i in range(200)
    ]
    predicted = wire_size.verified_bytes(vocab, 4, wire_size.FeatureWire(576, "bfloat16"), rows)
    assert predicted == pytest.approx(sum(sizes) / len(sizes), abs=0.5)
    int8 = wire_size.FeatureWire(576, "int8")
    grown = wire_size.verified_bytes(vocab, 4, int8, rows) - wire_size.verified_bytes(vocab, 4)
    assert grown == encoded_bytes(rows, 576, "int8") + 3 - 1  # a bin16 header, less the nil it replaces
    _, down = wire_size.round_wire_bytes(4, vocab, 0.0, features=int8, feature_rows=rows, acks=False)
    _, plain = wire_size.round_wire_bytes(4, vocab, 0.0, acks=False)
    assert down - plain == grown + 52 * (wire_size.segments(down) - 1) + (2 if grown + plain > 65_000 else 0)


def test_a_reply_without_features_costs_one_nil_byte_and_is_predicted_so():
    plain = wire.Verified(1000, 3, 300, 4, 2, 1234, False, 0.001, 0.002, 1)
    assert len(wire.encode(plain)) == pytest.approx(wire_size.verified_bytes(49_152, 4), abs=1)
    with pytest.raises(ValueError, match="FeatureWire.dtype"):
        wire_size.FeatureWire(576, "float16")


# ---- the draft and the target ------------------------------------------------------------------


def test_the_trainings_rollout_step_k_is_the_backends_kth_draft_step():
    """Training-time test as trained (EagleDraft.rollout) and as run (EagleLM): step k at a
    position is the draft's k-th token of a block that starts k positions earlier."""
    draft, _ = tiny_pair(noise=1.0)
    model = draft.model.double()
    draft = EagleLM(model, draft.vocab_map, "eagle", 0)
    tokens = [int(t) for t in torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(1))]
    features = torch.randn(12, 32, dtype=torch.float64)
    inputs = torch.cat([torch.zeros(1, 32, dtype=torch.float64), features[:-1]])[None]
    outputs = model.rollout(torch.tensor([tokens]), inputs, torch.arange(12)[None], 4)
    for known in (3, 6, 8):
        draft.release("s")
        draft.add_features("s", FeatureBlock(0, features[:known]))
        for k in range(4):
            got = draft.logits("s", tokens[: known + 1 + k], 1)[0]
            assert torch.allclose(got, model.logits(outputs[k][0, known + k]).to(got.dtype), atol=1e-5), (known, k)


def test_true_features_replace_the_drafts_own_at_the_positions_they_cover():
    draft, _ = tiny_pair()
    tokens = [1, 2, 3, 4, 5, 1, 2]
    features = torch.randn(7, 32)
    draft.add_features("s", FeatureBlock(0, features[:3]))
    before = draft.logits("s", tokens, 1)  # positions 4..6 read the draft's own
    assert draft.cached_length("s") == 7
    draft.add_features("s", FeatureBlock(3, features[3:5]))
    assert draft.cached_length("s") == 4  # position 4 read its own feature at 3
    after = draft.logits("s", tokens, 1)
    fresh, _ = tiny_pair()
    fresh.add_features("f", FeatureBlock(0, features[:5]))
    assert torch.allclose(after, fresh.logits("f", tokens, 1)) and not torch.allclose(before, after)
    with pytest.raises(ValueError, match="without gaps"):
        draft.add_features("s", FeatureBlock(9, features[:1]))


def test_the_target_keeps_the_feature_of_every_position_it_computed():
    draft, target = tiny_pair()
    assert isinstance(target, ProvidesFeatures) and isinstance(draft, TakesFeatures)
    assert not isinstance(TorchLM(tiny_target(), "plain", 0), ProvidesFeatures)
    tokens = [1, 2, 3, 4, 5, 0, 1]
    target.logits("s", tokens[:4], 1)
    target.logits("s", tokens, 3)  # a verification-like pass after the cache
    tap = LayerTap(target.model, (0, 1, 2))
    target.model(input_ids=torch.tensor([tokens]))
    want = draft.model.fuse_features(tap.stacked()[0].flatten(-2))
    tap.close()
    assert torch.allclose(target.features("s", 0, 7).values, want, atol=1e-5)
    target.crop("s", 5)
    with pytest.raises(ValueError, match="computed"):
        target.features("s", 2, 6)


# ---- decoding with it --------------------------------------------------------------------------


def test_the_q_the_verifier_uses_is_the_q_each_draft_token_was_drawn_from(monkeypatch):
    """Pipelined, so true features arrive while blocks drafted on the draft's own ones are in
    flight: each row of q a block carries to the verifier is the row its token was drawn from
    (the draft's last answer for that prefix before the verification), not what the draft says
    for that prefix once the features arrived."""
    draft, target = tiny_pair()
    sampling = SamplingParams(1.0, None, 11, 1.0)
    events = []  # ("draw", prefix, q) and ("verify", prefix, tokens, q)
    logits = draft.logits

    def recording(seq_id, tokens, n_last):
        out = logits(seq_id, tokens, n_last)
        if seq_id == "q":
            events.append(("draw", tuple(tokens), sampling_probs(out[-1:], sampling)[0]))
        return out

    monkeypatch.setattr(draft, "logits", recording)
    verify = verifier_session.VerifierSession.verify_job

    def spying(session, proposal):
        job = verify(session, proposal)
        if job is not None:  # a live block: drafted on the session's committed prefix
            prefix = tuple(session.committed.tokens[: proposal.start_pos])
            now = [
                sampling_probs(logits("q", prefix + proposal.draft_tokens[:i], 1), sampling)[0]
                for i in range(proposal.gamma)
            ]  # what the draft says for these prefixes now
            events.append(("verify", prefix, proposal.draft_tokens, proposal.draft_probs, now))
        return job

    monkeypatch.setattr(verifier_session.VerifierSession, "verify_job", spying)
    run = simulate_dsd(
        draft,
        target,
        PROMPT,
        StopRule(max_new_tokens=40),
        COSTS,
        DriverConfig(3, "pipelined", max_in_flight=2),
        sampling=sampling,
        seq_id="q",
    )
    assert len(run.generation.tokens) == 40
    checked = changed = 0
    for n, event in enumerate(events):
        if event[0] != "verify":
            continue
        _, prefix, tokens, q, now = event
        for i, token in enumerate(tokens):
            key = prefix + tuple(tokens[:i])
            draws = [e[2] for e in events[:n] if e[0] == "draw" and e[1] == key]
            assert draws and torch.equal(q[i], draws[-1]) and float(q[i][token]) > 0
            checked += 1
            changed += not torch.equal(q[i], now[i])
    assert checked >= 20
    assert changed > 0, "no row's features changed before its verification: the check proved nothing"


@pytest.mark.parametrize("mode", ["sync", "pipelined", "cached"])
def test_greedy_dsd_with_a_feature_draft_emits_the_targets_greedy_tokens(mode):
    draft, target = tiny_pair()
    stop = StopRule(max_new_tokens=20)
    expected = generate_ar(target, PROMPT, stop, seq_id="ar").tokens
    run = simulate_dsd(draft, target, PROMPT, stop, COSTS, DriverConfig(3, mode, max_in_flight=2), seq_id="g")
    assert run.generation.tokens == expected
    assert any(r.accepted > 0 for r in run.generation.rounds)
    if mode == "cached":  # the branches fork the draft's cache and features; some verdicts hit
        assert any(r.cache is not None and r.cache.hit for r in run.generation.rounds)


def test_a_forked_feature_draft_drafts_as_its_source_and_keeps_only_the_features_before_the_fork():
    draft, _ = tiny_pair()
    tokens = [1, 2, 3, 4, 5, 1, 2, 3]
    draft.add_features("s", FeatureBlock(0, torch.randn(6, draft.feature_width)))
    source = draft.logits("s", tokens, 1)
    draft.fork("s", "b", 7)
    assert draft.cached_length("b") == 7 and draft.known_features("b") == 6
    assert torch.equal(draft.logits("b", tokens, 1), source)  # position 7 fed again on the kept 0..6
    draft.fork("s", "c", 4)
    assert draft.known_features("c") == 4  # the features at 4, 5 described tokens 4, 5
    draft.add_features("s", FeatureBlock(6, torch.randn(2, draft.feature_width)))  # a verdict for "s" alone
    draft.move("c", "s")  # the branch was right: it keeps them
    assert draft.cached_length("c") == 0 and draft.known_features("s") == 8


def test_a_batch_of_sequences_drafts_in_one_pass_a_step_what_each_drafts_alone():
    """logits_batch: the sequences' catch-up passes one by one, then one pass for each drafting
    step of all of them (keys padded to the longest and masked), answers as logits alone."""
    draft, _ = tiny_pair(noise=1.0)
    model = draft.model.double()
    batched, alone = EagleLM(model, draft.vocab_map, "eagle", 0), EagleLM(model, draft.vocab_map, "eagle", 0)
    rng = torch.Generator().manual_seed(5)
    streams = {
        f"s{i}": [int(t) for t in torch.randint(0, VOCAB, (n,), generator=rng)] for i, n in enumerate((5, 9, 14))
    }
    for name, known in zip(streams, (2, 9, 6)):  # s1 knows a feature for every token
        block = FeatureBlock(0, torch.randn(known, 32, dtype=torch.float64, generator=rng))
        batched.add_features(name, block)
        alone.add_features(name, block)
    block = [3, 1, 4, 1]
    for step in range(4):  # a block of 4 draft tokens
        requests = [
            LogitsRequest(name, tokens + block[:step], 1 + (name == "s2" and step == 0))
            for name, tokens in streams.items()
        ]
        passes = batched.stats.passes
        got = batched.logits_batch(requests)
        if step:
            assert batched.stats.passes == passes + 1  # one pass for the three sequences' next token
        for r, rows in zip(requests, got):
            assert rows.shape == (r.n_last, VOCAB)
            assert torch.allclose(rows, alone.logits(r.seq_id, r.tokens, r.n_last), atol=1e-9), (step, r.seq_id)
    assert batched.logits_batch([]) == []
    with pytest.raises(ValueError, match="each sequence once"):
        batched.logits_batch([LogitsRequest("s0", [1, 2], 1), LogitsRequest("s0", [1, 2, 3], 1)])


def exact_distribution(target, temperature: float, top_p: float) -> dict[tuple, float]:
    result = {(): 1.0}
    for _ in range(LENGTH):
        grown = {}
        for seq, prob in result.items():
            with torch.no_grad():
                logits = target.model(torch.tensor([PROMPT + list(seq)])).logits[0, -1:]
            p = probs_from_logits(logits, temperature, None, top_p)[0]
            for token in range(VOCAB):
                if p[token] > 0:
                    grown[seq + (token,)] = prob * float(p[token])
        result = grown
    return result


@pytest.mark.slow
@pytest.mark.parametrize("mode,temperature,top_p", [("sync", 1.0, 1.0), ("pipelined", 0.8, 0.9), ("cached", 0.8, 0.9)])
def test_sampled_dsd_with_a_feature_draft_follows_the_targets_distribution(mode, temperature, top_p):
    draft, target = tiny_pair()
    n, counts, rounds = 600, {}, []
    for i in range(n):
        run = simulate_dsd(
            draft,
            target,
            PROMPT,
            StopRule(max_new_tokens=LENGTH),
            COSTS,
            DriverConfig(2, mode, max_in_flight=2),
            sampling=SamplingParams(temperature, None, 100 + i, top_p),
            seq_id=f"x{i}",
        )
        seq = tuple(run.generation.tokens)
        counts[seq] = counts.get(seq, 0) + 1
        rounds += run.generation.rounds
    assert any(r.accepted < r.proposed for r in rounds) and any(r.accepted == r.proposed for r in rounds)
    exact = exact_distribution(target, temperature, top_p)
    assert set(counts) <= set(exact)
    big = [s for s in exact if exact[s] * n >= 5]
    observed = [counts.get(s, 0) for s in big] + [n - sum(counts.get(s, 0) for s in big)]
    expected = [exact[s] * n for s in big] + [n - sum(exact[s] * n for s in big)]
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
    expected = [e * sum(observed) / sum(expected) for e in expected]
    assert stats.chisquare(observed, expected).pvalue > 1e-3


# ---- the pair folder ---------------------------------------------------------------------------


def saved_pair(folder):
    """A tiny feature pair's folder as the build writes one: target/, draft/ and the manifest."""
    draft, target = tiny_pair(layers=(2,))
    target.model.save_pretrained(folder / "target")
    save_eagle(draft.model, folder / "draft")
    draft.vocab_map.save(folder / "draft")
    write_manifest(folder, {"format": MANIFEST_FORMAT, "draft_kind": "eagle"})
    return folder


def test_the_hf_backend_loads_the_draft_kind_its_manifest_names(tmp_path):
    folder = saved_pair(tmp_path / "pair")
    loaded_draft, loaded_target = HfBackendConfig(pair_path=str(folder)).load()
    assert isinstance(loaded_draft, EagleLM) and isinstance(loaded_target, FeatureTorchLM)
    assert loaded_target.kernel_choice is not None  # the feature target runs on the measured paths too
    assert loaded_draft.kernel_choice is not None  # and the draft
    assert HfBackendConfig(pair_path=str(folder), kernels="aten").load()[1].kernel_choice is None
    manifest = json.loads((folder / "manifest.json").read_text())
    write_manifest(folder, {**{k: v for k, v in manifest.items() if k != "files"}, "draft_kind": "medusa"})
    with pytest.raises(Exception, match="draft_kind 'medusa'"):
        HfBackendConfig(pair_path=str(folder)).load()


def test_the_feature_draft_runs_on_the_kernel_paths_kept_for_it_with_the_same_logits(tmp_path, monkeypatch):
    from torch import nn

    from dsd.backends import kernels

    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache"))
    draft, target = tiny_pair(layers=(0, 2))
    folder = tmp_path / "draft"
    save_eagle(draft.model, folder, dtype=torch.float32)
    draft.vocab_map.save(folder)
    default = EagleLM.load(folder, "float32", 0, (kernels.ATEN,))
    assert default.kernel_choice is None
    linears = [m for m in default.model.modules() if type(m) is nn.Linear] + [default.head]
    assert len(linears) == 10  # fuse, fc, 7 in the layer, the head
    path = kernels.available_paths(torch.float32)[-1]  # a packed path, kept as if timed here
    kept = {f"{m.out_features}x{m.in_features}": {b: path for b in kernels.BUCKETS} for m in linears}
    kernels.store_choice(str(folder), kernels.KernelChoice("float32", kept))

    def no_timing(*args, **kwargs):
        raise AssertionError("a kept choice must not be timed again")

    monkeypatch.setattr(kernels, "choose_paths", no_timing)
    measured = EagleLM.load(folder, "float32", 0, kernels.PATHS)
    assert measured.kernel_choice.choice == kept
    running = [m for m in measured.model.modules() if isinstance(m, kernels.PathLinear)] + [measured.head]
    assert len(running) == 10 and all(isinstance(m, kernels.PathLinear) and m.choice[1] == path for m in running)
    features = FeatureBlock(0, torch.randn(8, default.feature_width))
    tokens = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    for lm in (default, measured):
        lm.add_features("s", features)
    assert torch.allclose(default.logits("s", tokens, 3), measured.logits("s", tokens, 3), atol=1e-4)
    with pytest.raises(AssertionError, match="timed again"):
        EagleLM.load(folder, "float32", 0, kernels.PATHS, kernel_store=False)  # afresh: timed


def test_dtype_auto_times_a_feature_pair_its_draft_on_its_own_features(tmp_path, monkeypatch):
    from dsd.backends import precision

    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path / "cache"))
    folder = saved_pair(tmp_path / "pair")
    times = precision.measure(str(folder / "target"), str(folder / "draft"))
    assert [t.dtype for t in times] == list(precision.CANDIDATES)
    assert all(t.t_ar_s > 0 and t.t_draft_s > 0 and set(t.t_verify_s) == {3, 5} for t in times)
    config = HfBackendConfig(pair_path=str(folder), dtype="auto")
    assert config.dtype in precision.CANDIDATES and config.draft_dtype in precision.CANDIDATES
    assert isinstance(config.load()[0], EagleLM)


# ---- the build ---------------------------------------------------------------------------------


def test_a_continued_draft_starts_from_the_saved_weights_and_vocabulary_with_its_head_frozen(tmp_path):
    draft, target = tiny_pair(layers=(0, 2))
    vocab = VocabMap([0, 2, 3, 5, 1, 4], VOCAB)
    save_eagle(draft.model, tmp_path / "draft", dtype=torch.float32)
    VocabMap([0, 2, 3], VOCAB).save(tmp_path / "draft")
    with pytest.raises(ValueError, match="head has 6 rows, its vocab_map.json keeps 3 tokens"):
        eagle_draft.continued_eagle(tmp_path / "draft", target.model, (0, 2))
    vocab.save(tmp_path / "draft")
    model, loaded_vocab = eagle_draft.continued_eagle(tmp_path / "draft", target.model, (0, 2))
    assert loaded_vocab.kept == vocab.kept
    for (name, saved), (_, loaded) in zip(draft.model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(saved, loaded), name
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"embed.weight", "norm.weight"}
    with pytest.raises(ValueError, match=r"reads target layers \(0, 2\), the build asks for \(2,\)"):
        eagle_draft.continued_eagle(tmp_path / "draft", target.model, (2,))
    (tmp_path / "draft" / "vocab_map.json").unlink()
    with pytest.raises(ValueError, match="no vocab_map.json"):
        eagle_draft.continued_eagle(tmp_path / "draft", target.model, (0, 2))


def test_a_continued_build_keys_its_checkpoint_by_the_draft_it_starts_from(tmp_path):
    from pairs import smollm2_eagle

    train = smollm2_eagle.EaglePairConfig(out_dir=tmp_path).train_config()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "model.safetensors").write_bytes(b"one")
    (tmp_path / "b" / "model.safetensors").write_bytes(b"two")
    keys = {smollm2_eagle._training_key("answers", train, start) for start in (None, tmp_path / "a", tmp_path / "b")}
    assert len(keys) == 3


def test_the_feature_pair_build_refuses_training_prompts_shared_with_evaluation(tmp_path):
    from pairs import chat_data, smollm2, smollm2_eagle

    leaked = tmp_path / "leaked.jsonl"
    prompts = chat_data.read_prompts(smollm2.TRAIN_PROMPTS)[:5] + [chat_data.read_prompts(smollm2.EVAL_PROMPTS)[7]]
    leaked.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    with pytest.raises(ValueError, match="comes too close to"):
        smollm2_eagle.build_eagle_pair(smollm2_eagle.EaglePairConfig(out_dir=tmp_path / "pair", prompts_path=leaked))
    assert not (tmp_path / "pair").exists()


def test_the_shipped_feature_pair_was_trained_on_training_prompts_only():
    from dsd.pair_manifest import sha256_file
    from pairs import smollm2

    manifest = json.loads((smollm2.REPO / "models" / "smollm2-eagle" / "manifest.json").read_text())
    assert manifest["draft_kind"] == "eagle"
    prompts = smollm2.REPO / manifest["training_data"]["prompts"]
    assert prompts.parent == smollm2.TRAIN_PROMPTS.parent and prompts.name.startswith("train_instructions")
    assert manifest["training_data"]["prompts_sha256"] == sha256_file(prompts)  # the file shipped as trained on
    smollm2.check_prompts_apart(prompts, smollm2.EVAL_PROMPTS)


def test_the_build_command_takes_the_feature_pairs_options_and_refuses_the_layer_drafts(tmp_path):
    from pairs import build, smollm2_eagle

    config = build.parse_args(
        [
            "--out",
            str(tmp_path),
            "--family",
            "smollm2-eagle",
            "--feature-layers",
            "29",
            "--answer-batches",
            "0-2,19",
            "--epochs",
            "3",
            "--threads",
            "1",
        ]
    )
    assert config == smollm2_eagle.EaglePairConfig(
        out_dir=tmp_path, feature_layers=(29,), answer_batches=(0, 1, 2, 19), epochs=3.0, threads=1
    )
    continued = build.parse_args(
        ["--out", str(tmp_path), "--family", "smollm2-eagle", "--init-draft", str(tmp_path / "shipped" / "draft")]
    )
    assert continued.init_draft == tmp_path / "shipped" / "draft"
    layer = build.parse_args(["--out", str(tmp_path), "--family", "smollm2", "--init-draft", str(tmp_path)])
    assert layer.init_draft == tmp_path  # the layer family trains on from a draft too
    for option in (["--draft-layers", "2"], ["--precision", "bf16"]):
        with pytest.raises(SystemExit):
            build.parse_args(["--out", str(tmp_path), "--family", "smollm2-eagle", *option])
    with pytest.raises(SystemExit):
        build.parse_args(["--out", str(tmp_path), "--family", "smollm2", "--feature-layers", "29"])
