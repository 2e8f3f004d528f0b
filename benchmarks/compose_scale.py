"""How the compose testbed scales on this machine: N edge containers (default 16) and a verifier
container, every link shaped to one RTT, one synchronous DSD run per edge at once (root, Docker;
builds the image first if it is missing).

Measures: `compose up --wait` until every container is healthy; each container's memory (as
`docker stats` counts it: usage less inactive page cache); the links' RTT by ICMP from each edge;
per-edge generation speed, each edge's generated tokens over the span from its first request's
start to its last request's end; then `compose down`.

Prints a table, then as the LAST line ``key=value`` pairs: edges, backend, shaper, up_s,
mem_per_edge_mib (mean), mem_verifier_mib, rtt_ms, rtt_measured_p50_ms (median over the links),
tok_s_per_edge (mean), tok_s_per_edge_min, tok_s_total, max_batch, down_s.

    sudo python benchmarks/compose_scale.py [--edges 16] [--rtt-ms 20] [--backend synthetic|hf] [--dry-run]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsd.backends.factory import backend_from_dict  # noqa: E402
from dsd.costs.profiles import get_profile  # noqa: E402
from orchestrator.common.http_client import call  # noqa: E402
from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed  # noqa: E402

RUN_TIMEOUT_S = 600.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edges", type=int, default=16)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument(
        "--backend",
        choices=("synthetic", "hf"),
        default="synthetic",
        help="hf: the default pair in models/default-pair",
    )
    parser.add_argument(
        "--profile", default="toy-edge-cloud", help="synthetic: compute times (dsd/costs/profiles.toml)"
    )
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3, help="requests per edge, one after another")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16, help="verifier batching (one batch can serve all edges)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def container_mem_mib(container) -> float:
    """What `docker stats` shows: usage less inactive page cache (cgroup v1 and v2 names)."""
    mem = container.stats(stream=False, one_shot=True)["memory_stats"]
    stats = mem.get("stats", {})
    inactive = stats.get("total_inactive_file", stats.get("inactive_file", 0))
    return (mem["usage"] - inactive) / 2**20


def run_sync_everywhere(testbed: ComposeTestbed, prompts: list[list[int]], args) -> dict[str, dict]:
    """One sync DSD run per edge, all at once; returns each edge's run summary and requests rows."""
    for i, edge in enumerate(testbed.edges):
        call(
            "POST",
            f"{edge.control_url}/runs",
            token=edge.token,
            body={
                "run_id": "scale",
                "client_id": f"edge{i}",
                "mode": "sync",
                "gamma": args.gamma,
                "prompts": prompts,
                "max_new_tokens": args.max_new_tokens,
                "verifier_url": testbed.verifier_url,
                "app_delay_ms": testbed.app_delay_ms(i),
                "probe_count": 2,
                "probe_interval_ms": 1000,
            },
        )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    done: dict[str, dict] = {}
    while len(done) < len(testbed.edges):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(testbed.edges) - len(done)} runs unfinished after {RUN_TIMEOUT_S} s")
        time.sleep(0.5)
        for edge in testbed.edges:
            if edge.name not in done:
                summary = json.loads(call("GET", f"{edge.control_url}/runs/scale", token=edge.token))
                if summary["status"] == "failed":
                    raise RuntimeError(f"{edge.name}: run failed: {summary['error']}")
                if summary["status"] == "done":
                    text = call("GET", f"{edge.control_url}/runs/scale/requests.csv", token=edge.token).decode()
                    done[edge.name] = {"summary": summary, "requests": _rows(text)}
    return done


def _rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = backend_from_dict({"kind": args.backend})
    profile = get_profile(args.profile) if args.backend == "synthetic" else None
    config = ComposeConfig(
        n_edges=args.edges, backend=backend, profile=profile, max_batch=args.max_batch, verify_count=50
    )
    prompts = [[(7 * p + 3 * j) % 200 + 1 for j in range(8)] for p in range(args.prompts)]
    print(
        f"plan: {args.edges} edges + 1 verifier ({args.backend}), links at {args.rtt_ms} ms, one sync DSD run "
        f"per edge ({args.prompts} x {args.max_new_tokens} tokens, gamma {args.gamma}), max_batch {args.max_batch}"
    )
    print("compose env: " + " ".join(f"{k}={v!r}" for k, v in config.compose_env().items()))
    if args.dry_run:
        return 0

    t0_s = time.monotonic()
    with ComposeTestbed(config) as testbed:
        print(
            f"up: {testbed.up_s:.1f} s for {args.edges} edges (ComposeTestbed() took {time.monotonic() - t0_s:.1f} s)"
        )
        mem_edges = [container_mem_mib(c) for c in testbed.edge_containers]
        mem_verifier = container_mem_mib(testbed.verifier_container)
        links = testbed.shape([args.rtt_ms] * args.edges)
        results = run_sync_everywhere(testbed, prompts, args)
        testbed.check()
        shaper = testbed.shaper
        t_down_s = time.monotonic()
    down_s = time.monotonic() - t_down_s

    tok_s, total_tokens, starts, ends = [], 0, [], []
    print(f"{'edge':<16} {'mem_mib':>8} {'rtt_p50_ms':>10} {'tokens':>6} {'tok_s':>7}")
    for edge_name, mem, link in zip(sorted(results, key=lambda n: int(n.rsplit("-", 1)[1])), mem_edges, links):
        rows = results[edge_name]["requests"]
        tokens = sum(int(r["tokens"]) for r in rows)
        span_s = max(float(r["t_end_s"]) for r in rows) - min(float(r["t_start_s"]) for r in rows)
        tok_s.append(tokens / span_s)
        total_tokens += tokens
        starts += [float(r["t_start_s"]) for r in rows]
        ends += [float(r["t_end_s"]) for r in rows]
        print(f"{edge_name:<16} {mem:>8.1f} {link.rtt_measured_p50_ms:>10.2f} {tokens:>6} {tok_s[-1]:>7.1f}")
    figures = {
        "edges": args.edges,
        "backend": args.backend,
        "shaper": shaper,
        "up_s": testbed.up_s,
        "mem_per_edge_mib": statistics.mean(mem_edges),
        "mem_verifier_mib": mem_verifier,
        "rtt_ms": args.rtt_ms,
        "rtt_measured_p50_ms": statistics.median(s.rtt_measured_p50_ms for s in links),
        "tok_s_per_edge": statistics.mean(tok_s),
        "tok_s_per_edge_min": min(tok_s),
        "tok_s_total": total_tokens / (max(ends) - min(starts)),
        "max_batch": args.max_batch,
        "down_s": down_s,
    }
    print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
