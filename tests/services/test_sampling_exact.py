"""Sampling over the network is exact: the sequences that the edge and verifier services emit
under sync and pipelined DSD, with top-k and with top-p, follow the target's own truncated
sampling distribution (chi-square against the exact distribution of 3-token continuations).

The pair is a tiny GPT-2 with 6 tokens whose draft is the target with noise on every weight, so
drafts are often rejected and the residual max(0, p - q) is exercised as much as the bonus token.
"""

import json

import pytest
import torch
from scipy import stats
from transformers import GPT2Config, GPT2LMHeadModel

from dsd.pair_manifest import MANIFEST_FORMAT, write_manifest
from dsd.speculation.verification import probs_from_logits
from tests.services.harness import post_runs, read_csv, wait_for_runs

VOCAB, LENGTH, PROMPT, N_REQUESTS = 6, 3, [1, 2], 800
CASES = [  # mode, temperature, top_k, top_p
    ("sync", 1.0, 3, 1.0),
    ("pipelined", 1.0, 3, 1.0),
    ("sync", 0.8, None, 0.8),
    ("pipelined", 1.2, 4, 0.9),
]


def toy_pair(seed: int = 7, sharpness: float = 6.0, noise: float = 0.3):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_layer=1, n_embd=16, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    target, draft = GPT2LMHeadModel(config).eval(), GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        target.transformer.wte.weight.mul_(sharpness)  # tied head: logits of a few nats
        draft.load_state_dict(target.state_dict())
        for p in draft.parameters():
            p.add_(noise * torch.randn_like(p))
    return target, draft


def exact_distribution(target, temperature, top_k, top_p) -> dict[tuple, float]:
    """P(continuation) under the target's own sampling: each step from the full context."""
    result = {(): 1.0}
    for _ in range(LENGTH):
        grown = {}
        for seq, prob in result.items():
            with torch.no_grad():
                logits = target(torch.tensor([PROMPT + list(seq)])).logits[0, -1:]  # [1, vocab]
            p = probs_from_logits(logits, temperature, top_k, top_p)[0]
            for token in range(VOCAB):
                if p[token] > 0:
                    grown[seq + (token,)] = prob * float(p[token])
        result = grown
    return result


def chi_square_p(observed: dict, exact: dict, n: int) -> float:
    """Bins with an expected count under 5 are pooled; a sequence outside the support fails."""
    outside = set(observed) - set(exact)
    assert not outside, f"sequences the target cannot sample: {outside}"
    big = [s for s in exact if exact[s] * n >= 5]
    obs = [observed.get(s, 0) for s in big]
    exp = [exact[s] * n for s in big]
    rest_exp = n - sum(exp)
    if rest_exp >= 5:
        obs.append(n - sum(obs))
        exp.append(rest_exp)
    exp = [e * sum(obs) / sum(exp) for e in exp]
    return stats.chisquare(obs, exp).pvalue


@pytest.fixture(scope="module")
def toy(spawn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("toy-pair")
    target, draft = toy_pair()
    target.save_pretrained(folder / "target")
    draft.save_pretrained(folder / "draft")
    write_manifest(folder, {"format": MANIFEST_FORMAT})
    verifier, edge = spawn(
        (
            "services.verifier",
            ["--backend-json", json.dumps({"kind": "hf", "pair_path": str(folder)}), "--max-batch", "4"],
        ),
        (
            "services.edge",
            [
                "--backend-json",
                json.dumps({"kind": "hf", "target_path": str(folder / "target"), "draft_path": str(folder / "draft")}),
                "--out-dir",
                str(tmp_path_factory.mktemp("edge-toy")),
            ],
        ),
    )
    return verifier, edge, target


def test_sampled_sequences_follow_the_targets_truncated_distribution_over_the_network(toy):
    verifier, edge, target = toy
    runs = [
        {
            "run_id": f"exact-{i}",
            "client_id": f"exact-{i}",
            "mode": mode,
            "gamma": 2,
            "max_in_flight": 2,
            "prompts": [PROMPT] * N_REQUESTS,
            "max_new_tokens": LENGTH,
            "verifier_url": verifier.url,
            "probe_count": 0,
            "stop_at_eos": False,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "seed": 1000 * i,
        }
        for i, (mode, temperature, top_k, top_p) in enumerate(CASES)
    ]
    summaries = wait_for_runs(edge, post_runs(edge, runs), timeout_s=600)
    for run, (mode, temperature, top_k, top_p) in zip(runs, CASES):
        assert summaries[run["run_id"]]["status"] == "done", summaries[run["run_id"]]
        rows = read_csv(edge, run["run_id"], "requests.csv")
        observed: dict[tuple, int] = {}
        assert rows, run["run_id"]
        for row in rows:
            seq = tuple(int(t) for t in row["token_ids"].split())
            observed[seq] = observed.get(seq, 0) + 1
        rounds = read_csv(edge, run["run_id"], "rounds.csv")
        live = [r for r in rounds if r["stale"] == "0"]
        # Both branches of speculative sampling ran: rejections (residual) and full acceptances (bonus).
        assert any(int(r["accepted"]) < int(r["proposed"]) for r in live)
        assert any(int(r["accepted"]) == int(r["proposed"]) for r in live)
        exact = exact_distribution(target, temperature, top_k, top_p)
        p_value = chi_square_p(observed, exact, len(rows))
        assert p_value > 1e-3, (mode, temperature, top_k, top_p, p_value)
