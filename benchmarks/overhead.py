"""Harness overhead per round: what the services add to a round beyond the modelled compute.

    python benchmarks/overhead.py [--clients 1 16 64] [--rounds 600]

Synthetic backend, no added delay, synchronous DSD over loopback. One client: ``--rounds``
rounds, as runs of about 150 rounds one after another; n clients: one request of a quarter of
that per client, fewer beyond 8 clients (``multi_client_rounds``). A round is measured from its
first draft step to the next round's (so handling the verdict and writing the trace row count
too); from rounds.csv, for every round but a request's first (which also waits for the prefill)
and last:

    overhead = round - gamma * t_draft_edge_s - server_queue_s - server_compute_s

i.e. the measured round less the modelled edge drafting and what the verifier reports for its
own device (its queue wait is modelled contention between clients, not overhead; the verifier
batches up to as many sessions as there are clients, no wait window). What is left is the event
loops, msgpack, the WebSocket and TCP on both sides, the trace writes, and the lateness of the
emulated waits, which grows with the machine's load (reported). All clients share one edge
process. Progress goes to stderr; the last stdout line is key=value pairs.

Where it goes (p50 of each part, in the table and as ``*_part_p50_ms`` for one client):
``draft`` the drafting beyond gamma * t_draft_edge_s (late emulated waits), ``wire`` the round
trip beyond the verifier's queue and compute (both event loops, msgpack, the WebSocket, TCP,
wake-ups of both processes), ``edge`` from the verdict's arrival to the next draft (decode,
handling the verdict, the trace row).

Baselines, measured in the same run: a bare aiohttp WebSocket echo between two processes over
loopback, back to back (``baseline_ws_rtt_*``), and paced like a round (``paced_ws_rtt_*``): the
client waits gamma * t_draft_edge_s before each message and the server the verify pass's modelled
time before each echo (reported less that wait), so both processes fall idle as ours do, and wake
up as slowly as this machine wakes idle processes. The paced echo is the floor under ``wire``;
``wire_over_baseline_p50_ms`` is what our wire path adds beyond it, and
``overhead_vs_paced_p50_ratio`` the one-client overhead over it (1.0: the harness costs no more
than two processes that do nothing but echo). Its messages are sent in
blocks between the one-client runs, so that the floor and the rounds see the same moments of a
host whose speed drifts.

On a VM, ``steal_pct`` (per phase) is the share of CPU time the hypervisor gave to other guests
while the phase ran (/proc/stat): then processes wake late however little they do, and the
figures say more about the host than about the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.analytic.latency_model import expected_tokens_per_round  # noqa: E402
from dsd.costs.profiles import HardwareProfile  # noqa: E402
from netem.measure import percentile  # noqa: E402
from services.launch import free_port, post_runs, read_csv, running, wait_for_runs  # noqa: E402

GAMMA, ALPHA = 4, 0.8
PROFILE = {
    "name": "overhead",
    "t_draft_edge_s": 0.001,
    "t_draft_server_s": 0.001,
    "t_ar_s": 0.003,
    "t_verify_base_s": 0.002,
    "t_verify_per_position_s": 0.0002,
    "t_prefill_per_token_s": 0.00001,
    "batch_slope": 0.05,
}


def backend_args() -> list[str]:
    return ["--backend-json", json.dumps({"kind": "synthetic", "alpha": ALPHA}), "--profile-json", json.dumps(PROFILE)]


PARTS = ("draft", "wire", "edge")


def verify_pass_s() -> float:
    """The modelled time of one verify pass of gamma tokens, batch 1."""
    return HardwareProfile(**PROFILE).t_verify_s(GAMMA, 1)


def round_parts(row: dict, after: dict) -> dict[str, float]:
    """One steady round's overhead split into its parts (seconds); they add up to the total."""
    t = {
        k: float(row[k])
        for k in ("t_draft_start_s", "t_draft_end_s", "t_receive_s", "server_queue_s", "server_compute_s")
    }
    return {
        "draft": t["t_draft_end_s"] - t["t_draft_start_s"] - GAMMA * PROFILE["t_draft_edge_s"],
        "wire": t["t_receive_s"] - t["t_draft_end_s"] - t["server_queue_s"] - t["server_compute_s"],
        "edge": float(after["t_draft_start_s"]) - t["t_receive_s"],
    }


def measure(
    n_clients: int,
    rounds_per_client: int,
    work: Path,
    blocks: int = 1,
    between_blocks: Callable[[], None] | None = None,
) -> list[dict[str, float]]:
    """Overhead parts (seconds) of every steady round of n_clients concurrent sync-DSD clients,
    in ``blocks`` runs one after another on the same services; ``between_blocks`` runs after each
    (the paced echo, so that it sees the same moments of the host as the rounds)."""
    tokens = max(8, round(rounds_per_client / blocks * expected_tokens_per_round(ALPHA, GAMMA)))
    verifier_args = backend_args() + ["--max-batch", str(n_clients), "--max-sessions", str(2 * n_clients + 8)]
    edge_args = backend_args() + ["--out-dir", str(work / f"edge-{n_clients}")]
    overheads = []
    with running(("services.verifier", verifier_args), ("services.edge", edge_args), log_dir=work) as (verifier, edge):
        started = time.monotonic()
        for block in range(blocks):
            runs = [
                {
                    "run_id": f"c{n_clients}-{block}-{i}",
                    "client_id": f"client-{i}",
                    "mode": "sync",
                    "gamma": GAMMA,
                    "prompts": [[i % 400 + 1, 7, 11]],
                    "max_new_tokens": tokens,
                    "verifier_url": verifier.url,
                    "probe_count": 3,
                    "probe_interval_ms": 1000,
                }
                for i in range(n_clients)
            ]
            summaries = wait_for_runs(edge, post_runs(edge, runs), timeout_s=600)
            failed = [s for s in summaries.values() if s["status"] != "done"]
            if failed:
                raise RuntimeError(f"runs failed: {failed[:3]}")
            for run_id in summaries:
                rows = read_csv(edge, run_id, "rounds.csv")
                for row, after in zip(rows[1:], rows[2:]):  # not the first (prefill) nor the last
                    overheads.append(round_parts(row, after))
            if between_blocks is not None:
                between_blocks()
        print(
            f"{n_clients} clients: {len(overheads)} rounds in {blocks} block(s), {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
    return overheads


def _echo_server(port: int, ready, wait_s: float) -> None:
    from aiohttp import web

    from services.compute import PreciseTimer

    async def echo(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        timer = PreciseTimer()
        async for message in ws:
            if wait_s:
                await timer.sleep_until(time.perf_counter() + wait_s)
            await ws.send_bytes(message.data)
        return ws

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/ws", echo)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.sleep(600)  # bounded: the parent terminates it long before

    asyncio.run(serve())


@contextlib.contextmanager
def echo_server(server_wait_s: float = 0.0) -> Iterator[int]:
    """A bare aiohttp WebSocket echo in its own process on loopback, waiting ``server_wait_s``
    before each echo; yields its port."""
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_echo_server, args=(port, ready, server_wait_s), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the baseline echo server did not start within 30 s")
        yield port
    finally:
        server.terminate()
        server.join(5)


def echo_rtts_s(
    port: int, n_messages: int, size_bytes: int = 120, client_wait_s: float = 0.0, server_wait_s: float = 0.0
) -> list[float]:
    """Round trips through the echo server on ``port``, less its wait; the client waits
    ``client_wait_s`` before each message."""
    import aiohttp

    from services.compute import PreciseTimer

    async def client() -> list[float]:
        out = []
        timer = PreciseTimer()
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
                payload = b"x" * size_bytes
                for _ in range(n_messages):
                    if client_wait_s:
                        await timer.sleep_until(time.perf_counter() + client_wait_s)
                    started = time.perf_counter()
                    await ws.send_bytes(payload)
                    await ws.receive()
                    out.append(time.perf_counter() - started - server_wait_s)
        return out

    return asyncio.run(client())


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat's first line), or [] where there is none."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return []


def steal_pct(before: list[int], after: list[int]) -> float:
    """The share of CPU time the hypervisor gave to others in between (the 8th counter), in
    percent: time in which this VM's processes, ours included, could not run however ready."""
    if len(before) < 8 or len(after) < 8:
        return float("nan")
    total = sum(after) - sum(before)
    return 100 * (after[7] - before[7]) / total if total > 0 else 0.0


ECHO_BLOCK_MESSAGES = 75
ROUNDS_PER_BLOCK = 150


def multi_client_rounds(rounds: int, n_clients: int) -> int:
    """Rounds per client with n clients: a quarter of the one-client rounds up to 8 clients,
    fewer beyond (16 clients: 75 each, 64: 20 each, at the default 600)."""
    return max(20, rounds // 4 // max(1, n_clients // 8))


def _record_clients(results: dict[str, float | int], n: int, parts: list[dict], stolen_pct: float) -> None:
    """n clients' overhead figures into results (suffixed _n beyond one client; the one client's
    parts too), and a line on stderr."""
    suffix = "" if n == 1 else f"_{n}"
    overheads_ms = [1000 * sum(p.values()) for p in parts]
    part_p50_ms = {k: 1000 * statistics.median(p[k] for p in parts) for k in PARTS}
    results[f"overhead_p50_ms{suffix}"] = statistics.median(overheads_ms)
    results[f"overhead_p99_ms{suffix}"] = percentile(overheads_ms, 99)
    results[f"rounds{suffix}"] = len(overheads_ms)
    results[f"steal_pct{suffix}"] = stolen_pct
    print(
        f"{n} clients: p50 {results[f'overhead_p50_ms{suffix}']:.3f} ms, "
        f"p99 {results[f'overhead_p99_ms{suffix}']:.3f} ms; p50 of its parts: "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in part_p50_ms.items())
        + f"; CPU stolen by the host {results[f'steal_pct{suffix}']:.1f}%",
        file=sys.stderr,
    )
    if n == 1:
        results.update({f"{k}_part_p50_ms": v for k, v in part_p50_ms.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--rounds", type=int, default=600, help="rounds of the one client (n clients: see multi_client_rounds)"
    )
    args = parser.parse_args()
    if min(args.clients) < 1 or args.rounds < 20:
        parser.error("--clients must be >= 1 and --rounds >= 20")
    results: dict[str, float | int] = {}
    client_wait_s, server_wait_s = GAMMA * PROFILE["t_draft_edge_s"], verify_pass_s()
    paced_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="dsd-overhead-") as tmp, echo_server(server_wait_s) as paced_port:

        def paced_block() -> None:
            paced_ms.extend(
                1000 * s
                for s in echo_rtts_s(
                    paced_port, ECHO_BLOCK_MESSAGES, client_wait_s=client_wait_s, server_wait_s=server_wait_s
                )
            )

        for n in args.clients:
            cpu_before = cpu_times()
            if n == 1:  # the paced echo between blocks of rounds: the same moments of the host
                parts = measure(n, args.rounds, Path(tmp), max(1, args.rounds // ROUNDS_PER_BLOCK), paced_block)
            else:
                parts = measure(n, multi_client_rounds(args.rounds, n), Path(tmp))
            _record_clients(results, n, parts, steal_pct(cpu_before, cpu_times()))
        if not paced_ms:
            paced_block()
    with echo_server() as port:
        floor_ms = [1000 * s for s in echo_rtts_s(port, 1000)]
    results["baseline_ws_rtt_p50_ms"] = statistics.median(floor_ms)
    results["baseline_ws_rtt_p99_ms"] = percentile(floor_ms, 99)
    results["paced_ws_rtt_p50_ms"] = statistics.median(paced_ms)
    results["paced_ws_rtt_p99_ms"] = percentile(paced_ms, 99)
    if "wire_part_p50_ms" in results:
        results["wire_over_baseline_p50_ms"] = results["wire_part_p50_ms"] - results["paced_ws_rtt_p50_ms"]
        # The whole one-client overhead against the floor measured beside it: what the harness
        # costs on this host, as a ratio that a faster or slower host leaves about the same.
        results["overhead_vs_paced_p50_ratio"] = results["overhead_p50_ms"] / results["paced_ws_rtt_p50_ms"]
    print(
        f"baseline: bare WebSocket echo between two processes p50 {results['baseline_ws_rtt_p50_ms']:.3f} ms, "
        f"p99 {results['baseline_ws_rtt_p99_ms']:.3f} ms; paced like a round p50 "
        f"{results['paced_ws_rtt_p50_ms']:.3f} ms, p99 {results['paced_ws_rtt_p99_ms']:.3f} ms",
        file=sys.stderr,
    )
    results["gamma"], results["t_draft_edge_ms"] = GAMMA, 1000 * PROFILE["t_draft_edge_s"]
    # Emulated waits are only as punctual as the CPU is free: say how busy the machine was.
    results["load_avg_1m"] = os.getloadavg()[0]
    results["cpus"] = os.cpu_count()
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
