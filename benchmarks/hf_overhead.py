"""Harness overhead per round on the real pair: round wall time minus the model passes' own time.

    python benchmarks/hf_overhead.py [--pair models/default-pair] [--tokens 96] [--requests 4]
                                     [--gamma 4] [--temperature 0.7 --top-p 0.9] [--dtype auto]

The sibling of benchmarks/overhead.py (synthetic backend) for the hf backend: one verifier and
one edge over loopback (no added delay), the default pair, one client, one request after another
in each mode (sync DSD, co-located SD, cloud AR), greedy, gamma 4 by default. The main job's
rounds are sampled (``--pair models/smollm2-chat --gamma 2 --temperature 0.7 --top-p 0.9``): then
every Verify carries the draft's q, which the verifier checks and reads outside its pass, so its
figure there is the sampled one. From rounds.csv, for every
round but a request's first (it also waits for the prefill), the same quantities as the sweep's
``harness_overhead_ms`` (orchestrator.analysis.fits.fit_effective_params), as medians:

  hf_overhead_server_p50_ms     sync DSD: receive - send - server queue - server compute
                                (the round trip beyond the verifier's pass: both event loops,
                                msgpack, WebSocket, TCP, and the hop to the device thread and
                                back where the pass cannot run on the loop's own thread)
  hf_overhead_edge_p50_ms       sync DSD: (send - previous receipt) - drafting
                                (the edge's work between a verdict and the next block's message)
  hf_overhead_colocated_p50_ms  co-located: time between rounds - server compute (draft + verify)
  hf_overhead_ar_p50_ms         AR: time between tokens - server compute

  echo_floor_p50_ms             the floor under the server overhead, measured in the same run right
                                after the sync rounds: two processes that only echo over an aiohttp
                                WebSocket on loopback, paced like those rounds (the client computes
                                their median drafting time before each message, the server their
                                median verify pass before each answer; benchmarks/echo_floor.py),
                                round trip less the server's compute. ``server_over_floor_p50_ms``
                                is what the services add beyond it.

``--transport tcp`` sends the per-round messages over the frame transport instead of the
verifier's aiohttp WebSocket (services/frames.py: the same msgpack messages as length-prefixed
frames on a plain TCP connection to the same port, TCP_NODELAY; the verifier handles a frame
from inside the read, without a reader task; the edge delivers it from the read to the waiting
session). The echo floor is then the raw blocking-TCP echo (the kernel's part alone), and
``transport=`` is printed with the keys.

Server compute is what the verifier measured around its passes (the forward pass and the
verdict's arithmetic), so what is left is the harness. With one client every pass but the
prefills runs on the event loop's own thread (services.verifier.scheduler's on_loop; the verifier's
``passes_on_loop`` metric, printed to stderr, counts them). Progress goes to stderr; the
last stdout line is key=value pairs (measurements: docs/results/overhead.md). A shared host
moves these figures: the load average is reported with them, and ``steal_pct``, the share of
CPU time the hypervisor gave other guests during the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.echo_floor import EchoCadence, paced_echo_ms  # noqa: E402
from benchmarks.overhead import cpu_times, steal_pct  # noqa: E402
from dsd.backends.factory import DEFAULT_PAIR, HfBackendConfig  # noqa: E402
from dsd.backends.hf import AUTO  # noqa: E402
from orchestrator.spec.workload import make_prompts  # noqa: E402
from services.frames import DEFAULT_TRANSPORT, TRANSPORTS  # noqa: E402
from services.launch import post_runs, read_csv, running, wait_for_runs  # noqa: E402

MODES = {"server": "sync", "edge": "sync", "colocated": "colocated", "ar": "ar"}


def round_overheads_ms(rows: list[dict], part: str) -> list[float]:
    """Per steady round of one request (rows in round order), the part's overhead in ms."""
    out = []
    for before, row in zip(rows, rows[1:]):
        t = {
            k: float(row[k])
            for k in (
                "t_send_s",
                "t_receive_s",
                "server_queue_s",
                "server_compute_s",
                "t_draft_start_s",
                "t_draft_end_s",
            )
            if row.get(k) not in (None, "")
        }
        if part == "server":
            value = t["t_receive_s"] - t["t_send_s"] - t["server_queue_s"] - t["server_compute_s"]
        elif part == "edge":
            value = t["t_send_s"] - float(before["t_receive_s"]) - (t["t_draft_end_s"] - t["t_draft_start_s"])
        else:  # a streamed round: the time since the previous one, less the server's passes
            value = t["t_receive_s"] - float(before["t_receive_s"]) - t["server_compute_s"]
        out.append(1e3 * value)
    return out


def sync_cadence(rows: list[dict], transport: str = "ws") -> EchoCadence:
    """The paced echo's cadence from a sync run's rounds: the median drafting and verify pass."""
    steady = [r for r in rows if r["round_index"] != "0" and r.get("t_draft_start_s") not in (None, "")]
    if not steady:
        raise ValueError("no steady sync round to take the echo's cadence from")
    draft_s = statistics.median(float(r["t_draft_end_s"]) - float(r["t_draft_start_s"]) for r in steady)
    verify_s = statistics.median(float(r["server_compute_s"]) for r in steady)
    return EchoCadence(transport, draft_s, verify_s)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default=str(DEFAULT_PAIR))
    parser.add_argument("--tokens", type=int, default=96, help="tokens per request")
    parser.add_argument("--requests", type=int, default=4, help="requests per mode, one after another")
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help="how the per-round messages travel (services/frames.py); the echo floor uses the same",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both services")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus truncation (1: none)")
    parser.add_argument(
        "--dtype",
        default=AUTO,
        help="the pair's precision (HfBackendConfig.dtype; auto: as the "
        "services choose it on this CPU, as the main job does)",
    )
    parser.add_argument(
        "--spin-us",
        type=int,
        default=0,
        help="both services poll for an expected message up to this long (services/spinwait.py; 0: off)",
    )
    parser.add_argument("--spin-lead-us", type=int, default=300, help="from this long before it is due")
    parser.add_argument(
        "--echo-messages",
        type=int,
        default=200,
        help="messages of the paced echo (the floor under the server overhead)",
    )
    args = parser.parse_args(argv)
    if args.tokens < 8 or args.requests < 1 or args.echo_messages < 1 or args.gamma < 1:
        parser.error("--tokens must be >= 8, --requests >= 1, --echo-messages >= 1 and --gamma >= 1")
    return args


def measure_modes(args) -> tuple[dict[str, list[float]], EchoCadence | None]:
    """One verifier and one edge, each mode's requests in turn: every part's per-round overheads
    and the sync rounds' cadence (for the echo floor)."""
    config = HfBackendConfig(pair_path=args.pair, dtype=args.dtype)
    prompts = make_prompts(config, args.requests, 24, seed=7)
    backend = [
        "--backend-json",
        config.to_json(),
        "--threads",
        str(args.threads),
        "--spin-us",
        str(args.spin_us),
        "--spin-lead-us",
        str(args.spin_lead_us),
    ]
    overheads: dict[str, list[float]] = {part: [] for part in MODES}
    cadence: EchoCadence | None = None
    with tempfile.TemporaryDirectory(prefix="dsd-hf-overhead-") as tmp:
        edge_args = backend + ["--out-dir", str(Path(tmp) / "edge")]
        with running(("services.verifier", backend), ("services.edge", edge_args), log_dir=Path(tmp)) as (
            verifier,
            edge,
        ):
            for mode in ("sync", "colocated", "ar"):
                run = _run_body(args, mode, prompts, verifier.url)
                summaries = wait_for_runs(edge, post_runs(edge, [run]), timeout_s=900)
                if any(s["status"] != "done" for s in summaries.values()):
                    raise RuntimeError(f"{mode} run failed: {summaries}")
                rows = read_csv(edge, run["run_id"], "rounds.csv")
                for request in sorted({r["request_index"] for r in rows}):
                    mine = sorted(
                        (r for r in rows if r["request_index"] == request and r["stale"] in ("0", "False")),
                        key=lambda r: int(r["round_index"]),
                    )
                    for part, part_mode in MODES.items():
                        if part_mode == mode:
                            overheads[part] += round_overheads_ms(mine, part)
                if mode == "sync":
                    cadence = sync_cadence(rows, args.transport)
                passes = verifier.get_json("/metrics")
                print(
                    f"{mode}: {len(rows)} rounds; verifier passes so far {sum(passes['passes'].values())}, "
                    f"on the loop's thread {passes.get('passes_on_loop', 0)}, verifies served by the reader "
                    f"{passes.get('verifies_inline', 0)}; polling: verifier {passes.get('spin')}, "
                    f"edge {summaries[run['run_id']].get('spin')}",
                    file=sys.stderr,
                )
    return overheads, cadence


def _run_body(args, mode: str, prompts, verifier_url: str) -> dict:
    """POST /runs' body for one mode's requests."""
    return {
        "run_id": f"hf-overhead-{mode}",
        "client_id": "client-0",
        "mode": mode,
        "gamma": args.gamma,
        "prompts": prompts,
        "max_new_tokens": args.tokens,
        "verifier_url": verifier_url,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "probe_count": 1,
        "probe_interval_ms": 1000,
        "transport": args.transport,
    }


def report(overheads: dict[str, list[float]], echo_ms: list[float]) -> dict[str, float | int]:
    """The table of every part and the echo floor; the results' overhead and floor keys."""
    results: dict[str, float | int] = {}
    print(f"{'part':10s} {'rounds':>7s} {'p50 ms':>8s} {'p90 ms':>8s} {'mean ms':>8s}")
    for part, values in overheads.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        print(f"{part:10s} {len(values):7d} {statistics.median(values):8.3f} {p90:8.3f} {statistics.mean(values):8.3f}")
        results[f"hf_overhead_{part}_p50_ms"] = statistics.median(values)
        results[f"hf_overhead_{part}_mean_ms"] = statistics.mean(values)
    results["echo_floor_p50_ms"] = statistics.median(echo_ms)
    results["server_over_floor_p50_ms"] = results["hf_overhead_server_p50_ms"] - results["echo_floor_p50_ms"]
    print(
        f"{'echo floor':10s} {len(echo_ms):7d} {statistics.median(echo_ms):8.3f} "
        f"{sorted(echo_ms)[round(0.9 * (len(echo_ms) - 1))]:8.3f} {statistics.mean(echo_ms):8.3f}"
    )
    return results


def main(argv=None) -> None:
    args = parse_args(argv)
    cpu_before = cpu_times()
    overheads, cadence = measure_modes(args)
    # The floor: two processes that only echo, at the sync rounds' own cadence, right after them.
    echo_ms = paced_echo_ms(cadence, args.echo_messages)
    print(
        f"paced echo ({'aiohttp WebSocket' if cadence.transport == 'ws' else 'raw blocking TCP'}, the client computes {1e3 * cadence.draft_s:.2f} ms before each "
        f"message, the server {1e3 * cadence.verify_s:.2f} ms before each answer): {len(echo_ms)} messages",
        file=sys.stderr,
    )
    results = report(overheads, echo_ms)
    results["transport"] = args.transport
    results["gamma"], results["temperature"], results["top_p"] = args.gamma, args.temperature, args.top_p
    results["dtype"] = HfBackendConfig(pair_path=args.pair, dtype=args.dtype).dtype
    results["spin_us"] = args.spin_us
    # On a VM the hypervisor may run other guests on our CPUs: then everything wakes late.
    results["steal_pct"] = steal_pct(cpu_before, cpu_times())
    results["load_avg_1m"], results["cpus"] = os.getloadavg()[0], os.cpu_count()
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
