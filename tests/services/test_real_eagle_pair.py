"""The feature-draft pair (models/smollm2-eagle: SmolLM2-135M-Instruct and a one-layer draft on its
features) over the network: the verdicts carry the target's features (rounds.csv counts their
bytes), greedy DSD emits the target's own greedy tokens, and sampled DSD follows the target's
truncated distribution (chi-square), as for the layer draft (test_real_pair.py)."""
import json

import pytest
import torch
from scipy import stats

from dsd.backends.torch_lm import TorchLM, TorchLMConfig
from dsd.decoding import generate_ar
from dsd.features import encoded_bytes
from dsd.stopping import StopRule
from dsd.verification import probs_from_logits
from pairs import chat_data, smollm2
from tests.services.harness import post_runs, read_csv, wait_for_runs

pytestmark = [pytest.mark.model, pytest.mark.slow]

PAIR = smollm2.REPO / "models" / "smollm2-eagle"
TEMPERATURE, TOP_P = 0.7, 0.9


@pytest.fixture(scope="module")
def eagle_pair(spawn, tmp_path_factory):
    try:
        smollm2.materialize_target(PAIR)          # writes target/ from the GGUF once, then checks hashes
    except FileNotFoundError as exc:
        pytest.skip(f"the feature pair's target cannot be made here: {exc}")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(PAIR))
    prompts = [chat_data.render(tokenizer, p) for p in chat_data.read_prompts(smollm2.EVAL_PROMPTS)[:3]]
    backend = json.dumps({"kind": "hf", "pair_path": str(PAIR)})
    verifier, edge = spawn(
        ("services.verifier", ["--backend-json", backend]),
        ("services.edge", ["--backend-json", backend, "--out-dir", str(tmp_path_factory.mktemp("edge-eagle"))]))
    target = TorchLM.load(TorchLMConfig(str(PAIR / "target")))
    width = json.loads((PAIR / "manifest.json").read_text())["features"]["width"]
    return verifier, edge, target, prompts, width


def run(edge, verifier, run_id, mode, prompts, max_new_tokens, temperature=0.0, top_p=1.0, seed=0,
        feature_dtype="bfloat16"):
    spec = {"run_id": run_id, "client_id": run_id, "mode": mode, "gamma": 3, "max_in_flight": 2,
            "prompts": prompts, "max_new_tokens": max_new_tokens, "verifier_url": verifier.url,
            "probe_count": 0, "stop_at_eos": True, "temperature": temperature, "top_p": top_p,
            "seed": seed, "feature_dtype": feature_dtype}
    summary = wait_for_runs(edge, post_runs(edge, [spec]), timeout_s=900)[run_id]
    assert summary["status"] == "done", summary
    return read_csv(edge, run_id, "requests.csv"), read_csv(edge, run_id, "rounds.csv")


def test_greedy_dsd_with_the_feature_draft_emits_the_targets_own_greedy_tokens(eagle_pair):
    verifier, edge, target, prompts, width = eagle_pair
    stop = StopRule(max_new_tokens=24, eos_token_id=target.eos_token_id)
    expected = [generate_ar(target, p, stop, seq_id=f"ref-{i}").tokens for i, p in enumerate(prompts)]
    for mode, dtype in (("sync", "bfloat16"), ("pipelined", "bfloat16"), ("sync", "int8")):
        rows, rounds = run(edge, verifier, f"greedy-{mode}-{dtype}", mode, prompts, 24, feature_dtype=dtype)
        got = [[int(t) for t in row["token_ids"].split()] for row in rows]
        assert got == expected, (mode, dtype)
        assert any(int(r["accepted"]) > 0 for r in rounds), "the draft must be right sometimes"
        # every verdict carries one feature row per emitted token (a round clipped by the token
        # budget emits fewer than it decided, so only whole rounds are checked)
        whole = [r for r in rounds if r["stale"] == "0" and int(r["emitted"]) == int(r["accepted"]) + 1]
        assert whole and all(int(r["feature_bytes"]) == encoded_bytes(int(r["emitted"]), width, dtype)
                             for r in whole), (mode, dtype)


def test_sampled_dsd_with_the_feature_draft_follows_the_targets_truncated_distribution(eagle_pair):
    """The first answer token at a context where the target's truncated distribution is spread
    out, 240 sampled requests, against that distribution (tokens under 5 expected pooled)."""
    verifier, edge, target, prompts, _ = eagle_pair
    contexts = [p + generate_ar(target, p, StopRule(max_new_tokens=k), seq_id=f"ctx-{i}-{k}").tokens
                for i, p in enumerate(prompts) for k in (1, 2, 3)]
    spread = [probs_from_logits(target.logits(f"p-{i}", c, 1), TEMPERATURE, None, TOP_P)[0]
              for i, c in enumerate(contexts)]
    best = max(range(len(contexts)), key=lambda i: float(1 - spread[i].max()))
    context, p = contexts[best], spread[best]
    assert float(p.max()) < 0.9, "no context with a spread-out next token"
    n = 240
    rows, rounds = run(edge, verifier, "sampled-sync", "sync", [context] * n, 1, TEMPERATURE, TOP_P, seed=5)
    counts = torch.zeros_like(p)
    for row in rows:
        counts[int(row["token_ids"].split()[0])] += 1
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(torch.nonzero(p).flatten().tolist())
    big = p * n >= 5
    observed = torch.cat([counts[big], counts[~big].sum().view(1)])
    expected = torch.cat([p[big], p[~big].sum().view(1)]) * n
    keep = expected > 0
    _, p_value = stats.chisquare(observed[keep].numpy(),
                                 expected[keep].numpy() * observed.sum().item() / expected[keep].sum().item())
    assert p_value > 1e-3, (observed, expected)
    assert any(int(r["accepted"]) < int(r["proposed"]) for r in rounds)
