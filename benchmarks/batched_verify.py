"""Batched verification on the real pair: one forward pass for many sessions, and what it buys.

    python benchmarks/batched_verify.py [--pair models/default-pair] [--threads 1] [--tokens 96]
        [--counts 1,2,3,4,5,6,8,10,12,16,20,24,32] [--no-capacity]     (3-8 min on this host)

Default pair, CPU, torch threads as the services use them (1). Four parts, each measured here:

1. The batched cost curve t_verify(gamma, b): one pass verifying b sessions' gamma-blocks, each
   on its own cached context (``dsd.costs.measurement.batched_verify_times_s``), and the profile's
   batch_slope fitted to it (t(gamma, b) = t(gamma, 1) * (1 + s * (b - 1))).
2. ``batch8_speedup``: 8 sessions of different prefix lengths and gammas (1..8) verified one
   after another against the same 8 verifications in one batched pass, the two interleaved
   repeat by repeat (this host is shared: only the ratio of the same moments means much).
3. ``batched_equal``: the same 8 sessions decoded greedily to the end, every round verified in
   one batched pass, against each verified alone: 1 if every emitted token is the same.
4. Capacity at one per-client token rate, DSD over co-located SD, with the verifier's own
   scheduler (services.verifier.scheduler) and device thread running the real passes in this process,
   batching off (max batch 1) and on (64). The edges are other machines: a DSD client's drafting
   is its measured time gamma * t_draft_s waited out (its tokens precomputed with the real draft
   on the target's greedy stream, which is exactly what greedy decoding commits), so the server's
   CPU does only the server's work; co-located drafting runs on the server, the draft blocks of
   the sessions waiting together batched like verifications (one draft pass per step,
   dsd.speculation.drafting.run_draft_jobs). Each client count runs every client to the end; a client's
   rate is the tokens it received while all of them ran (orchestrator.analysis.capacity.overlap_counts).
   Drift-immune target: the host's speed drifts (other jobs load it), so the target rate is not
   measured once but around every point: one co-located client alone on a serial server (median
   of 3 runs) runs before the first configuration of a count and after each, and a point's
   target is a third of the mean of the two references around it. The clients sustained are
   where a configuration's per-client time per token over its points' targets crosses 1,
   interpolated between counts (orchestrator.analysis.capacity.capacity_at), so the ratio is continuous.

Predictions, from the same runs (docs/concepts.md notation; E = tokens per round, r = the point's
target rate). Each point's rate is predicted from its own passes only, never from any capacity
figure: t_v(1) and the verify slope s, t_d(1) and the draft slope s_d, from the cost line
t(b) = t(1) * (1 + s * (b - 1)) through its passes' means by batch size
(orchestrator.analysis.capacity.fit_cost_line; with one batch size only, the configuration's median slope),
and the idle gap g: the mean time the device sat idle between two passes while the second's
work was already waiting (orchestrator.analysis.capacity.backlogged_gaps_s: the harness's hand-off, about
0.5-6 ms a pass on this loaded host). The point's round (dsd.analytic.latency_model):
  serial:  N * (t_v + g) for DSD, N * (gamma * t_d + t_v + 2g) co-located (serial_round_s)
  batched: two alternating groups (logged as the verify batch sizes):
           t_v * (2 + s * (N - 2)) + 2g, co-located + gamma * t_d * (2 + s_d * (N - 2)) + 2g
           (batched_round_s)
and its rate E / max(round, one client's own critical path). The predicted clients sustained
are where these modelled rates cross the targets, interpolated exactly as the measured ones:
``predicted`` (serial) and ``predicted_batched`` are the ratios of those counts. Also printed:
``predicted_claim4`` = 1 + gamma * t_d / t_v (no gap), and the closed forms, each configuration at
the passes of the two counts around its predicted crossing (``predicted_closed_*``:
serial_capacity, whose ratio at equal passes is 1 + (gamma t_d + g)/(t_v + g), and
batched_capacity, N_dsd = 2 + ((E/r - 2g)/t_v - 2)/s,
N_co = 2 + (E/r - 4g - 2(gamma t_d + t_v))/(gamma t_d s_d + t_v s)); point_model_ratio_* is
each point's measured rate over its modelled one.
NOTE: a saturated point's window is its passes and the gaps between them, so a model fed that
point's own mean pass times and gaps is close to an accounting of it: what it tests is the
round's make-up (N clients' passes in a row, or two alternating groups; one hand-off gap per
pass; nothing else in the round), and, below saturation, a client's own critical path. The
closed forms, one set of pass costs per configuration, assume more but are not drift-immune:
they mix the targets and pass times of different moments (the co-located batched count, a small
difference of large terms, suffers most).

Progress goes to stderr; a table to stdout, then the last line of key=value figures.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dsd.backends.factory import DEFAULT_PAIR, HfBackendConfig, load_pair  # noqa: E402
from dsd.backends.protocol import LogitsRequest, SamplingParams, run_jobs  # noqa: E402
from dsd.drive.generation import generate_ar  # noqa: E402
from dsd.analytic import latency_model as lm  # noqa: E402
from dsd.speculation.drafting import DraftJob, draft_block  # noqa: E402
from dsd.speculation.stopping import StopRule  # noqa: E402
from dsd.costs.measurement import step_time_s, batched_verify_times_s, fit_batch_slope  # noqa: E402
from dsd.drive.verifier_session import VerifierSession  # noqa: E402
from orchestrator.analysis.capacity import (
    backlogged_gaps_s,
    capacity_at,
    fit_cost_line,
    overlap_counts,  # noqa: E402
    overlap_window,
)
from orchestrator.spec.workload import make_prompts  # noqa: E402
from services.compute import PreciseTimer, ThreadDevice  # noqa: E402
from dsd.drive.batching import BatchingConfig  # noqa: E402
from services.verifier.scheduler import Scheduler  # noqa: E402

GREEDY = SamplingParams()
GAMMA = 4  # the capacity experiment's draft length
MIXED_GAMMAS = (1, 2, 3, 4, 5, 6, 7, 8)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- 2. batch8_speedup ----------------------------------------------------------------------


def speedup_8(draft, target, prompts: list[list[int]], repeats: int) -> tuple[float, float, float]:
    """(serial_s, batched_s, speedup): 8 verifications of mixed prefix lengths and gammas."""
    requests = []
    for i, (prompt, gamma) in enumerate(zip(prompts, MIXED_GAMMAS)):
        seq_id = f"speed-{i}"
        target.logits(seq_id, prompt, 1)  # the session's cache: its prompt
        drafted, _ = draft_block(draft, seq_id, prompt, gamma, GREEDY, None)
        requests.append(LogitsRequest(seq_id, prompt + drafted, gamma + 1))
    serial, batched = [], []
    for _ in range(repeats + 1):  # the first of each is a warm-up, dropped
        start = time.perf_counter()
        for r in requests:
            target.logits(r.seq_id, r.tokens, r.n_last)  # crops back to the prompt each time
        serial.append(time.perf_counter() - start)
        start = time.perf_counter()
        target.logits_batch(requests)
        batched.append(time.perf_counter() - start)
    for r in requests:
        target.release(r.seq_id)
    serial_s, batched_s = statistics.median(serial[1:]), statistics.median(batched[1:])
    return serial_s, batched_s, serial_s / batched_s


# ---- 3. batched_equal -----------------------------------------------------------------------


def batched_equal(draft, target, prompts: list[list[int]], max_new_tokens: int) -> tuple[bool, int, int]:
    """(equal, tokens compared, batched passes): greedy decoding, batched vs one at a time."""
    from dsd.backends.torch_lm import TorchLM

    alone = TorchLM(target.model, target.name + "-alone", target.eos_token_id)
    outputs = {}
    passes = 0
    for label, model in (("batched", target), ("alone", alone)):
        sessions = [
            VerifierSession(model, f"eq-{label}-{i}", p, GREEDY, StopRule(max_new_tokens))
            for i, p in enumerate(prompts)
        ]
        for s in sessions:
            s.prefill()
        for _ in range(4 * max_new_tokens):
            jobs = []
            for s, gamma in zip(sessions, MIXED_GAMMAS):
                if not s.finished:
                    drafted, _ = draft_block(draft, s.seq_id, s.committed.tokens, gamma, GREEDY, None)
                    jobs.append(s.verify_job(s.proposal_for(drafted, None)))
            if not jobs:
                break
            if label == "batched":
                passes += 1
                for ok, value in run_jobs(jobs):
                    if not ok:
                        raise value
            else:
                for job in jobs:
                    job.run()
        outputs[label] = [s.generated for s in sessions]
        for s in sessions:
            s.close()
            draft.release(s.seq_id)
    tokens = sum(len(g) for g in outputs["batched"])
    return outputs["batched"] == outputs["alone"], tokens, passes


# ---- 4. capacity ----------------------------------------------------------------------------


def draft_tables(draft, target, prompts: list[list[int]], tokens: int) -> list[dict[int, list[int]]]:
    """Per prompt: committed length -> the draft's greedy block there, on the target's own greedy
    stream (what greedy decoding commits, whatever the verdicts)."""
    tables = []
    for i, prompt in enumerate(prompts):
        stream = prompt + generate_ar(target, prompt, StopRule(tokens), seq_id=f"stream-{i}").tokens
        target.release(f"stream-{i}")
        table = {}
        for k in range(len(prompt), len(stream)):
            table[k], _ = draft_block(draft, f"table-{i}", stream[:k], GAMMA, GREEDY, None)
        draft.release(f"table-{i}")
        tables.append(table)
    return tables


@dataclass
class Point:
    """One capacity run: n clients of one configuration, each to the end."""

    rate_tok_s: float  # each client's token rate while all of them ran
    tokens_per_round: float  # E, this run's
    passes: list[tuple]  # the passes ending while all ran: (kind, batch size, start_s, end_s, ready_s)
    target_tok_s: float = math.nan  # the target rate of its moment (rate_curves)


async def _run_point(
    mode: str, n_clients: int, max_batch: int, draft, target, prompts, tables, tokens: int, t_draft_edge_s: float
) -> Point:
    """n clients of one mode on a scheduler of ``max_batch``; every pass the device ran is logged
    with its start, end and when its earliest job was submitted (its ready time)."""
    device = ThreadDevice()
    scheduler = Scheduler(BatchingConfig(max_batch, 0.0), device, None)
    scheduler.start()
    timer = PreciseTimer()
    log_: dict[float, list] = {}  # pass end -> [kind, batch size, compute_s, largest queue_s]
    receipts: list[list[float]] = [[] for _ in range(n_clients)]
    emitted: list[list[int]] = [[] for _ in range(n_clients)]

    def note(kind: str, timing) -> None:
        row = log_.setdefault(timing.end_s, [kind, timing.batch_size, timing.compute_s, 0.0])
        row[3] = max(row[3], timing.queue_s)

    async def client(i: int) -> None:
        seq_id = f"cap-{mode}-{max_batch}-{n_clients}-{i}"
        session = VerifierSession(target, seq_id, prompts[i], GREEDY, StopRule(tokens))
        await scheduler.submit("prefill", len(prompts[i]) - 1, session.prefill, i)
        while not session.finished:
            if mode == "dsd":
                await timer.sleep_until(time.perf_counter() + GAMMA * t_draft_edge_s)  # the edge drafting
                drafted = tables[i][len(session.committed)]
            else:
                (drafted, _), timing = await scheduler.submit(
                    "draft", GAMMA, DraftJob(draft, seq_id, session.committed.tokens, GAMMA, GREEDY, None), i
                )
                note("draft", timing)
            verdict, timing = await scheduler.submit(
                "verify", GAMMA, session.verify_job(session.proposal_for(drafted, None)), i
            )
            note("verify", timing)
            receipts[i].append(time.perf_counter())
            emitted[i].append(verdict.emitted)
        session.close()
        draft.release(seq_id)

    try:
        await asyncio.gather(*(client(i) for i in range(n_clients)))
    finally:
        await scheduler.stop()
        device.executor.shutdown()
    window_s, _, received = overlap_counts([np.array(r) for r in receipts], [np.array(e) for e in emitted])
    start_s, end_s = overlap_window(receipts)
    passes = [
        (kind, b, end - c, end, end - c - q) for end, (kind, b, c, q) in sorted(log_.items()) if start_s < end <= end_s
    ]
    rate = received / (n_clients * window_s) if window_s > 0 else math.nan
    return Point(rate, sum(map(sum, emitted)) / sum(map(len, emitted)), passes)


def _reference_tok_s(kw: dict) -> float:
    """One co-located client alone on a serial server (median of 3 runs): the host's speed now."""
    return statistics.median(asyncio.run(_run_point("colocated", 1, 1, **kw)).rate_tok_s for _ in range(3))


def rate_curves(configs: list[tuple[str, int]], counts: list[int], **kw) -> dict[tuple, Point]:
    """Per (mode, max_batch, n): its Point. At each count the configurations take turns, with the
    reference (one co-located client alone) run before the first and after each: a point's target
    rate is a third of the mean of the two references around it, so the host's drifting speed
    meets a point and its target alike. A configuration stops once two counts in a row fell
    below 0.7 x their targets (past its crossing)."""
    points: dict[tuple, Point] = {}
    below = {c: 0 for c in configs}
    reference = _reference_tok_s(kw)
    for n in counts:
        for mode, max_batch in configs:
            if below[mode, max_batch] >= 2:
                continue
            point = asyncio.run(_run_point(mode, n, max_batch, **kw))
            after = _reference_tok_s(kw)
            point.target_tok_s, reference = (reference + after) / 6, after
            points[mode, max_batch, n] = point
            sizes = Counter(b for kind, b, *_ in point.passes if kind == "verify")
            log(
                f"  {mode:9s} max_batch {max_batch:2d} {n:3d} clients: {point.rate_tok_s:7.1f} tok/s per client "
                f"(target {point.target_tok_s:.1f}); verify batch sizes {dict(sizes.most_common(3))}"
            )
            below[mode, max_batch] = below[mode, max_batch] + 1 if point.rate_tok_s < 0.7 * point.target_tok_s else 0
    return points


class Fit(NamedTuple):
    """One point's pass costs, from its own passes."""

    t_v: float  # t_v(GAMMA, b=1)
    s: float  # verify batch slope
    t_d: float  # co-located draft step, b=1
    s_d: float  # draft batch slope
    gap_s: float  # the device's idle gap between passes while work waited


def _cost(passes: list[tuple], kind: str, per: int, pooled_slope: float) -> tuple[float, float]:
    """(t(1), s) of one kind's passes (time over ``per``): the cost line through their means by
    batch size; with one size b only, its mean over 1 + s * (b - 1) at the pooled slope."""
    rows = [(b, (end - start) / per) for k, b, start, end, _ in passes if k == kind]
    if not rows:
        return math.nan, math.nan
    sizes, times = np.array([b for b, _ in rows]), np.array([t for _, t in rows])
    t1, s = fit_cost_line(sizes, times)
    if math.isnan(t1):
        b, s = int(sizes[0]), pooled_slope
        t1 = float(np.mean(times)) / (1 + (0.0 if b == 1 else s) * (b - 1))
    return t1, s


def _gaps_s(passes: list[tuple]) -> np.ndarray:
    if len(passes) < 2:
        return np.array([])
    starts, ends, ready = (np.array([p[i] for p in passes]) for i in (2, 3, 4))
    return backlogged_gaps_s(starts, ends, ready)


def point_fits(points: dict[tuple, Point]) -> dict[tuple, Fit]:
    """Every point's Fit. A configuration's pooled slope (the median of its points' own) and gap
    (the mean of all its backlogged gaps) stand in where a point has no second batch size or
    no backlogged gap (one client alone: the server never has work waiting)."""
    fits = {}
    for config in {key[:2] for key in points}:
        mine = {key: p for key, p in points.items() if key[:2] == config}
        pooled = {}
        for kind, per in (("verify", 1), ("draft", GAMMA)):
            slopes = [_cost(p.passes, kind, per, math.nan)[1] for p in mine.values()]
            slopes = [s for s in slopes if math.isfinite(s)]
            pooled[kind] = max(0.0, statistics.median(slopes)) if slopes else 1.0
        gaps = np.concatenate([_gaps_s(p.passes) for p in mine.values()])
        pooled_gap_s = float(np.mean(gaps)) if len(gaps) else 0.0
        for key, p in mine.items():
            own = _gaps_s(p.passes)
            fits[key] = Fit(
                *_cost(p.passes, "verify", 1, pooled["verify"]),
                *_cost(p.passes, "draft", GAMMA, pooled["draft"]),
                float(np.mean(own)) if len(own) else pooled_gap_s,
            )
    return fits


def point_model_tok_s(mode: str, max_batch: int, n: int, fit: Fit, e: float, t_draft_edge_s: float) -> float:
    """One point's per-client rate predicted from its own passes (immune to the host's drift
    between points): E over the saturated server's round of dsd.analytic.latency_model (serial: every
    client's passes in a row; batched: two alternating groups), never shorter than one client's
    own critical path (its drafting, its verification, a gap after each pass)."""
    colocated = mode == "colocated"
    own_s = GAMMA * (fit.t_d if colocated else t_draft_edge_s) + fit.t_v + fit.gap_s * (2 if colocated else 1)
    if max_batch == 1:
        server_s = lm.serial_round_s(n, GAMMA, fit.t_d, fit.t_v, fit.gap_s, colocated)
    else:
        server_s = lm.batched_round_s(n, GAMMA, fit.t_d, fit.t_v, fit.s, fit.s_d, fit.gap_s, colocated)
    return e / max(own_s, server_s)


def main() -> None:
    args, counts = _parse_args()
    torch.set_num_threads(args.threads)
    backend = HfBackendConfig(pair_path=args.pair)
    draft, target = load_pair(backend)
    results: dict[str, object] = {}
    _cost_curve(target, args, results)
    _batch8(backend, draft, target, args, results)
    if not args.no_capacity:
        _capacity(backend, draft, target, args, counts, results)
    else:
        results.update(
            capacity_ratio_batched=math.nan,
            capacity_ratio_serial=math.nan,
            predicted=math.nan,
            predicted_batched=math.nan,
        )
    results["threads"], results["load_avg_1m"], results["cpus"] = args.threads, os.getloadavg()[0], os.cpu_count()
    first = (
        "batch8_speedup",
        "batched_equal",
        "capacity_ratio_batched",
        "capacity_ratio_serial",
        "predicted",
        "predicted_batched",
    )
    ordered = {k: results[k] for k in first} | {k: v for k, v in results.items() if k not in first}
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in ordered.items()))


def _parse_args() -> tuple[argparse.Namespace, list[int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default=str(DEFAULT_PAIR))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the services' default: 1)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=64, help="cached tokens per session in the cost curve")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per client in the capacity runs")
    parser.add_argument(
        "--counts", default="1,2,3,4,5,6,8,10,12,16,20,24,32", help="client counts of the capacity runs"
    )
    parser.add_argument("--no-capacity", action="store_true", help="skip part 4 (minutes)")
    args = parser.parse_args()
    if args.threads < 1 or args.repeats < 3 or args.context < 8 or args.tokens < 16:
        parser.error("--threads >= 1, --repeats >= 3, --context >= 8 and --tokens >= 16")
    try:
        counts = sorted({int(c) for c in args.counts.split(",")})
    except ValueError:
        counts = []
    if len(counts) < 2 or counts[0] < 1:
        parser.error(f"--counts: at least two whole numbers >= 1, comma separated, got {args.counts!r}")
    return args, counts


def _cost_curve(target, args, results: dict) -> None:
    log("1. cost curve t_verify(gamma, b)")
    gammas, batches = (1, 2, 4, 8), (1, 2, 4, 8, 16)
    curve = batched_verify_times_s(target, gammas, batches, args.context, args.repeats)
    slope = fit_batch_slope(curve)
    print(f"t_verify(gamma, b) ms, context {args.context} tokens, {args.threads} thread(s); per session in ():")
    print("gamma " + "".join(f"{f'b={b}':>16s}" for b in batches))
    for g in gammas:
        print(f"{g:5d} " + "".join(f"{1e3 * curve[g, b]:8.2f} ({1e3 * curve[g, b] / b:5.2f})" for b in batches))
    print(f"fitted batch_slope = {slope:.3f}")
    results["batch_slope"] = slope


def _batch8(backend, draft, target, args, results: dict) -> None:
    log("2. batch8_speedup")
    prompts8 = [p[:n] for p, n in zip(make_prompts(backend, 8, 96, seed=5), (12, 90, 40, 64, 24, 80, 33, 56))]
    serial_s, batched_s, speedup = speedup_8(draft, target, prompts8, args.repeats)
    print(
        f"8 sessions (gamma {list(MIXED_GAMMAS)}, prefixes {[len(p) for p in prompts8]}): one after another "
        f"{1e3 * serial_s:.2f} ms, one batched pass {1e3 * batched_s:.2f} ms"
    )
    results.update(batch8_serial_ms=1e3 * serial_s, batch8_batched_ms=1e3 * batched_s, batch8_speedup=speedup)

    log("3. batched_equal")
    equal, compared, passes = batched_equal(draft, target, prompts8, 40)
    print(
        f"greedy decoding of the 8 sessions, {compared} tokens in {passes} batched passes: "
        f"{'equal' if equal else 'DIFFERENT'} to one session per pass"
    )
    results["batched_equal"] = int(equal)


def _capacity(backend, draft, target, args, counts: list[int], results: dict) -> None:
    log("4. capacity")
    context = [(i * 31 + 11) % target.vocab_size for i in range(24 + args.tokens // 2)]
    t_d_edge = step_time_s(draft, context, 1, 3 * args.repeats)  # the emulated edges' draft step
    prompts = make_prompts(backend, max(counts), 24, seed=3)
    tables = draft_tables(draft, target, prompts, args.tokens)
    kw = dict(draft=draft, target=target, prompts=prompts, tables=tables, tokens=args.tokens, t_draft_edge_s=t_d_edge)
    configs = [("dsd", 1), ("colocated", 1), ("dsd", 64), ("colocated", 64)]
    points = rate_curves(configs, counts, **kw)
    fits = point_fits(points)
    models = {key: point_model_tok_s(*key, fits[key], p.tokens_per_round, t_d_edge) for key, p in points.items()}
    _print_curves(configs, counts, points, models)
    measured, predicted = _capacities(configs, points, models, results)
    _point_ratios(points, models, results)
    _closed_form(configs, points, fits, predicted, results)
    for label, (dsd, co) in (("serial", (("dsd", 1), ("colocated", 1))), ("batched", (("dsd", 64), ("colocated", 64)))):
        results[f"capacity_ratio_{label}"] = measured[dsd] / measured[co]
        results["predicted" if label == "serial" else "predicted_batched"] = predicted[dsd] / predicted[co]
    results["t_draft_edge_ms"] = 1e3 * t_d_edge
    print(
        f"capacity ratio DSD / co-located: serial {results['capacity_ratio_serial']:.3f} (predicted "
        f"{results['predicted']:.3f}; claim 4 without the gap {results['predicted_claim4']:.3f}), batched "
        f"{results['capacity_ratio_batched']:.3f} (predicted {results['predicted_batched']:.3f})"
    )


def _print_curves(configs, counts: list[int], points: dict, models: dict) -> None:
    print("\nper-client tok/s over the target of its moment (capacity: where it crosses 1), measured (model):")
    print("clients        " + "".join(f"{n:>13d}" for n in counts))
    for mode, b in configs:
        cells = [
            f"{points[mode, b, n].rate_tok_s / points[mode, b, n].target_tok_s:6.2f}"
            f"({models[mode, b, n] / points[mode, b, n].target_tok_s:5.2f})"
            if (mode, b, n) in points
            else f"{'':13s}"
            for n in counts
        ]
        print(f"{'serial' if b == 1 else 'batched':7s} {mode[:6]:6s} " + "".join(cells))


def _capacities(configs, points: dict, models: dict, results: dict) -> tuple[dict, dict]:
    """Per configuration, clients sustained at the target rate, measured and predicted: where the
    per-client time per token over the target's (each point against its own moment's target)
    crosses 1, interpolated between counts (orchestrator.analysis.capacity.capacity_at). The prediction
    runs the same interpolation on the points' modelled rates. At the largest count run, a figure
    is a lower bound (flagged)."""
    measured, predicted = {}, {}
    for mode, b in configs:
        keys = sorted(k for k in points if k[:2] == (mode, b))
        clients = np.array([k[2] for k in keys])
        target = np.array([points[k].target_tok_s for k in keys])
        measured[mode, b] = capacity_at(clients, target / np.array([points[k].rate_tok_s for k in keys]), 1.0)
        predicted[mode, b] = capacity_at(clients, target / np.array([models[k] for k in keys]), 1.0)
        label = f"{mode}_{'serial' if b == 1 else 'batched'}"
        results[f"clients_{label}"], results[f"predicted_clients_{label}"] = measured[mode, b], predicted[mode, b]
        if max(measured[mode, b], predicted[mode, b]) >= clients.max():
            results[f"clients_{label}_lower_bound"] = 1
        print(f"clients sustained, {label}: measured {measured[mode, b]:.2f}, predicted {predicted[mode, b]:.2f}")
    return measured, predicted


def _point_ratios(points: dict, models: dict, results: dict) -> None:
    """Each point (n > 1) measured over its own model: how well a round is predicted, whatever the drift."""
    for label, b in (("serial", 1), ("batched", 64)):
        ratios = [
            p.rate_tok_s / models[k] for k, p in points.items() if k[1] == b and k[2] > 1 and math.isfinite(models[k])
        ]
        if ratios:
            results[f"point_model_ratio_{label}_median"] = statistics.median(ratios)
            results[f"point_model_ratio_{label}_max_dev"] = max(abs(r - 1) for r in ratios)


def _closed_form(configs, points: dict, fits: dict, predicted: dict, results: dict) -> None:
    """The closed forms of dsd.analytic.latency_model, each configuration's count at its own passes where
    its modelled rate crosses the target (the mean Fit, target and E of the two counts around its
    predicted crossing): claim 4 (no gap) and serial_capacity, batched_capacity (with the gap)."""
    near = {}
    for mode, b in configs:
        keys = sorted((k for k in points if k[:2] == (mode, b)), key=lambda k: k[2])
        below = [k for k in keys if k[2] <= predicted[mode, b]][-1:] or keys[:1]
        above = [k for k in keys if k[2] >= predicted[mode, b]][:1] or keys[-1:]
        pair = below + above
        fit = Fit(*(_finite_mean(getattr(fits[k], f) for k in pair) for f in Fit._fields))
        near[mode, b] = (
            fit,
            float(np.mean([points[k].target_tok_s for k in pair])),
            float(np.mean([points[k].tokens_per_round for k in pair])),
        )
        print(
            f"passes of {mode} max_batch {b} at counts {[k[2] for k in pair]}: t_v {1e3 * fit.t_v:.2f} ms, "
            f"slope {fit.s:.3f}, t_d {1e3 * fit.t_d:.2f} ms, draft slope {fit.s_d:.3f}, gap {1e3 * fit.gap_s:.2f} ms"
        )
    (dsd1, _, _), (co1, r1, e1), (dsd64, rd, ed), (co64, rc, ec) = (near[c] for c in configs)
    n = {
        "dsd_serial": lm.serial_capacity(e1, r1, GAMMA, co1.t_d, dsd1.t_v, dsd1.gap_s)[0],
        "colocated_serial": lm.serial_capacity(e1, r1, GAMMA, co1.t_d, co1.t_v, co1.gap_s)[1],
        "dsd_batched": lm.batched_capacity(ed, rd, GAMMA, co64.t_d, dsd64.t_v, dsd64.s, 1.0, dsd64.gap_s)[0],
        "colocated_batched": lm.batched_capacity(ec, rc, GAMMA, co64.t_d, co64.t_v, co64.s, co64.s_d, co64.gap_s)[1],
    }
    results.update({f"closed_clients_{k}": v for k, v in n.items()})
    results.update(
        predicted_claim4=lm.capacity_factor(GAMMA, co1.t_d, dsd1.t_v),
        predicted_closed_serial=n["dsd_serial"] / n["colocated_serial"],
        predicted_closed_batched=n["dsd_batched"] / n["colocated_batched"],
        target_rate_tok_s=statistics.median(p.target_tok_s for p in points.values()),
        tokens_per_round=statistics.mean(p.tokens_per_round for p in points.values()),
        t_draft_ms=1e3 * co1.t_d,
        t_verify_ms=1e3 * dsd1.t_v,
        gap_ms=1e3 * co1.gap_s,
        batch_slope_runs=dsd64.s,
        draft_slope_runs=co64.s_d,
    )
    print("closed forms at those passes, clients: " + ", ".join(f"{k} {v:.2f}" for k, v in n.items()))


def _finite_mean(values) -> float:
    values = [v for v in values if math.isfinite(v)]
    return statistics.mean(values) if values else math.nan


if __name__ == "__main__":
    main()
