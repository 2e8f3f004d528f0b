"""What the real pairs' network tests share (test_real_pair.py, test_real_eagle_pair.py): a pair's
verifier and edge on loopback, a run of prompts, and the chi-square check that sampled DSD's first
answer token follows the target's truncated distribution."""

from pathlib import Path

import pytest
import torch
from scipy import stats

from dsd.backends.hf import HfBackendConfig
from dsd.backends.torch_lm import TorchLM, TorchLMConfig
from dsd.drive.generation import generate_ar
from dsd.features import ProvidesFeatures, hand_features
from dsd.speculation.stopping import StopRule
from dsd.speculation.verification import probs_from_logits
from pairs import chat_data, smollm2
from tests.checks import every
from tests.services.harness import post_runs, read_csv, wait_for_runs

TEMPERATURE, TOP_P = 0.7, 0.9
# candidate contexts: the first evaluation prompts and each of their greedy answers' first tokens
CONTEXT_PROMPTS, CONTEXT_TOKENS = 8, 16
FALSE_ALARM = 1e-3
# the chance the check must have of failing a verifier with this wrong rejection step
WRONG_VERIFIERS = {"accepts every draft token": 0.99, "resamples a rejection from p": 0.5}
REQUEST_STEPS = (40, 60, 80, 120, 160, 240)


def start_pair(spawn, tmp_path_factory, pair, n_prompts: int = 3, dtype: str = "float32"):
    """(verifier, edge, target in the services' precision, the first evaluation prompts rendered)
    for a shipped pair folder, its services in ``dtype`` ("auto": as this machine's timing chose);
    skipped where its target cannot be made from the GGUF."""
    try:
        smollm2.materialize_target(pair)  # writes target/ from the GGUF once, then checks hashes
    except FileNotFoundError as exc:
        pytest.skip(f"the pair's target cannot be made here: {exc}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(pair))
    prompts = [chat_data.render(tokenizer, p) for p in chat_data.read_prompts(smollm2.EVAL_PROMPTS)[:n_prompts]]
    config = HfBackendConfig(pair_path=str(pair), dtype=dtype)  # "auto" resolved once, here
    backend = config.to_json()
    verifier, edge = spawn(
        ("services.verifier", ["--backend-json", backend]),
        ("services.edge", ["--backend-json", backend, "--out-dir", str(tmp_path_factory.mktemp("edge-real"))]),
    )
    target = TorchLM.load(TorchLMConfig(str(pair / "target"), config.dtype))
    return verifier, edge, target, prompts


def run(edge, verifier, run_id, mode, prompts, max_new_tokens, temperature=0.0, top_p=1.0, seed=0, clients=1, **extra):
    """(requests.csv rows, rounds.csv rows) of ``prompts`` run on the edge. clients > 1: the prompts
    split into that many consecutive shares, one run each, posted together (the edge drafts for
    one while the verifier verifies another); each request keeps the sampling seed it has in
    one run (the run's seed + its index)."""
    share = -(-len(prompts) // clients)
    specs = [
        {
            "run_id": f"{run_id}-{c}" if clients > 1 else run_id,
            "mode": mode,
            "gamma": 3,
            "max_in_flight": 2,
            "prompts": prompts[c * share : (c + 1) * share],
            "max_new_tokens": max_new_tokens,
            "verifier_url": verifier.url,
            "probe_count": 0,
            "stop_at_eos": True,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed + c * share,
            **extra,
        }
        for c in range(clients)
    ]
    summaries = wait_for_runs(
        edge, post_runs(edge, [{**spec, "client_id": spec["run_id"]} for spec in specs]), timeout_s=900
    )
    assert every(s["status"] == "done" for s in summaries.values()), summaries
    return (
        [row for spec in specs for row in read_csv(edge, spec["run_id"], "requests.csv")],
        [row for spec in specs for row in read_csv(edge, spec["run_id"], "rounds.csv")],
    )


def check_first_token_follows_the_target(verifier, edge, pair: Path) -> None:
    """The first answer token of sampled DSD against the target's truncated distribution p
    (chi-square, tokens under 5 expected pooled, and no token outside p's support), at a context
    and with as many requests as it takes to catch a wrong verifier (requests_to_catch); and the
    first draft token kept as often as the rejection step keeps it."""
    n, tv, context, p = requests_to_catch(candidate_contexts(pair))
    rows, rounds = run(edge, verifier, "sampled-sync", "sync", [context] * n, 1, TEMPERATURE, TOP_P, seed=5, clients=2)
    assert len(rows) == n
    counts = torch.zeros_like(p)
    for row in rows:
        counts[int(row["token_ids"].split()[0])] += 1
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(torch.nonzero(p).flatten().tolist())
    big = p * n >= 5
    observed, expected = pooled(counts, big), pooled(p * n, big)
    keep = expected > 0
    _, p_value = stats.chisquare(
        observed[keep].numpy(), expected[keep].numpy() * observed.sum().item() / expected[keep].sum().item()
    )
    assert p_value > FALSE_ALARM, (tv, observed, expected)
    # the first draft token is kept with probability sum min(p, q) = 1 - total variation
    kept = sum(int(r["accepted"]) > 0 for r in rounds)
    assert len(rounds) == n and stats.binomtest(kept, n, 1 - tv).pvalue > FALSE_ALARM, (kept, n, tv)


def candidate_contexts(pair: Path) -> list[tuple[float, list[int], torch.Tensor, torch.Tensor]]:
    """(total variation, context, p, q) at each candidate context: the first evaluation prompts,
    each followed by the first k tokens of the target's greedy answer; q is the edge's first draft
    distribution there (a feature draft's on the target's features over the context, as the
    verifier's prefill gives them)."""
    from transformers import AutoTokenizer

    draft, target = HfBackendConfig(pair_path=str(pair), dtype="float32").load()  # as the services load them
    tokenizer = AutoTokenizer.from_pretrained(str(pair))
    candidates = []
    for i, item in enumerate(chat_data.read_prompts(smollm2.EVAL_PROMPTS)[:CONTEXT_PROMPTS]):
        prompt = chat_data.render(tokenizer, item)
        answer = generate_ar(target, prompt, StopRule(max_new_tokens=CONTEXT_TOKENS), seq_id=f"ctx-{i}").tokens
        text, n_last = prompt + answer, len(answer) + 1
        ps = probs_from_logits(target.logits(f"p-{i}", text, n_last), TEMPERATURE, None, TOP_P)
        if isinstance(target, ProvidesFeatures):
            hand_features(draft, f"q-{i}", target.features(f"p-{i}", 0, len(text) - 1))
        qs = probs_from_logits(draft.logits(f"q-{i}", text, n_last), TEMPERATURE, None, TOP_P)
        for k, (p, q) in enumerate(zip(ps, qs)):
            candidates.append((float((p - q).abs().sum() / 2), text[: len(prompt) + k], p, q))
    return candidates


def wrong_verifiers(p: torch.Tensor, q: torch.Tensor) -> list[torch.Tensor]:
    """The first token's distribution under WRONG_VERIFIERS' rejection steps: every draft token
    accepted (q), and a rejection resampled from p instead of the residual (min(p, q) + (1 - sum) p)."""
    kept = torch.minimum(p, q)
    return [q, kept + (1 - kept.sum()) * p]


def pooled(values: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
    """values over the check's bins: each big token's, then the rest's sum."""
    return torch.cat([values[big], values[~big].sum().view(1)])


def requests_to_catch(candidates: list[tuple[float, list[int], torch.Tensor, torch.Tensor]]):
    """(n, total variation, context, p): the fewest requests (of REQUEST_STEPS), and a candidate
    context, at which the check fails each of WRONG_VERIFIERS with at least its power, as the
    better of its chi-square (noncentral) and its support check."""
    best: list[float] = []
    by_distance = sorted(candidates, key=lambda c: -c[0])
    for n in REQUEST_STEPS:
        for tv, context, p, q in by_distance:
            powers = [detection_power(p, wrong, n) for wrong in wrong_verifiers(p, q)]
            if all(got >= need for got, need in zip(powers, WRONG_VERIFIERS.values())):
                return n, tv, context, p
            best = max(best, powers, key=min) if best else powers
    raise AssertionError(f"no context where {REQUEST_STEPS[-1]} requests catch {list(WRONG_VERIFIERS)}: {best}")


def detection_power(p: torch.Tensor, wrong: torch.Tensor, n: int) -> float:
    """The chance that n first tokens drawn from ``wrong`` fail the check against p."""
    off_support = float(wrong[p == 0].sum())
    support = 1 - (1 - off_support) ** n
    big = p * n >= 5
    expected = pooled(p, big)
    keep = expected > 0
    df = int(keep.sum()) - 1
    if df < 1:
        return support
    bins = pooled(wrong, big)
    noncentrality = n * float((((bins - expected) ** 2)[keep] / expected[keep]).sum())
    chi_square = float(stats.ncx2.sf(stats.chi2.ppf(1 - FALSE_ALARM, df), df, noncentrality))
    return max(chi_square, support)
