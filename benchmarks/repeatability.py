"""Repeat-to-repeat spread of one point, pinned against unpinned CPUs.

The default model pair, synchronous DSD at RTT 10 ms (gamma 4, the crossover experiment's
requests), run --runs times with the services pinned (orchestrator/common/cpus.py, plan "on": disjoint
sets where the machine has >= 4 CPUs; on 2 CPUs the verifier alone on one CPU and the edge and
the orchestrator on the other) and --runs times unpinned (every process may use every CPU),
interleaved on one testbed (pinned first in even rounds, unpinned first in odd ones, so a slow
drift of the machine touches both alike). Per run: the median over requests of the steady
per-token time (points.csv's per_token_ms_p50). Spread = (max - min) / median over the runs.

    python benchmarks/repeatability.py [--launcher loopback|netns] [--runs 5]

The last line: spread_pinned_pct= spread_unpinned_pct= and the machine's figures. Other work on
the machine (load_avg_1m, contended runs) counts in both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from dsd.backends.factory import HfBackendConfig  # noqa: E402
from dsd.modes import SYNC  # noqa: E402
from orchestrator.analysis.points import requests_steady_per_token_s
from orchestrator.common import cpus
from orchestrator.launchers.loopback import LoopbackTestbed  # noqa: E402
from orchestrator.launchers.services_config import ServicesConfig  # noqa: E402
from orchestrator.launchers.base import PointSettings  # noqa: E402
from orchestrator.launchers.control_api import run_point_on_edges  # noqa: E402
from orchestrator.records.sweep_folder import Point  # noqa: E402
from orchestrator.spec.workload import make_prompts  # noqa: E402


def run_once(testbed, plan: dict, repeat: int, prompts, args) -> dict:
    cpus.pin_self(plan)
    before = cpus.CpuSample.now()
    settings = PointSettings(
        warmup=1,
        max_new_tokens=args.max_new_tokens,
        max_in_flight=1,
        run_prefix=f"rep{os.getpid()}",
        after_shape=lambda bed: cpus.pin_testbed(bed, plan),
    )
    rounds, requests, _links, extra = run_point_on_edges(
        Point(SYNC, args.rtt_ms, args.gamma, 1, repeat), testbed, prompts, settings
    )
    conditions = cpus.conditions(before, cpus.CpuSample.now())
    per_token_ms = 1e3 * requests_steady_per_token_s(pd.DataFrame(requests), pd.DataFrame(rounds))
    return {
        "pinned": plan["pinned"],
        "repeat": repeat,
        "per_token_ms_p50": float(per_token_ms.median()),
        "masks": extra.get("cpu_masks", {}),
        **conditions,
    }


def spread_pct(values: list[float]) -> float:
    return 100 * (max(values) - min(values)) / statistics.median(values)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launcher", choices=("loopback", "netns"), default="loopback")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, default=10.0)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be >= 2 (a spread needs two runs)")
    return args


def main() -> int:
    args = parse_args()
    backend = HfBackendConfig()
    prompts = make_prompts(backend, 1 + args.requests, 32, 0)
    config = ServicesConfig(backend, None, n_edges=1, work_dir=tempfile.mkdtemp(prefix="dsdbed-repeat-"))
    pinned_plan = cpus.plan_cpus(cpus.usable_cpus(), 1, "on")
    unpinned_plan = cpus.plan_cpus(cpus.usable_cpus(), 1, "off")
    own = os.sched_getaffinity(0)
    results = []
    if args.launcher == "netns":
        from orchestrator.launchers.netns import NetnsTestbed

        testbed = NetnsTestbed(config)
    else:
        testbed = LoopbackTestbed(config)
    try:
        for repeat in range(args.runs):
            order = (pinned_plan, unpinned_plan) if repeat % 2 == 0 else (unpinned_plan, pinned_plan)
            for plan in order:
                t0 = time.monotonic()
                results.append(run_once(testbed, plan, repeat, prompts, args))
                print(
                    f"run {len(results)}: {'pinned' if plan['pinned'] else 'unpinned'} "
                    f"{results[-1]['per_token_ms_p50']:.3f} ms/token, load {results[-1]['load_avg_1m']:.2f}, "
                    f"{time.monotonic() - t0:.1f} s",
                    file=sys.stderr,
                )
    finally:
        testbed.close()
        os.sched_setaffinity(0, own)
    table = pd.DataFrame(results)
    print(table.drop(columns=["masks"]).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    pinned = table[table.pinned]["per_token_ms_p50"].tolist()
    unpinned = table[~table.pinned]["per_token_ms_p50"].tolist()
    print(f"pinning: {pinned_plan['reason']}; masks read back: {results[0]['masks'] or results[1]['masks']}")
    print(
        " ".join(
            [
                f"spread_pinned_pct={spread_pct(pinned):.2f}",
                f"spread_unpinned_pct={spread_pct(unpinned):.2f}",
                f"median_pinned_ms={statistics.median(pinned):.3f}",
                f"median_unpinned_ms={statistics.median(unpinned):.3f}",
                f"cpus={len(cpus.usable_cpus())}",
                f"disjoint={pinned_plan['disjoint']}",
                f"contended_runs={int(table.contended.sum())}/{len(table)}",
                f"load_avg_1m_max={table.load_avg_1m.max():.2f}",
                f"steal_pct_max={table.cpu_steal_pct.max():.2f}",
                f"launcher={args.launcher}",
                f"rtt_ms={args.rtt_ms:g}",
                f"gamma={args.gamma}",
                f"runs={args.runs}",
            ]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
