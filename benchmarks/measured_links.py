"""Every shipped measured 5G trace (data/cicv5g/) replayed: how closely the link follows it, and
whether requests in flight through its stalls complete exactly.

1. Replay error (netns, root): each trace's slice replayed by the shaper (`Shaper.schedule`,
   packets kept in order as the trace's stalls need) on a test network, probed every 10 ms; each
   probe's RTT against what the trace implies for it (the up half in force when it left, the
   down half when its reply started back), away from the instants of change: probes whose round
   trip saw no step, sent at least 2 ms after the last one.
2. Stalls: the rural trace's slice around its 12-s stall is the link of a sweep of the four modes
   (`experiments/measured-rural-n8-v10.toml`, its requests back to back through the slice), on
   netns where available, else on the sim launcher (virtual time: sync and pipelined follow the
   trace round by round). A stall request is one whose longest gap between arrivals is >= 5 s;
   it is exact when its tokens are the target's greedy tokens for its prompt. rows_lost counts
   requests missing from requests.csv.
3. The adaptive controller against the per-segment oracle on every trace (``benchmarks/adaptive.py
   --rtt-trace``, sim or netns): a slice of each trace (``--adaptive-slice-s`` from
   ``ADAPTIVE_FROM_S``) is the link, the prompts alternate between alpha 0.9 and 0.3, and the
   oracle's segments are the trace's windows grouped into RTT levels (benchmarks/trace_levels.py),
   every static arm timed with the link held at each level. Per trace: the policies and the best
   static arm above the oracle, and the levels check (each static arm's run under the trace against
   its own times at the levels: how far the levels stand from the trace).

Prints a table per part, then as the LAST line:
``traces= replay_err_p50_ms= replay_err_p99_ms= stall_requests= stall_requests_exact= rows_lost=
model_vs_oracle_pct_max= best_static_vs_oracle_pct_min=`` (the model policy's per-token time above
the oracle on its worst trace, the best static arm's on its best; goals: replay error p50 <= 1 ms
and p99 <= 5 ms, every stall request exact with at least 3 stalls of >= 5 s crossed, 0 rows lost,
the model within 10% of the oracle on every trace while the best static is further on at least
one). A part left out (``--parts``) prints nan.

    flock /tmp/dsd-netns.lock python benchmarks/measured_links.py [--launcher auto|netns|sim]
        [--parts replay stalls adaptive] [--slice-s 20] [--stall-from-s 80] [--adaptive-slice-s 30]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from netem import measured  # noqa: E402
from netem.measure import percentile  # noqa: E402
from netem.schedule import LinkSchedule  # noqa: E402
from dsd.provenance import git_commit  # noqa: E402

TRACES = sorted((ROOT / "data" / "cicv5g").glob("*.csv"))
RURAL = ROOT / "data" / "cicv5g" / "south_n8_v10_02.csv"
EXPERIMENT = ROOT / "experiments" / "measured-rural-n8-v10.toml"
STALL_MIN_MS = 5000.0
PARTS = ("replay", "stalls", "adaptive")
# Where each trace's adaptive slice starts (the others: at 0). The rural trace's first 20 s hold no
# RTT above 53 ms; from 12 s a run of 12 requests sees 10 s of that, then its first holds of packets
# (0.95 s at 22.8 s, 0.3 and 0.7 s at 26.2 and 27.2 s); its 12-s stall at 84 s is the stall part's.
ADAPTIVE_FROM_S = {"south_n8_v10_02.csv": 12.0}
PROBE_INTERVAL_S = 0.01
SETTLE_S = 0.002


def trace_slice(path: Path, from_s: float, length_s: float) -> list[tuple[float, float]]:
    """The trace's rows in [from_s, from_s + length_s), re-timed from 0 (the row in force at
    from_s first). length_s 0: to the end."""
    rows = [(s.at_s, dict(s.changes)["rtt_ms"]) for s in LinkSchedule.from_trace_csv(path).steps]
    end_s = math.inf if not length_s else from_s + length_s
    first = max(0, bisect.bisect_right([t for t, _ in rows], from_s) - 1)
    return [(max(0.0, round(t - from_s, 3)), rtt) for t, rtt in rows[first:] if t < end_s]


def expected_rtt_ms(times_s: list[float], rtts_ms: list[float], sent_s: float) -> float:
    at = lambda t: rtts_ms[max(0, bisect.bisect_right(times_s, t) - 1)]  # noqa: E731
    up_ms = at(sent_s) / 2
    return up_ms + at(sent_s + up_ms / 1000) / 2


def replay_errors_ms(trace: list[tuple[float, float]]) -> list[float]:
    """Replay one trace slice on a fresh test network; |probe RTT - trace RTT| away from changes."""
    from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig, measure

    times_s, rtts_ms = [t for t, _ in trace], [r for _, r in trace]
    base = LinkSpec(rtt_ms=rtts_ms[0])
    specs = [(t, LinkSpec(rtt_ms=r)) for t, r in trace]
    duration_s = times_s[-1] + 1.0
    with Topology(TopologyConfig(n_edges=1)) as topo, Shaper(ShaperConfig(backend="auto", verify_count=20)) as shaper:
        shaper.apply(topo.links([base]))
        t0 = time.monotonic() + 0.2
        shaper.schedule([(t0 + at_s, [spec]) for at_s, spec in specs], keep_order=True)
        target = measure.RttTarget(topo.edges[0].name, topo.edges[0].netns, topo.verifier.ip)
        timeline = [[]]
        measure.probe_rtts(
            [target],
            count=int((0.2 + duration_s) / PROBE_INTERVAL_S),
            interval_s=PROBE_INTERVAL_S,
            timeout_s=15.0,
            timeline=timeline,
        )
    errors = []
    for sent_abs_s, rtt_ms in timeline[0]:
        sent_s = sent_abs_s - t0
        if not 0 <= sent_s <= times_s[-1]:
            continue
        want_ms = expected_rtt_ms(times_s, rtts_ms, sent_s)
        i = bisect.bisect_right(times_s, sent_s)
        last_step_s = times_s[i - 1] if i else -math.inf
        next_step_s = times_s[i] if i < len(times_s) else math.inf
        if sent_s - last_step_s >= SETTLE_S and sent_s + want_ms / 1000 < next_step_s:
            errors.append(abs(rtt_ms - want_ms))
    return errors


def run_stall_sweep(launcher: str, trace: list[tuple[float, float]], out: Path, requests: int) -> Path:
    """The rural experiment on the slice, through `dsdbed sweep` (what a user runs)."""
    csv_path = out / "slice.csv"
    csv_path.write_text(measured.format_trace(trace))
    text = EXPERIMENT.read_text()
    text = text.replace('trace_csv = "../data/cicv5g/south_n8_v10_02.csv"', f'trace_csv = "{csv_path}"')
    text = "\n".join(f"requests = {requests}" if line.startswith("requests = ") else line for line in text.splitlines())
    if launcher == "netns":
        text += '\nschedule_order = "queue"\n'  # the stall's packets leave together, as measured
    toml = out / "experiment.toml"
    toml.write_text(text + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "sweep",
            str(toml),
            "--launcher",
            launcher,
            "--out",
            str(out / "sweep"),
        ],
        check=True,
        cwd=ROOT,
        timeout=1800,
    )
    return out / "sweep"


def greedy_tokens(toml: Path, n: int) -> list[list[int]]:
    from dsd.backends.factory import load_pair
    from dsd.drive.generation import generate_ar
    from dsd.speculation.stopping import StopRule
    from orchestrator.spec.experiment import load_experiment
    from orchestrator.spec.workload import make_prompts

    experiment = load_experiment(toml)
    _, target = load_pair(experiment.backend)
    prompts = make_prompts(
        experiment.backend, experiment.warmup_requests + n, experiment.prompt_tokens, experiment.seed
    )
    stop = StopRule(experiment.max_new_tokens, target.eos_token_id)
    return [generate_ar(target, prompts[experiment.warmup_requests + i], stop, seq_id=str(i)).tokens for i in range(n)]


def stall_figures(sweep: Path, expected: list[list[int]], n_modes: int) -> dict:
    requests = pd.read_csv(sweep / "requests.csv")
    if "longest_gap_ms" in requests and requests["longest_gap_ms"].notna().any():
        crossed = requests["longest_gap_ms"] >= STALL_MIN_MS
    else:  # the sim's rows carry no receipt times: a request that long
        crossed = requests["wall_s"] * 1000 >= STALL_MIN_MS
    exact = [
        str(row.token_ids).split() == [str(t) for t in expected[int(row.request_index)]]
        for row in requests.itertuples()
    ]
    stalled = requests[crossed]
    return {
        "stall_requests": int(crossed.sum()),
        "stall_requests_exact": int(sum(e for e, c in zip(exact, crossed) if c)),
        "rows_lost": n_modes * len(expected) - len(requests.drop_duplicates(["point", "request_index"])),
        "all_exact": all(exact),
        "stalled_modes": sorted(set(stalled["mode"])),
        "gave_up": int(requests["gave_up"].astype("string").fillna("").ne("").sum()) if "gave_up" in requests else 0,
    }


def netns_available() -> bool:
    if os.geteuid() != 0:
        return False
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        return False
    return True


def replay_part(launcher: str, slice_s: float) -> list[float]:
    """Every trace's first ``slice_s`` replayed on netns: the probes' errors (none on the sim)."""
    errors: list[float] = []
    print(f"{'trace':<28}{'probes':>8}{'err p50 ms':>12}{'err p99 ms':>12}")
    for path in TRACES:
        if launcher != "netns":
            print(f"{path.name:<28}{'-':>8}{'(sim: no packets)':>24}")
            continue
        mine = replay_errors_ms(trace_slice(path, 0.0, slice_s))
        errors += mine
        print(f"{path.name:<28}{len(mine):>8}{percentile(mine, 50):>12.3f}{percentile(mine, 99):>12.3f}")
    return errors


def stall_part(launcher: str, args: argparse.Namespace, out: Path) -> dict:
    sweep = run_stall_sweep(launcher, trace_slice(RURAL, args.stall_from_s, args.slice_s), out, args.requests)
    expected = greedy_tokens(out / "experiment.toml", args.requests)
    stalls = stall_figures(sweep, expected, n_modes=4)
    print(f"rural slice {args.stall_from_s:g}+{args.slice_s:g} s on {launcher}: {stalls}; sweep in {sweep}")
    return stalls


def adaptive_argv(launcher: str, trace_csv: Path, args: argparse.Namespace) -> list[str]:
    """benchmarks/adaptive.py's command line for one trace's slice: the oracle's segments by the
    level rule (benchmarks/trace_levels.py), the same scenario on either launcher."""
    return [
        "--launcher",
        launcher,
        "--rtt-trace",
        str(trace_csv),
        "--level-window-s",
        f"{args.level_window_s:g}",
        "--level-factor",
        f"{args.level_factor:g}",
        "--seeds",
        str(args.seeds),
        "--first-seed",
        str(args.first_seed),
        "--requests",
        str(args.adaptive_requests),
        "--alpha-requests",
        str(args.alpha_requests),
        "--tokens",
        str(args.adaptive_tokens),
        "--warmup-requests",
        str(args.warmup_requests),
    ]


def adaptive_trace(path: Path, launcher: str, args: argparse.Namespace, out: Path) -> dict:
    """One trace's slice through benchmarks/adaptive.py (its runs pickled beside), or its figures
    read back from ``out`` when a run with the same command line finished there (a run with
    another one is refused: a different --out is needed)."""
    from benchmarks import adaptive

    from_s = ADAPTIVE_FROM_S.get(path.name, 0.0) if args.adaptive_from_s is None else args.adaptive_from_s
    stem = f"adaptive-{path.stem}-{from_s:g}s"
    trace_csv, done = out / f"{stem}.csv", out / f"{stem}.json"
    argv = adaptive_argv(launcher, trace_csv, args)
    if done.exists():
        saved = json.loads(done.read_text())
        if saved["argv"] != argv:
            raise SystemExit(f"{done} holds a run of other arguments ({' '.join(saved['argv'])}); choose another --out")
        print(f"--- {path.name}: read back from {done} (commit {saved['commit']})", flush=True)
        return saved["figures"]
    trace_csv.write_text(measured.format_trace(trace_slice(path, from_s, args.adaptive_slice_s)))
    print(
        f"--- {path.name} from {from_s:g} s for {args.adaptive_slice_s:g} s: benchmarks/adaptive.py " + " ".join(argv),
        flush=True,
    )
    figures = {**adaptive.main(argv + ["--save", str(out / f"{stem}.pkl")]), "from_s": from_s}
    commit = (git_commit() or "")[:7]
    done.write_text(json.dumps({"argv": argv, "commit": commit, "figures": figures}, indent=1) + "\n")
    return figures


def adaptive_part(launcher: str, args: argparse.Namespace, out: Path) -> dict[str, dict]:
    """The adaptive controller against the per-segment oracle on each trace's slice: trace name ->
    benchmarks/adaptive.py's figures (scored from request --warmup-requests on; "every request"
    beside)."""
    figures = {
        path.name: adaptive_trace(path, launcher, args, out)
        for path in TRACES
        if not args.traces or path.name in args.traces
    }
    print(
        f"{'trace':<28}{'from s':>7}{'model %':>9}{'bandit %':>10}{'best static %':>15}{'levels check %':>20}"
        f"{'every request: model %':>24}{'best static %':>15}"
    )
    for name, f in figures.items():
        check = f"{f['levels_err_pct_min']:+.1f} .. {f['levels_err_pct_max']:+.1f}"
        print(
            f"{name:<28}{f['from_s']:>7g}{f['model_vs_oracle_pct']:>9.1f}{f['bandit_vs_oracle_pct']:>10.1f}"
            f"{f['best_static_vs_oracle_pct']:>15.1f}{check:>20}{f['model_vs_oracle_pct_every_request']:>24.1f}"
            f"{f['best_static_vs_oracle_pct_every_request']:>15.1f}"
        )
    return figures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--launcher", choices=("auto", "netns", "sim"), default="auto")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to measure (default: all); a part not run prints nan",
    )
    parser.add_argument("--slice-s", type=float, default=20.0, help="seconds of each trace replayed (0 = whole)")
    parser.add_argument(
        "--stall-from-s", type=float, default=80.0, help="where the rural slice starts (its 12-s stall is at 84.1 s)"
    )
    parser.add_argument("--requests", type=int, default=24, help="requests per mode through the rural slice")
    parser.add_argument(
        "--traces",
        nargs="+",
        choices=[p.name for p in TRACES],
        default=[],
        help="adaptive: only these traces (default: every one)",
    )
    parser.add_argument(
        "--adaptive-slice-s",
        type=float,
        default=30.0,
        help="seconds of each trace the adaptive runs follow (from ADAPTIVE_FROM_S: 0, the rural 12)",
    )
    parser.add_argument(
        "--adaptive-from-s",
        type=float,
        default=None,
        help="where every chosen trace's adaptive slice starts (default: ADAPTIVE_FROM_S)",
    )
    parser.add_argument("--level-window-s", type=float, default=1.0, help="the level rule's windows")
    parser.add_argument("--level-factor", type=float, default=1.25, help="the level rule's bins")
    parser.add_argument("--seeds", type=int, default=1, help="adaptive: seeds per trace")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--adaptive-requests", type=int, default=12, help="adaptive: requests per run")
    parser.add_argument(
        "--alpha-requests",
        type=int,
        default=6,
        help="adaptive: requests per prompt class, in turn (default: 6 at alpha 0.9, then 6 at 0.3)",
    )
    parser.add_argument("--adaptive-tokens", type=int, default=32, help="adaptive: tokens per request")
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=1,
        help="adaptive: every run scored from this request on, the oracle's prompts too (the "
        "controller's cold start left out; every request's score printed beside)",
    )
    parser.add_argument("--out", default="", help="where the sweep and slices go (default: a temp folder)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    launcher = ("netns" if netns_available() else "sim") if args.launcher == "auto" else args.launcher
    out = Path(args.out or tempfile.mkdtemp(prefix="dsd-measured-links-"))
    out.mkdir(parents=True, exist_ok=True)
    errors = replay_part(launcher, args.slice_s) if "replay" in args.parts else []
    nan = {"stall_requests": math.nan, "stall_requests_exact": math.nan, "rows_lost": math.nan}
    stalls = stall_part(launcher, args, out) if "stalls" in args.parts else nan
    adaptive = adaptive_part(launcher, args, out) if "adaptive" in args.parts else {}

    pct = lambda q: percentile(errors, q) if errors else math.nan  # noqa: E731
    model = max((f["model_vs_oracle_pct"] for f in adaptive.values()), default=math.nan)
    static = min((f["best_static_vs_oracle_pct"] for f in adaptive.values()), default=math.nan)
    print(
        f"traces={len(TRACES)} replay_err_p50_ms={pct(50):.3f} replay_err_p99_ms={pct(99):.3f} "
        f"stall_requests={stalls['stall_requests']} stall_requests_exact={stalls['stall_requests_exact']} "
        f"rows_lost={stalls['rows_lost']} model_vs_oracle_pct_max={model:.1f} "
        f"best_static_vs_oracle_pct_min={static:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
