"""How well can an edge rank the token a verdict sends back after a rejection (the correction),
before the verdict arrives? The speculation cache (dsd.cache.speculation_cache) drafts next blocks for its
best-ranked candidates; a correction is drawn from max(0, p - q) normalised, and the edge knows
only q.

    python benchmarks/correction_ranking.py [--pair models/smollm2-chat] [--answers 32] [--head]

The target answers held-out training prompts (the share of workloads/train_instructions.jsonl
every build holds out: the draft never trained on them), sampled at T 0.7 / top-p 0.9 as the main
job samples. At every answer position, teacher-forced, a rejection happens with probability
TVD(p, q) (``rejection_rate``: its mean over the answer positions) and rejects token x with probability max(0, q(x) - p(x)) / TVD; each ranking is judged
by the correction mass among its first 16 candidates (x left out), weighted by how likely each
rejection is. Rankings: ``shipped`` (the draft's tempered distribution, dsd.speculation.drafting.ranking_row),
``residual_s{sigma}`` (the expected residual E[max(0, p~ - q)] with p~ the tempered distribution
under a log-normal error), ``oracle`` (the corrections' own order: the ceiling). With --head, a
head on the draft's last hidden state (the draft's logits plus a learned bias, scale and rank-16
term) trained on the corrections of one half of the prompts and judged on the other half
(``head_before`` / ``head_after``). Progress goes to stderr; the last line is key=value.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.hf import AUTO, DTYPE_NAMES, HfBackendConfig  # noqa: E402
from dsd.backends.torch_lm import DTYPES  # noqa: E402
from dsd.backends.vocab_map import VocabMap  # noqa: E402
from dsd.speculation.verification import probs_from_logits  # noqa: E402
from pairs import chat_data, common, smollm2  # noqa: E402

TEMPERATURE, TOP_P, CANDIDATES = 0.7, 0.9, 16
SIGMAS = (0.5, 1.0, 2.0)
REJECTED_KEPT = 4  # the most likely rejected tokens a position's rejection is averaged over


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def heldout_prompts(tokenizer, count: int) -> list[list[int]]:
    rendered = [chat_data.render(tokenizer, p) for p in chat_data.read_prompts(smollm2.TRAIN_PROMPTS)]
    held = [ids for ids in rendered if common.is_heldout(str(ids), smollm2.Smollm2PairConfig.heldout_pct)]
    if len(held) < count:
        raise SystemExit(f"--answers {count}: the training prompts hold out only {len(held)}")
    return held[:count]


@torch.no_grad()
def rejections(target, draft, vocab: VocabMap, samples) -> dict[str, torch.Tensor]:
    """Per answer position with a chance of rejection: the draft's last hidden state, logits and
    nucleus-cut q over its kept tokens, the correction distribution r and the rejected tokens'
    distribution over the full vocabulary, and the chance of a rejection (TVD)."""
    keys = ("hidden", "logits", "q", "r", "rejected", "tvd")
    rows = {k: [] for k in keys}
    to_draft, kept = vocab.to_draft(), vocab.kept_tensor
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.answer_ids])
        first, n = len(s.prompt_ids) - 1, len(s.answer_ids)
        p = probs_from_logits(target(input_ids=ids).logits[0, first : first + n].float(), TEMPERATURE, None, TOP_P)
        out = draft(input_ids=to_draft[ids], output_hidden_states=True)
        logits = out.logits[0, first : first + n, : len(vocab.kept)].float()
        q = probs_from_logits(vocab.full_logits(logits), TEMPERATURE, None, TOP_P)
        tvd = (q - p).clamp(min=0).sum(-1)
        some = tvd > 1e-4
        rows["hidden"].append(out.hidden_states[-1][0, first : first + n].float()[some])
        rows["logits"].append(logits[some])
        rows["q"].append(q[:, kept][some])
        rows["r"].append(((p - q).clamp(min=0) / tvd.clamp(min=1e-9)[:, None])[:, kept][some])
        rows["rejected"].append(((q - p).clamp(min=0) / tvd.clamp(min=1e-9)[:, None])[:, kept][some])
        rows["tvd"].append(tvd[some])
    return {k: torch.cat(v) for k, v in rows.items()}


def share_within(scores: torch.Tensor, rows: dict[str, torch.Tensor]) -> float:
    """The correction mass among each rejection's first CANDIDATES by ``scores`` [n, kept] (the
    rejected token left out), weighted by the rejection's probability."""
    chance, rejected = torch.topk(rows["rejected"], REJECTED_KEPT)  # [n, R]
    caught = total = 0.0
    for k in range(REJECTED_KEPT):
        ranked = scores.scatter(1, rejected[:, k : k + 1], float("-inf"))
        top = torch.topk(ranked, CANDIDATES).indices
        weight = rows["tvd"] * chance[:, k]
        caught += float((weight * rows["r"].gather(1, top).sum(-1)).sum())
        total += float(weight.sum())
    return caught / total


def expected_residual(rows: dict[str, torch.Tensor], sigma: float) -> torch.Tensor:
    """E[max(0, p~ - q)] per token, p~ = tempered draft probability x exp(sigma Z - sigma^2 / 2)."""
    tempered = torch.softmax(rows["logits"] / TEMPERATURE, -1).clamp(min=1e-30)
    q = rows["q"]
    normal = torch.distributions.Normal(0.0, 1.0)
    d1 = (torch.log(tempered / q.clamp(min=1e-30)) + sigma**2 / 2) / sigma
    return torch.where(q > 0, tempered * normal.cdf(d1) - q * normal.cdf(d1 - sigma), tempered)


class CorrectionHead(torch.nn.Module):
    """The draft's logits (its head E over the kept tokens) rescaled, plus a bias and a rank-r term."""

    def __init__(self, head: torch.Tensor, rank: int) -> None:
        super().__init__()
        self.register_buffer("head", head)
        self.scale = torch.nn.Parameter(torch.tensor(1.0 / TEMPERATURE))
        self.bias = torch.nn.Parameter(torch.zeros(head.shape[0]))
        self.down = torch.nn.Parameter(torch.randn(rank, head.shape[1]) * 0.02)
        self.up = torch.nn.Parameter(torch.zeros(head.shape[0], rank))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.scale * hidden @ self.head.T + self.bias + (hidden @ self.down.T) @ self.up.T


def train_head(head: CorrectionHead, rows: dict[str, torch.Tensor], epochs: int = 4) -> None:
    """Cross-entropy against each rejection's correction distribution, weighted by its chance."""
    optimiser = torch.optim.Adam(head.parameters(), lr=2e-3)
    n = len(rows["tvd"])
    for _ in range(epochs):
        for idx in torch.randperm(n).split(256):
            log_probs = torch.log_softmax(head(rows["hidden"][idx]), -1)
            weight = rows["tvd"][idx]
            loss = -(weight * (rows["r"][idx] * log_probs).sum(-1)).sum() / weight.sum()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", type=Path, default=Path("models/smollm2-chat"))
    parser.add_argument("--answers", type=int, default=32, help="held-out training prompts to answer")
    parser.add_argument("--seed", type=int, default=2234)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--dtype",
        default=AUTO,
        choices=(AUTO, *DTYPE_NAMES),
        help="auto: as the services choose it on this CPU (dsd.backends.precision)",
    )
    parser.add_argument("--head", action="store_true", help="also train and judge a correction head")
    args = parser.parse_args(argv)
    if args.answers < 2:
        parser.error(f"--answers must be >= 2, got {args.answers}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    backend = HfBackendConfig(pair_path=str(args.pair), dtype=args.dtype)  # refuses what this CPU cannot run
    tokenizer, target, draft, _manifest = common.load_pair(args.pair)
    target.to(DTYPES[backend.dtype])
    draft.to(DTYPES[backend.draft_dtype])
    vocab = VocabMap.load(args.pair / "draft")
    if vocab is None:
        raise SystemExit(f"{args.pair}: a draft over the full vocabulary; this benchmark ranks a kept vocabulary")
    t0_s = time.perf_counter()
    config = chat_data.ChatDataConfig(smollm2.TRAIN_PROMPTS, 1, 128, TEMPERATURE, TOP_P, seed=args.seed)
    prompts = heldout_prompts(tokenizer, args.answers)
    samples = []
    for start in range(0, len(prompts), config.batch_size):
        samples += chat_data.answer_batch(
            target, tokenizer, prompts[start : start + config.batch_size], config, args.seed + start
        )
        log(f"[answers] {len(samples)}/{len(prompts)} in {time.perf_counter() - t0_s:.0f}s")
    rows = rejections(target, draft, vocab, samples)
    answer_positions = sum(len(s.answer_ids) for s in samples)
    figures = {
        "answers": len(samples),
        "positions": answer_positions,
        "rejection_rate": round(float(rows["tvd"].sum()) / answer_positions, 4),
        "shipped": share_within(rows["logits"], rows),
        **{f"residual_s{s}": share_within(expected_residual(rows, s), rows) for s in SIGMAS},
        "oracle": share_within(rows["r"], rows),
    }
    if args.head:
        half = len(samples) // 2
        fit = rejections(target, draft, vocab, samples[:half])
        judge = rejections(target, draft, vocab, samples[half:])
        head = CorrectionHead(draft.lm_head.weight[: len(vocab.kept)].float().detach(), rank=16)
        with torch.no_grad():
            figures["head_before"] = share_within(head(judge["hidden"]), judge)
        train_head(head, fit)
        with torch.no_grad():
            figures["head_after"] = share_within(head(judge["hidden"]), judge)
        figures["head_fit_positions"] = len(fit["tvd"])
    log(f"[done] in {time.perf_counter() - t0_s:.0f}s")
    print(" ".join(f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
