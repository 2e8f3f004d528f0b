"""Multi-tenant capacity: how many clients a saturated verifier sustains, DSD against co-located SD.

    python benchmarks/capacity.py [--max-clients 64] [--tokens 48]

Synthetic backend, one verifier, one edge process hosting every client (each its own emulated
device). Every client must get the same token rate: a round at most every ``round_budget_ms``
(both modes emit the same tokens per round: same models, same greedy streams, same gamma). A
client count is sustained if the clients' steady-state round time, measured while all of them
are running, is within that budget. The largest sustained count is found by doubling and then
bisection, for synchronous DSD (the server spends t_v per client round) and co-located SD
(gamma*t_d + t_v), first with batch 1 (strictly serial: docs/concepts.md claim 4 predicts the ratio
1 + gamma*t_d/t_v), then with batching on (max batch 64, t_verify scaled by the profile's
batch_slope), reported beside it.

Progress goes to stderr; the last stdout line is key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from dsd.analytic.latency_model import capacity_factor  # noqa: E402
from orchestrator.analysis.capacity import overlap_counts  # noqa: E402
from services.launch import Service, post_runs, read_csv, running, wait_for_runs  # noqa: E402

GAMMA, ALPHA = 4, 0.8
PROFILE = {
    "name": "capacity",
    "t_draft_edge_s": 0.010,
    "t_draft_server_s": 0.010,
    "t_ar_s": 0.040,
    "t_verify_base_s": 0.040,
    "t_verify_per_position_s": 0.0,
    "t_prefill_per_token_s": 0.0,
    "batch_slope": 0.25,
}
# Saturated, n clients take n*(gamma*t_d + t_v) = n*80 ms per round co-located and n*t_v = n*40 ms
# under DSD. The budget sits 10% above 3 co-located and 6 DSD clients (240 ms) and below 7 DSD
# (280 ms) and 4 co-located clients (320 ms), so harness overhead of a few percent cannot move
# either count. (With a ratio of exactly 2, more clients would leave DSD less room below n+1.)
ROUND_BUDGET_S = 0.264
MODES = {"dsd": "sync", "colocated": "colocated"}


def backend_args() -> list[str]:
    return ["--backend-json", json.dumps({"kind": "synthetic", "alpha": ALPHA}), "--profile-json", json.dumps(PROFILE)]


class Prober:
    def __init__(self, verifier: Service, edge: Service, tokens: int, label: str) -> None:
        self.verifier, self.edge, self.tokens, self.label = verifier, edge, tokens, label
        self.round_s: dict[tuple[str, int], float] = {}
        self.tokens_per_round: list[float] = []

    def steady_round_s(self, mode: str, n_clients: int) -> float:
        """Per-client round time while all n_clients run (rounds counted in the common window)."""
        runs = [
            {
                "run_id": f"{self.label}-{mode}-{n_clients}-{i}",
                "client_id": f"client-{i}",
                "mode": MODES[mode],
                "gamma": GAMMA,
                "prompts": [[i % 400 + 1, 9, 4]],
                "max_new_tokens": self.tokens,
                "verifier_url": self.verifier.url,
                "probe_count": 1,
                "probe_interval_ms": 2000,
            }
            for i in range(n_clients)
        ]
        summaries = wait_for_runs(self.edge, post_runs(self.edge, runs), timeout_s=900)
        failed = [s for s in summaries.values() if s["status"] != "done"]
        if failed:
            raise RuntimeError(f"runs failed: {failed[:3]}")
        receipts, emitted = [], []
        for run_id in summaries:
            rows = [r for r in read_csv(self.edge, run_id, "rounds.csv") if r["stale"] == "0"]
            receipts.append(np.array([float(r["t_receive_s"]) for r in rows]))
            emitted.append(np.array([int(r["emitted"]) for r in rows]))
        self.tokens_per_round.append(sum(e.sum() for e in emitted) / sum(len(r) for r in receipts))
        window_s, rounds, _ = overlap_counts(receipts, emitted)
        if rounds < 2 * n_clients:
            raise RuntimeError(f"{n_clients} clients overlapped for only {rounds} rounds: raise --tokens")
        return n_clients * window_s / rounds

    def sustained(self, mode: str, n_clients: int) -> bool:
        if (mode, n_clients) not in self.round_s:
            self.round_s[mode, n_clients] = self.steady_round_s(mode, n_clients)
            print(
                f"  {self.label} {mode} {n_clients:3d} clients: round {1000 * self.round_s[mode, n_clients]:.1f} ms",
                file=sys.stderr,
            )
        return self.round_s[mode, n_clients] <= ROUND_BUDGET_S

    def capacity(self, mode: str, max_clients: int) -> int:
        """The largest sustained client count (assumes it only ever gets worse with more)."""
        good, n = 0, 1
        while n <= max_clients and self.sustained(mode, n):
            good, n = n, 2 * n
        bad = min(n, max_clients + 1)
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if self.sustained(mode, mid) else (good, mid)
        return good


def measure(max_batch: int, max_clients: int, tokens: int, work: Path, label: str) -> tuple[int, int, Prober]:
    verifier_args = backend_args() + ["--max-batch", str(max_batch), "--max-sessions", str(4 * max_clients)]
    edge_args = backend_args() + ["--out-dir", str(work / f"edge-{label}")]
    with running(("services.verifier", verifier_args), ("services.edge", edge_args), log_dir=work) as (verifier, edge):
        prober = Prober(verifier, edge, tokens, label)
        dsd = prober.capacity("dsd", max_clients)
        colocated = prober.capacity("colocated", max_clients)
    print(f"{label}: dsd {dsd}, colocated {colocated}", file=sys.stderr)
    return dsd, colocated, prober


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-clients", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=40, help="tokens per client per probe")
    parser.add_argument("--no-batching", action="store_true", help="skip the batched measurement")
    args = parser.parse_args()
    predicted = capacity_factor(GAMMA, PROFILE["t_draft_server_s"], PROFILE["t_verify_base_s"])
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="dsd-capacity-") as tmp:
        dsd, colocated, prober = measure(1, args.max_clients, args.tokens, Path(tmp), "batch1")
        ratio = dsd / colocated if colocated else float("inf")
        results.update(
            capacity_dsd=dsd,
            capacity_colocated=colocated,
            capacity_ratio=ratio,
            predicted=predicted,
            ratio_error_pct=100 * (ratio - predicted) / predicted,
        )
        if not args.no_batching:
            dsd_b, colocated_b, _ = measure(64, args.max_clients, args.tokens, Path(tmp), "batched")
            results.update(
                capacity_dsd_batched=dsd_b,
                capacity_colocated_batched=colocated_b,
                capacity_ratio_batched=dsd_b / colocated_b if colocated_b else float("inf"),
            )
    tokens_per_round = sum(prober.tokens_per_round) / len(prober.tokens_per_round)
    results.update(
        gamma=GAMMA,
        t_draft_ms=1000 * PROFILE["t_draft_server_s"],
        t_verify_ms=1000 * PROFILE["t_verify_base_s"],
        round_budget_ms=1000 * ROUND_BUDGET_S,
        rate_tokens_per_s=tokens_per_round / ROUND_BUDGET_S,
        batch_slope=PROFILE["batch_slope"],
        max_clients=args.max_clients,
        load_avg_1m=os.getloadavg()[0],
        cpus=os.cpu_count(),
    )
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
