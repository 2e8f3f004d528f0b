"""Does polling for expected messages (services/spinwait.py) hurt concurrent clients?

    python benchmarks/spin_clients.py [--clients 2] [--spin-us 2000] [--spin-lead-us 1000] [--tokens 64]

The default pair, sync DSD, one verifier and one edge process per client (each edge alone in its
process, so each polls for its verdicts; the verifier, serving several sessions, never does),
all clients at once, over loopback, first with polling off and then on, on fresh services each
time. Per setting: the median round (verdict to verdict) over all clients' steady rounds, the
clients' mean token rate, and what the polling did (windows opened, caught while polling, ms
spent polling, summed over the edges and the verifier). Greedy: the tokens must be the same in
both settings. Progress goes to stderr; the last stdout line is key=value pairs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsd.backends.factory import DEFAULT_PAIR, HfBackendConfig  # noqa: E402
from orchestrator.spec.workload import make_prompts  # noqa: E402
from services.launch import post_runs, read_csv, running, wait_for_runs  # noqa: E402


def measure(args, spin_us: int, prompts: list) -> dict:
    backend = [
        "--backend-json",
        HfBackendConfig(pair_path=args.pair).to_json(),
        "--threads",
        "1",
        "--spin-us",
        str(spin_us),
        "--spin-lead-us",
        str(args.spin_lead_us if spin_us else 0),
    ]
    with tempfile.TemporaryDirectory(prefix="dsd-spin-clients-") as tmp:
        specs = [("services.verifier", backend + ["--max-sessions", "64"])]
        specs += [("services.edge", backend + ["--out-dir", str(Path(tmp) / f"edge{i}")]) for i in range(args.clients)]
        with running(*specs, log_dir=Path(tmp)) as (verifier, *edges):
            runs = {}
            for i, edge in enumerate(edges):
                run = {
                    "run_id": f"spin{spin_us}-c{i}",
                    "client_id": f"client-{i}",
                    "mode": "sync",
                    "gamma": 4,
                    "prompts": [prompts[i]],
                    "max_new_tokens": args.tokens,
                    "verifier_url": verifier.url,
                    "probe_count": 1,
                    "probe_interval_ms": 1000,
                }
                post_runs(edge, [run])
                runs[run["run_id"]] = edge
            rounds_ms, rates, tokens, spin = [], [], [], {"windows": 0, "caught": 0, "spun_ms": 0.0}
            for run_id, edge in runs.items():
                summary = wait_for_runs(edge, [run_id], timeout_s=900)[run_id]
                if summary["status"] != "done":
                    raise RuntimeError(f"{run_id} failed: {summary}")
                rows = read_csv(edge, run_id, "rounds.csv")
                receipts = [float(r["t_receive_s"]) for r in rows]
                rounds_ms += [1e3 * (b - a) for a, b in zip(receipts[1:], receipts[2:])]
                (request,) = read_csv(edge, run_id, "requests.csv")
                rates.append(int(request["tokens"]) / float(request["wall_s"]))
                tokens.append(request["token_ids"])
                for key in spin:
                    spin[key] += edge.get_json(f"/runs/{run_id}")["spin"].get(key, 0)
            for key in spin:
                spin[key] += verifier.get_json("/metrics")["spin"].get(key, 0)
    print(
        f"spin_us {spin_us}: round p50 {statistics.median(rounds_ms):.2f} ms over {len(rounds_ms)} rounds, "
        f"mean rate {statistics.mean(rates):.1f} tok/s per client, polling {spin}",
        file=sys.stderr,
    )
    return {"round_p50_ms": statistics.median(rounds_ms), "tok_s": statistics.mean(rates), "tokens": tokens, **spin}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default=str(DEFAULT_PAIR))
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--spin-us", type=int, default=2000)
    parser.add_argument("--spin-lead-us", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if args.clients < 1 or args.spin_us < 1 or args.tokens < 8:
        parser.error("--clients >= 1, --spin-us >= 1 and --tokens >= 8")
    prompts = make_prompts(HfBackendConfig(pair_path=args.pair), args.clients, 24, seed=11)
    off, on = measure(args, 0, prompts), measure(args, args.spin_us, prompts)
    results = {
        "clients": args.clients,
        "spin_us": args.spin_us,
        "round_p50_ms_off": off["round_p50_ms"],
        "round_p50_ms_on": on["round_p50_ms"],
        "tok_s_off": off["tok_s"],
        "tok_s_on": on["tok_s"],
        "windows_on": on["windows"],
        "caught_on": on["caught"],
        "spun_ms_on": on["spun_ms"],
        "same_tokens": int(off["tokens"] == on["tokens"]),
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))


if __name__ == "__main__":
    main()
