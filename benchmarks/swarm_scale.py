"""How the swarm testbed scales on this machine: N edge tasks (default 32) and a verifier task as a
Docker Swarm stack, every edge shaping its own link to one RTT from inside its container, then
one synchronous DSD run per edge at once (root, Docker; needs dsdbed-shaper:latest, see
scripts/build_shaper_image.sh).

Makes a single-node swarm (`docker swarm init --advertise-addr 127.0.0.1`) if this engine is in
none, labels this node dsdbed.role=verifier, and leaves both as it found them (and the
docker_gwbridge network the swarm made).

Measures: from `docker stack deploy` until every task answers /health (up_s); each edge's
in-container shaping, applied and verified by the edge itself (ICMP against the base RTT it
measured first; `shaped` counts the edges whose verification passed); per-edge generation speed
(each edge's tokens over the span of its requests).

Prints a table, then as the LAST line ``key=value`` pairs: edges, up_s, shaped, shaper,
rtt_ms, rtt_measured_p50_ms (median over the links), tok_s_per_edge (mean), tok_s_per_edge_min,
max_batch, down_s.

    sudo python benchmarks/swarm_scale.py [--edges 32] [--rtt-ms 20] [--tolerance-ms 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compose_scale import run_sync_everywhere  # noqa: E402
from dsd.profiles import get_profile  # noqa: E402
from orchestrator.launchers.swarm import SwarmConfig, SwarmTestbed  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edges", type=int, default=32)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--tolerance-ms", type=float, default=2.0, help="an edge's shaping verifies within this")
    parser.add_argument("--profile", default="toy-edge-cloud", help="synthetic compute times (dsd/profiles.toml)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3, help="requests per edge, one after another")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    return parser.parse_args(argv)


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


class SingleNodeSwarm:
    """A swarm for the run if there is none; everything it changed is undone on exit."""

    def __enter__(self) -> "SingleNodeSwarm":
        self.gwbridge_before = docker("network", "ls", "-q", "--filter", "name=^docker_gwbridge$") != ""
        self.joined = docker("info", "--format", "{{.Swarm.LocalNodeState}}") != "active"
        if self.joined:
            docker("swarm", "init", "--advertise-addr", "127.0.0.1")
        node = docker("info", "--format", "{{.Swarm.NodeID}}")
        labels = json.loads(docker("node", "inspect", node, "--format", "{{json .Spec.Labels}}")) or {}
        self.labelled = labels.get("dsdbed.role") != "verifier"
        if self.labelled:
            docker("node", "update", "--label-add", "dsdbed.role=verifier", node)
        self.node = node
        return self

    def __exit__(self, *exc) -> None:
        if self.joined:
            docker("swarm", "leave", "--force", check=False)
            if not self.gwbridge_before:
                docker("network", "rm", "docker_gwbridge", check=False)
        elif self.labelled:
            docker("node", "update", "--label-rm", "dsdbed.role", self.node, check=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = SwarmConfig(n_edges=args.edges, profile=get_profile(args.profile), max_batch=args.max_batch,
                         verify_tolerance_ms=args.tolerance_ms)
    prompts = [[(7 * p + 3 * j) % 200 + 1 for j in range(8)] for p in range(args.prompts)]
    print(f"plan: {args.edges} edge tasks + 1 verifier (synthetic {args.profile}), links at {args.rtt_ms} ms "
          f"shaped in-container, one sync DSD run per edge ({args.prompts} x {args.max_new_tokens} tokens)")
    with SingleNodeSwarm():
        testbed = SwarmTestbed(config)
        try:
            print(f"up: {testbed.up_s:.1f} s for {args.edges} edges")
            links, errors = [], []
            for edge in testbed.edges:          # one at a time: 32 edges probing at once on 2 cores
                try:
                    links.append(testbed._shape_edge(edge, args.rtt_ms))
                except RuntimeError as exc:
                    links.append(None)
                    errors.append(f"{edge.name}: {str(exc)[:300]}")
            testbed._shaped = True
            results = run_sync_everywhere(testbed, prompts, args)
            shaper = testbed.shaper
            names = [edge.name for edge in testbed.edges]
        finally:
            t_down_s = time.monotonic()
            testbed.close()
            down_s = time.monotonic() - t_down_s
    for error in errors:
        print("not shaped:", error)
    tok_s = []
    print(f"{'edge':<24} {'rtt_p50_ms':>10} {'tokens':>6} {'tok_s':>7}")
    for edge, link in zip(names, links):
        rows = results[edge]["requests"]
        tokens = sum(int(r["tokens"]) for r in rows)
        span_s = max(float(r["t_end_s"]) for r in rows) - min(float(r["t_start_s"]) for r in rows)
        tok_s.append(tokens / span_s)
        print(f"{edge:<24} {link.rtt_measured_p50_ms if link else float('nan'):>10.2f} {tokens:>6} {tok_s[-1]:>7.1f}")
    shaped = [link for link in links if link is not None]
    figures = {"edges": args.edges, "up_s": testbed.up_s, "shaped": len(shaped), "shaper": shaper,
               "rtt_ms": args.rtt_ms,
               "rtt_measured_p50_ms": statistics.median(s.rtt_measured_p50_ms for s in shaped) if shaped
               else float("nan"),
               "tok_s_per_edge": statistics.mean(tok_s), "tok_s_per_edge_min": min(tok_s),
               "max_batch": args.max_batch, "down_s": down_s}
    print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
