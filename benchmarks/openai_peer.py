"""A peer's load generator against the edge's OpenAI-compatible API on the netns testbed, its
figures beside our own records of the same requests.

    sudo scripts/peer_venv.sh                        # NVIDIA AIPerf in .venv-peer (its own pins)
    sudo PYTHONPATH=. python benchmarks/openai_peer.py --rtt-ms 20 --rates 0.15,0.3 --requests 8

One netns testbed (orchestrator/launchers/netns.py: a verifier and an edge, their link shaped to
``--rtt-ms``) on the real pair (models/smollm2-chat); per rate, the edge's serving settings get a
fresh run folder (PUT /openai) and AIPerf runs inside the edge's network namespace, as the
device's own app would (to the edge's address: that hop is not shaped), streaming chat requests
at that Poisson rate with fixed output lengths (``ignore_eos``), the server's token counts and
per-chunk usage, so its inter-token latency is (request latency - TTFT) / (output tokens - tokens
of the first chunk). Its per-request records (profile_export.jsonl) join our requests.csv on the
X-Request-ID it sends. Ours: ``ttft_s`` (from the HTTP request's arrival at the edge to the first
committed tokens) and ``steady_per_token_s`` (first arrival to last over the tokens after the
first arrival: the same quotient as the peer's). Per rate, a line of key=value; then the pooled:

    peer_tool requests requests_ok peer_ttft_p50_ms own_ttft_p50_ms ttft_diff_pct
    peer_itl_p50_ms own_token_latency_p50_ms itl_diff_pct rows_lost

``*_diff_pct`` = 100 (peer - own) / own of the p50s, with a 95% interval from resampling the
requests (paired); ``rows_lost``: requests the peer sent with no row of ours. Needs root.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
PEER_VENV = ROOT / ".venv-peer"
PEER_TOOL = "aiperf"
EDGE_PORT = 8701  # orchestrator/launchers/netns.py's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default=str(ROOT / "models" / "smollm2-chat"))
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--rates", default="0.15,0.3", help="request rates (requests/s), comma-separated")
    parser.add_argument("--requests", type=int, default=8, help="requests per rate (after 1 warm-up)")
    parser.add_argument("--max-tokens", type=int, default=32, help="each request's output length")
    parser.add_argument("--mode", default="sync")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", default=str(ROOT / "workloads" / "instructions.jsonl"))
    parser.add_argument(
        "--aiperf",
        default=os.environ.get("DSD_AIPERF", str(PEER_VENV / "bin" / "aiperf")),
        help="the aiperf command (scripts/peer_venv.sh makes .venv-peer; env DSD_AIPERF)",
    )
    parser.add_argument("--out", default="", help="where the testbed's logs, rows and AIPerf's artifacts go")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="the whole run's bound")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    if os.geteuid() != 0:
        parser.error("the netns testbed needs root (network namespaces, iptables)")
    if not Path(args.aiperf).is_file():
        parser.error(f"--aiperf {args.aiperf}: not found; make it with scripts/peer_venv.sh")
    out = Path(args.out or f"/tmp/dsd-openai-peer-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=False)
    deadline = time.monotonic() + args.timeout_s
    print(f"peer_tool={PEER_TOOL} peer_version={_version(args.aiperf)}")
    print(
        f"pair={Path(args.pair).name} mode={args.mode} gamma={args.gamma} rtt_ms={args.rtt_ms:g} "
        f"max_tokens={args.max_tokens} cpu={_cpu()!r} load_1m_before={os.getloadavg()[0]:.2f}"
    )
    joined = []
    for rate, rows in run_testbed(args, rates, out, deadline):
        joined.append(rows.assign(rate_rps=rate))
        print(" ".join(f"{k}={v}" for k, v in {"rate_rps": f"{rate:g}", **summary(rows)}.items()))
    print(f"load_1m_after={os.getloadavg()[0]:.2f}")
    pooled = summary(pd.concat(joined, ignore_index=True))
    for key, value in pooled.items():
        print(f"{key}={value}")
    return 0 if pooled["rows_lost"] == 0 and pooled["requests_ok"] == pooled["requests"] else 1


def run_testbed(args, rates: list[float], out: Path, deadline: float):
    """(rate, the peer's records joined with our rows) per rate, on one netns testbed."""
    from dsd.backends.factory import HfBackendConfig
    from orchestrator.common import http_client
    from orchestrator.launchers.netns import NetnsTestbed
    from orchestrator.launchers.services_config import ServicesConfig

    config = ServicesConfig(HfBackendConfig(pair_path=args.pair), work_dir=str(out / "testbed"), ready_timeout_s=300.0)
    dataset = write_dataset(Path(args.prompts), out / "prompts.jsonl", args.max_tokens)
    with NetnsTestbed(config) as testbed:
        testbed.shape([args.rtt_ms])
        edge = testbed.edges[0]
        netns, ip = testbed.edge_endpoint(0)
        for rate in rates:
            run_id = f"peer-rate{rate:g}"
            http_client.call(
                "PUT",
                f"{edge.control_url}/openai",
                {
                    "verifier_url": testbed.verifier_url,
                    "mode": args.mode,
                    "gamma": args.gamma,
                    "run_id": run_id,
                    "max_concurrent": 16,
                    "probe_interval_ms": 0,
                },
                token=edge.token,
            )
            artifacts = out / run_id
            run_peer(args, netns, f"http://{ip}:{EDGE_PORT}", edge.token, dataset, rate, artifacts, deadline)
            testbed.check()
            ours = pd.read_csv(
                io.BytesIO(http_client.call("GET", f"{edge.control_url}/runs/{run_id}/requests.csv", token=edge.token))
            )
            yield rate, join(peer_records(artifacts / "profile_export.jsonl"), ours)


def write_dataset(prompts: Path, path: Path, max_tokens: int) -> Path:
    """The workload's instructions as AIPerf's single_turn records, each with its output length."""
    with open(path, "w") as f:
        for line in prompts.read_text().splitlines():
            if line.strip():
                f.write(json.dumps({"text": json.loads(line)["prompt"], "output_length": max_tokens}) + "\n")
    return path


def aiperf_command(
    args, netns: str, url: str, token: str | None, dataset: Path, rate: float, artifacts: Path
) -> list[str]:
    """AIPerf's profile command, run in the edge's namespace."""
    command = [
        "nsenter",
        f"--net={netns}",
        "--",
        args.aiperf,
        "profile",
        "--model",
        Path(args.pair).name,
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--tokenizer",
        args.pair,
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "single_turn",
        "--request-rate",
        f"{rate:g}",
        "--request-count",
        str(args.requests),
        "--warmup-request-count",
        "1",
        "--use-server-token-count",
        "--per-chunk-usage",
        "--random-seed",
        "0",
        "--extra-inputs",
        json.dumps({"ignore_eos": True, "temperature": 0}),
        "--output-artifact-dir",
        str(artifacts),
        "--export-level",
        "records",
        "--ui-type",
        "none",
    ]
    if token:
        command += ["--api-key", token]
    return command


def run_peer(
    args, netns: str, url: str, token: str | None, dataset: Path, rate: float, artifacts: Path, deadline: float
) -> None:
    """AIPerf in the edge's namespace, in its own process group, bounded by the run's deadline."""
    command = aiperf_command(args, netns, url, token, dataset, rate, artifacts)
    artifacts.mkdir(parents=True)
    with open(artifacts / "aiperf.log", "wb") as log:
        # not offline: aiperf then looks a tokenizer up in the hub's cache by name, never on disk (the
        # pair's folder is read from disk either way)
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if code != 0:
        tail = (artifacts / "aiperf.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"aiperf {'timed out' if code is None else f'exited with {code}'} at rate {rate:g}:\n{tail}")


def peer_records(path: Path) -> pd.DataFrame:
    """AIPerf's profiling records: request id, TTFT, ITL (ms), whether it failed."""
    rows = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        meta, metrics = record["metadata"], record.get("metrics", {})
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        value = lambda name: metrics.get(name, {}).get("value", np.nan)  # noqa: E731
        rows.append(
            {
                "request_id": meta["x_request_id"],
                "peer_ttft_ms": value("time_to_first_token"),
                "peer_itl_ms": value("inter_token_latency"),
                "peer_error": bool(record.get("error")),
            }
        )
    return pd.DataFrame(rows, columns=["request_id", "peer_ttft_ms", "peer_itl_ms", "peer_error"])


def join(peer: pd.DataFrame, ours: pd.DataFrame) -> pd.DataFrame:
    """The peer's records with our row of each (NaN where we have none)."""
    ours = ours.assign(
        request_id=ours["request_id"].astype(str),
        own_ttft_ms=1e3 * ours["ttft_s"],
        own_itl_ms=1e3 * ours["steady_per_token_s"],
        own_ok=ours["error"].isna() & ours["gave_up"].isna(),
    )
    return peer.merge(
        ours[["request_id", "own_ttft_ms", "own_itl_ms", "own_ok"]], on="request_id", how="left", indicator=True
    )


def summary(rows: pd.DataFrame) -> dict:
    ok = rows[~rows["peer_error"] & (rows["_merge"] == "both") & rows["own_ok"].fillna(False).astype(bool)]
    ttft = diff_pct(ok["peer_ttft_ms"].to_numpy(), ok["own_ttft_ms"].to_numpy())
    itl = diff_pct(ok["peer_itl_ms"].to_numpy(), ok["own_itl_ms"].to_numpy())
    return {
        "peer_tool": PEER_TOOL,
        "requests": len(rows),
        "requests_ok": len(ok),
        "peer_ttft_p50_ms": f"{np.median(ok['peer_ttft_ms']):.1f}",
        "own_ttft_p50_ms": f"{np.median(ok['own_ttft_ms']):.1f}",
        "ttft_diff_pct": ttft[0],
        "ttft_diff_pct_ci95": ttft[1],
        "peer_itl_p50_ms": f"{np.median(ok['peer_itl_ms']):.2f}",
        "own_token_latency_p50_ms": f"{np.median(ok['own_itl_ms']):.2f}",
        "itl_diff_pct": itl[0],
        "itl_diff_pct_ci95": itl[1],
        "rows_lost": int((rows["_merge"] != "both").sum()),
    }


def diff_pct(peer: np.ndarray, own: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[str, str]:
    """100 (p50 peer - p50 own) / p50 own, and its 95% interval over requests resampled in pairs."""
    from orchestrator.analysis.bootstrap import interval

    if len(peer) == 0:
        return "nan", "[nan,nan]"
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(peer), size=(n_boot, len(peer)))
    boot = 100 * (np.median(peer[picks], axis=1) / np.median(own[picks], axis=1) - 1)
    low, high = interval(boot)
    return f"{100 * (np.median(peer) / np.median(own) - 1):.2f}", f"[{low:.2f},{high:.2f}]"


def _version(aiperf: str) -> str:
    try:
        return subprocess.run([aiperf, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _cpu() -> str:
    from dsd.backends.machine import cpu_flags, cpu_model

    return f"{cpu_model()} x{os.cpu_count()}" + (" amx" if "amx_bf16" in cpu_flags() else "")


if __name__ == "__main__":
    sys.exit(main())
