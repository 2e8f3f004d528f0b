"""How the swarm testbed scales on this machine: N edge tasks (default 32) and a verifier task as a
Docker Swarm stack, every edge shaping its own link to one RTT from inside its container, then
one synchronous DSD run per edge at once (root, Docker; needs dsdbed-shaper:latest, see
scripts/build_shaper_image.sh, and with --nodes > 1 dsdbed-node:latest, scripts/build_node_image.sh).

--nodes 1 (default) makes a single-node swarm of this engine (`docker swarm init --advertise-addr
127.0.0.1`) if it is in none, labels this node dsdbed.role=verifier, and leaves both as it found
them (and the docker_gwbridge network the swarm made). --nodes N > 1 makes a swarm of N
Docker-in-Docker nodes on this host (orchestrator/launchers/swarm_local.py; this engine joins
none), copies the image to them (image_s), runs the above through the manager's API, and then a
short sweep across the nodes (two points, one client per edge); --node-fault kills the last
worker node's container 0.5 s into the sweep's second point, which the sweep must retry on the
nodes left. Everything is removed afterwards.

Measures: from `docker stack deploy` until every task answers /health (up_s); each edge's
in-container shaping, applied and verified by the edge itself (ICMP against the base RTT it
measured first; `shaped` counts the edges whose verification passed); per-edge generation speed
(each edge's tokens over the span of its requests).

Prints a table, then as the LAST line ``key=value`` pairs: nodes, nodes_with_edges, edges,
up_s, shaped, shaper, rtt_ms, rtt_measured_p50_ms (median over the links), rtt_base_p50_ms (the
overlay's own, before shaping), tok_s_per_edge (mean), tok_s_per_edge_min, max_batch, down_s;
with --nodes > 1 also image_s, points_ok (of the sweep's 2), rows_lost (request rows the sweep
should have and has not, or has twice), node_fault_recovered (1: the point hit by the lost node
was retried and completed; nan without --node-fault).

    sudo python benchmarks/swarm_scale.py [--edges 32] [--rtt-ms 20] [--tolerance-ms 2]
    sudo python benchmarks/swarm_scale.py --nodes 3 --edges 24 --node-fault
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402

from benchmarks.compose_scale import run_sync_everywhere  # noqa: E402
from dsd.costs.profiles import get_profile  # noqa: E402
from orchestrator.launchers import control_api  # noqa: E402
from orchestrator.launchers.swarm import SwarmConfig, SwarmTestbed  # noqa: E402
from orchestrator.launchers.swarm_images import distribute  # noqa: E402
from orchestrator.launchers.swarm_local import LocalSwarm, LocalSwarmConfig  # noqa: E402
from orchestrator.running.run import run_experiment  # noqa: E402
from orchestrator.spec.experiment import experiment_from_dict  # noqa: E402

SWEEP_REQUESTS = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edges", type=int, default=32)
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--tolerance-ms", type=float, default=2.0, help="an edge's shaping verifies within this")
    parser.add_argument("--profile", default="toy-edge-cloud", help="synthetic compute times (dsd/costs/profiles.toml)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=3, help="requests per edge, one after another")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--nodes", type=int, default=1, help="> 1: a swarm of Docker-in-Docker nodes on this host")
    parser.add_argument("--node-fault", action="store_true", help="lose a worker node during the sweep (--nodes > 1)")
    args = parser.parse_args(argv)
    if args.node_fault and args.nodes < 3:
        parser.error("--node-fault needs --nodes >= 3 (a manager, the verifier's node, a worker to lose)")
    return args


def docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


class SingleNodeSwarm:
    """A swarm for the run if there is none; everything it changed is undone on exit."""

    def __enter__(self) -> SingleNodeSwarm:
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
    prompts = [[(7 * p + 3 * j) % 200 + 1 for j in range(8)] for p in range(args.prompts)]
    print(
        f"plan: {args.nodes} node(s), {args.edges} edge tasks + 1 verifier (synthetic {args.profile}), links at "
        f"{args.rtt_ms} ms shaped in-container, one sync DSD run per edge ({args.prompts} x {args.max_new_tokens} "
        f"tokens){'; then a 2-point sweep' if args.nodes > 1 else ''}{', a node lost in it' * args.node_fault}"
    )
    where = LocalSwarm(LocalSwarmConfig(n_nodes=args.nodes)) if args.nodes > 1 else SingleNodeSwarm()
    figures: dict = {"nodes": args.nodes}
    with where as swarm:
        reach = {}
        if args.nodes > 1:
            reach = {"docker_host": swarm.manager_url, "node_hosts": tuple(swarm.node_urls)}
            t0_s = time.monotonic()
            print("image:", "; ".join(distribute("dsdbed-shaper:latest", swarm.host, swarm.node_urls)))
            figures["image_s"] = time.monotonic() - t0_s
        config = SwarmConfig(
            n_edges=args.edges,
            profile=get_profile(args.profile),
            max_batch=args.max_batch,
            verify_tolerance_ms=args.tolerance_ms,
            **reach,
        )
        figures.update(scale(config, prompts, args))
        if args.nodes > 1:
            figures.update(sweep_across_nodes(swarm, args))
    print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


def scale(config: SwarmConfig, prompts: list[list[int]], args) -> dict:
    """The stack up, every edge shaped (one at a time), one sync run per edge at once, down."""
    testbed = SwarmTestbed(config)
    try:
        print(f"up: {testbed.up_s:.1f} s for {args.edges} edges")
        links, errors = [], []
        for edge in testbed.edges:  # one at a time: 32 edges probing at once on 2 cores
            try:
                links.append(testbed._shape_edge(edge, args.rtt_ms))
            except RuntimeError as exc:
                links.append(None)
                errors.append(f"{edge.name}: {str(exc)[:300]}")
        testbed._shaped = True
        results = run_sync_everywhere(testbed, prompts, args)
        shaper = testbed.shaper
        names = [edge.name for edge in testbed.edges]
        edge_nodes = set(testbed.facts()["edge_nodes"])
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
    shaped = [link for link in links if link is not None and link.rtt_measured_p50_ms == link.rtt_measured_p50_ms]
    nan = float("nan")
    return {
        "nodes_with_edges": len(edge_nodes),
        "edges": args.edges,
        "up_s": testbed.up_s,
        "shaped": len(shaped),
        "shaper": shaper,
        "rtt_ms": args.rtt_ms,
        "rtt_measured_p50_ms": statistics.median(s.rtt_measured_p50_ms for s in shaped) if shaped else nan,
        "rtt_base_p50_ms": statistics.median(s.rtt_base_ms for s in shaped) if shaped else nan,
        "tok_s_per_edge": statistics.mean(tok_s),
        "tok_s_per_edge_min": min(tok_s),
        "max_batch": args.max_batch,
        "down_s": down_s,
    }


def sweep_across_nodes(swarm: LocalSwarm, args) -> dict:
    """Two points, one client per edge, through the swarm launcher as `dsdbed sweep` runs it;
    with --node-fault the last node (a worker with edges) is lost in the second point."""
    experiment = experiment_from_dict(
        {
            "name": "swarm-scale",
            "launcher": "swarm",
            "modes": ["sync"],
            "rtt_ms": [args.rtt_ms, 2 * args.rtt_ms],
            "gamma": [args.gamma],
            "clients": [args.edges],
            "edges": args.edges,
            "requests": SWEEP_REQUESTS,
            "warmup_requests": 1,
            "max_new_tokens": 32,
            "prompt_tokens": 8,
            "profile": args.profile,
            "max_batch": args.max_batch,
            "backend": {"kind": "synthetic", "alpha": 0.7},
            "retries": 2,
            "retry_backoff_s": 1.0,
        }
    )
    lost = args.nodes - 1
    env = {"DSD_SWARM_MANAGER": swarm.manager_url, "DSD_SWARM_NODES": " ".join(swarm.node_urls)}
    with (
        tempfile.TemporaryDirectory(prefix="dsdbed-swarm-scale-") as tmp,
        _environment(env),
        _node_lost_in_second_point(swarm, lost) if args.node_fault else contextlib.nullcontext(),
    ):
        out = Path(tmp) / "out"
        try:
            run_experiment(experiment, out, resume=False)
        except Exception as exc:  # noqa: BLE001 - a failed sweep is a figure (points_ok), not a crash
            print(f"sweep failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        done = [json.loads(p.read_text()) for p in sorted((out / "points").glob("*/done.json"))]
        has_rows = (out / "requests.csv").exists() and (out / "requests.csv").stat().st_size > 0
        requests = pd.read_csv(out / "requests.csv") if has_rows else pd.DataFrame()
    for d in done:
        print(
            f"sweep point {d['key']}: {d['status']}, attempts "
            + "; ".join(f"{a['status']} {a['error'][:120]} healed {a['healed']}" for a in d["attempts"])
        )
    expected = 2 * args.edges * SWEEP_REQUESTS
    unique = len(requests.drop_duplicates(subset=["rtt_ms", "client_id", "request_index"])) if len(requests) else 0
    retried = [d for d in done if len(d["attempts"]) > 1]
    recovered = (
        float("nan") if not args.node_fault else int(bool(retried) and all(d["status"] == "ok" for d in retried))
    )
    return {
        "points_ok": sum(d["status"] == "ok" for d in done),
        "rows_lost": expected - unique + (len(requests) - unique),
        "node_fault_recovered": recovered,
    }


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _node_lost_in_second_point(swarm: LocalSwarm, node: int):
    """The node's container killed 0.5 s after the second point's runs start (the sweep's
    control_api._run_clients, wrapped for the sweep only)."""
    original, calls = control_api._run_clients, []

    def run_clients(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            threading.Timer(0.5, swarm.kill_node, args=(node,)).start()
        return original(*a, **kw)

    control_api._run_clients = run_clients
    try:
        yield
    finally:
        control_api._run_clients = original


if __name__ == "__main__":
    sys.exit(main())
