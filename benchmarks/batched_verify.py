"""Batched verification on the real pair: one forward pass for many sessions, and what it buys.

    python benchmarks/batched_verify.py [--pair models/default-pair] [--threads 1] [--quick]

Default pair, CPU, torch threads as the services use them (1). Four parts, each measured here:

1. The batched cost curve t_verify(gamma, b): one pass verifying b sessions' gamma-blocks, each
   on its own cached context (``dsd.timing.batched_verify_times_s``), and the profile's
   batch_slope fitted to it (t(gamma, b) = t(gamma, 1) * (1 + s * (b - 1))).
2. ``batch8_speedup``: 8 sessions of different prefix lengths and gammas (1..8) verified one
   after another against the same 8 verifications in one batched pass, the two interleaved
   repeat by repeat (this host is shared: only the ratio of the same moments means much).
3. ``batched_equal``: the same 8 sessions decoded greedily to the end, every round verified in
   one batched pass, against each verified alone: 1 if every emitted token is the same.
4. Capacity at one per-client token rate, DSD over co-located SD, with the verifier's own
   scheduler (services.scheduler) and device thread running the real passes in this process,
   batching off (max batch 1) and on (64). The edges are other machines: a DSD client's drafting
   is its measured time gamma * t_draft_s waited out (its tokens precomputed with the real draft
   on the target's greedy stream, which is exactly what greedy decoding commits), so the server's
   CPU does only the server's work; co-located drafting runs on the server, one session after
   another. Each client count runs every client to the end; a client's rate is the tokens it
   received while all of them ran (orchestrator.capacity.overlap_counts). The target rate is a
   third of what one co-located client gets alone (median of 3 runs); the clients sustained at
   it are interpolated
   between measured counts (orchestrator.capacity.capacity_at), so the ratio is continuous. The
   four configurations take turns at each client count, so that a drifting host meets them alike.

Predictions (REFERENCE.md notation; E = measured tokens per round, r = target rate, s = slope;
t_d, t_v and s from the device's own timings of the capacity runs' passes, each configuration's
from its own passes: the passes of one process slow down with the Python work of the clients it
serves, which differs between configurations):
  serial (claim 4):   N_dsd / N_co = 1 + gamma * t_d / t_v
  batched (ours, dsd.latency_model.batched_capacity): the scheduler starts the next pass as soon
      as the device is free, with every job of one kind waiting then; the clients just served are
      not among them, so saturated clients fall into two groups whose passes alternate (logged as
      the verify batch sizes), and a client round holds two verification passes,
      t_v(a) + t_v(N - a) = t_v * (2 + s * (N - 2)), plus, co-located, N * gamma * t_d of drafting:
      N_dsd = 2 + (E / (r * t_v) - 2) / s
      N_co  = (E / r - 2 * t_v * (1 - s)) / (gamma * t_d + s * t_v)

Each point is also set against a prediction from its own passes (the round above, or N passes
in a row without batching), immune to the host's drift between points: point_model_ratio_*.

Progress goes to stderr; a table to stdout, then the last line of key=value figures.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
from collections import Counter
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np    # noqa: E402
import torch    # noqa: E402

from dsd.backends.factory import DEFAULT_PAIR, HfBackendConfig, load_pair  # noqa: E402
from dsd.backends.protocol import LogitsRequest, SamplingParams, run_jobs    # noqa: E402
from dsd.decoding import generate_ar    # noqa: E402
from dsd.drafting import draft_block    # noqa: E402
from dsd.latency_model import batched_capacity    # noqa: E402
from dsd.stopping import StopRule    # noqa: E402
from dsd.timing import _step_time_s, batched_verify_times_s, fit_batch_slope    # noqa: E402
from dsd.verifier_session import VerifierSession    # noqa: E402
from orchestrator.capacity import capacity_at, overlap_counts    # noqa: E402
from orchestrator.workload import make_prompts    # noqa: E402
from services.compute import PreciseTimer, ThreadDevice    # noqa: E402
from services.scheduler import Scheduler, SchedulerConfig    # noqa: E402

GREEDY = SamplingParams()
GAMMA = 4                       # the capacity experiment's draft length
MIXED_GAMMAS = (1, 2, 3, 4, 5, 6, 7, 8)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- 2. batch8_speedup ----------------------------------------------------------------------

def speedup_8(draft, target, prompts: list[list[int]], repeats: int) -> tuple[float, float, float]:
    """(serial_s, batched_s, speedup): 8 verifications of mixed prefix lengths and gammas."""
    requests = []
    for i, (prompt, gamma) in enumerate(zip(prompts, MIXED_GAMMAS)):
        seq_id = f"speed-{i}"
        target.logits(seq_id, prompt, 1)                               # the session's cache: its prompt
        drafted, _ = draft_block(draft, seq_id, prompt, gamma, GREEDY, torch.Generator())
        requests.append(LogitsRequest(seq_id, prompt + drafted, gamma + 1))
    serial, batched = [], []
    for _ in range(repeats + 1):          # the first of each is a warm-up, dropped
        start = time.perf_counter()
        for r in requests:
            target.logits(r.seq_id, r.tokens, r.n_last)                 # crops back to the prompt each time
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
        sessions = [VerifierSession(model, f"eq-{label}-{i}", p, GREEDY, StopRule(max_new_tokens))
                    for i, p in enumerate(prompts)]
        for s in sessions:
            s.prefill()
        for _ in range(4 * max_new_tokens):
            jobs = []
            for s, gamma in zip(sessions, MIXED_GAMMAS):
                if not s.finished:
                    drafted, _ = draft_block(draft, s.seq_id, s.committed.tokens, gamma, GREEDY, torch.Generator())
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
            table[k], _ = draft_block(draft, f"table-{i}", stream[:k], GAMMA, GREEDY, torch.Generator())
        draft.release(f"table-{i}")
        tables.append(table)
    return tables


async def _run_point(mode: str, n_clients: int, max_batch: int, draft, target, prompts, tables,
                     tokens: int, t_draft_edge_s: float, passes: dict | None = None) -> tuple[float, float]:
    """(tokens/s per client while all ran, tokens per round) for n clients of one mode; ``passes``
    collects every pass the device ran, per (mode, max_batch): its end -> (kind, batch size, compute_s)."""
    device = ThreadDevice()
    scheduler = Scheduler(SchedulerConfig(max_batch, 0.0), device, None)
    scheduler.start()
    timer = PreciseTimer()
    mine = None if passes is None else {}
    receipts: list[list[float]] = [[] for _ in range(n_clients)]
    emitted: list[list[int]] = [[] for _ in range(n_clients)]

    async def client(i: int) -> None:
        seq_id = f"cap-{mode}-{max_batch}-{n_clients}-{i}"
        session = VerifierSession(target, seq_id, prompts[i], GREEDY, StopRule(tokens))
        await scheduler.submit("prefill", len(prompts[i]) - 1, session.prefill, i)
        while not session.finished:
            if mode == "dsd":
                await timer.sleep_until(time.perf_counter() + GAMMA * t_draft_edge_s)   # the edge drafting
                drafted = tables[i][len(session.committed)]
            else:
                (drafted, _), timing = await scheduler.submit("draft", GAMMA, lambda: draft_block(
                    draft, seq_id, session.committed.tokens, GAMMA, GREEDY, torch.Generator()), i)
                if mine is not None:
                    mine[timing.end_s] = ("draft", timing.batch_size, timing.compute_s)
            verdict, timing = await scheduler.submit("verify", GAMMA, session.verify_job(session.proposal_for(drafted, None)), i)
            if mine is not None:
                mine[timing.end_s] = ("verify", timing.batch_size, timing.compute_s)
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
    if mine is not None:
        passes.setdefault((mode, max_batch), {}).update(mine)
        start_s, end_s = max(r[0] for r in receipts), min(r[-1] for r in receipts)
        sizes = Counter(b for t, (k, b, _) in mine.items() if k == "verify" and start_s < t <= end_s)
        busy_s = sum(c for t, (_, _, c) in mine.items() if start_s < t <= end_s)
        log(f"    verify batch sizes {dict(sizes.most_common(4))}; device busy {busy_s / max(window_s, 1e-9):.0%} of the window")
    per_round = sum(map(sum, emitted)) / sum(map(len, emitted))
    rate = received / (n_clients * window_s) if window_s > 0 else math.nan
    if mine is not None:
        model = point_model_tok_s(mode, n_clients, max_batch, pass_fit(mine), per_round, t_draft_edge_s)
        log(f"    the point's own passes predict {model:.1f} tok/s per client: measured / model {rate / model:.2f}")
        passes.setdefault("model", {})[mode, max_batch, n_clients] = rate / model
    return rate, per_round


def rate_curves(configs: list[tuple[str, int]], counts: list[int], target_rate: float, **kw) -> tuple[dict, list]:
    """Per (mode, max_batch) and client count, each client's rate. The configurations take turns
    at each count (this host's speed drifts: neighbours in the table see the same moments); one
    stops once two counts in a row fell below 0.7 x the target rate (past its crossing)."""
    rates: dict[tuple[str, int], dict[int, float]] = {c: {} for c in configs}
    below = {c: 0 for c in configs}
    per_round = []
    for n in counts:
        for mode, max_batch in configs:
            if below[mode, max_batch] >= 2:
                continue
            rate, tpr = asyncio.run(_run_point(mode, n, max_batch, **kw))
            rates[mode, max_batch][n] = rate
            per_round.append(tpr)
            log(f"  {mode:9s} max_batch {max_batch:2d} {n:3d} clients: {rate:7.1f} tok/s per client")
            below[mode, max_batch] = below[mode, max_batch] + 1 if rate < 0.7 * target_rate else 0
    return rates, per_round


def point_model_tok_s(mode: str, n: int, max_batch: int, fit: tuple[float, float, float], e: float,
                      t_draft_edge_s: float) -> float:
    """One point's per-client rate predicted from its own passes (immune to the host's drift
    between points): E over the round of dsd.latency_model.batched_capacity (two alternating
    groups) when batching, else N passes one after another; never shorter than one client's
    own critical path."""
    t_v, s, t_d = fit
    own_s = GAMMA * (t_draft_edge_s if mode == "dsd" else t_d) + t_v
    drafting_s = 0.0 if mode == "dsd" else n * GAMMA * t_d
    if max_batch == 1:
        server_s = drafting_s + n * t_v
    elif n == 1:
        server_s = own_s
    else:
        server_s = drafting_s + t_v * (2 + (0.0 if math.isnan(s) else s) * (n - 2))
    return e / max(own_s, server_s)


def pass_fit(passes: dict) -> tuple[float, float, float]:
    """(t_v(GAMMA, b=1), batch_slope, t_d per draft step) from one configuration's passes: the
    median verify pass of one session, the slope fitted to the median pass of every batch size,
    and the median draft block over GAMMA (a draft pass of b runs b blocks one after another);
    nan where the configuration ran no such pass."""
    by_size: dict[int, list[float]] = {}
    blocks = []
    for kind, b, compute_s in passes.values():
        if kind == "verify":
            by_size.setdefault(b, []).append(compute_s)
        else:
            blocks.append(compute_s / b)
    medians = {(GAMMA, b): statistics.median(c) for b, c in by_size.items()}
    slope = fit_batch_slope(medians) if len(medians) > 1 and (GAMMA, 1) in medians else math.nan
    return (medians.get((GAMMA, 1), math.nan), slope,
            statistics.median(blocks) / GAMMA if blocks else math.nan)


def capacity(rates: dict[int, float], target_rate: float) -> float:
    clients = np.array(sorted(rates))
    return capacity_at(clients, 1 / np.array([rates[n] for n in clients]), 1 / target_rate)


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
        results.update(capacity_ratio_batched=math.nan, capacity_ratio_serial=math.nan, predicted=math.nan)
    results["threads"], results["load_avg_1m"], results["cpus"] = args.threads, os.getloadavg()[0], os.cpu_count()
    first = ("batch8_speedup", "batched_equal", "capacity_ratio_batched", "capacity_ratio_serial", "predicted")
    ordered = {k: results[k] for k in first} | {k: v for k, v in results.items() if k not in first}
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in ordered.items()))


def _parse_args() -> tuple[argparse.Namespace, list[int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default=str(DEFAULT_PAIR))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the services' default: 1)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=64, help="cached tokens per session in the cost curve")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per client in the capacity runs")
    parser.add_argument("--counts", default="1,2,3,4,6,8,12,16,24,32", help="client counts of the capacity runs")
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
    print(f"8 sessions (gamma {list(MIXED_GAMMAS)}, prefixes {[len(p) for p in prompts8]}): one after another "
          f"{1e3 * serial_s:.2f} ms, one batched pass {1e3 * batched_s:.2f} ms")
    results.update(batch8_serial_ms=1e3 * serial_s, batch8_batched_ms=1e3 * batched_s, batch8_speedup=speedup)

    log("3. batched_equal")
    equal, compared, passes = batched_equal(draft, target, prompts8, 40)
    print(f"greedy decoding of the 8 sessions, {compared} tokens in {passes} batched passes: "
          f"{'equal' if equal else 'DIFFERENT'} to one session per pass")
    results["batched_equal"] = int(equal)


def _capacity(backend, draft, target, args, counts: list[int], results: dict) -> None:
    log("4. capacity")
    context = [(i * 31 + 11) % target.vocab_size for i in range(24 + args.tokens // 2)]
    t_d_edge = _step_time_s(draft, context, 1, 3 * args.repeats)        # the emulated edges' draft step
    prompts = make_prompts(backend, max(counts), 24, seed=3)
    tables = draft_tables(draft, target, prompts, args.tokens)
    kw = dict(draft=draft, target=target, prompts=prompts, tables=tables, tokens=args.tokens, t_draft_edge_s=t_d_edge,
              passes={})
    one = [asyncio.run(_run_point("colocated", 1, 1, **kw))[0] for _ in range(3)]
    target_rate = statistics.median(one) / 3
    configs = [("dsd", 1), ("colocated", 1), ("dsd", 64), ("colocated", 64)]
    by_config, per_round = rate_curves(configs, counts, target_rate, **kw)
    _capacity_report(kw, configs, counts, by_config, per_round, target_rate, t_d_edge, results)


def _capacity_report(kw: dict, configs, counts: list[int], by_config: dict, per_round: list, target_rate: float,
                     t_d_edge: float, results: dict) -> None:
    curves = {("serial" if b == 1 else "batched", mode): rates for (mode, b), rates in by_config.items()}
    e = statistics.mean(per_round)
    # The predictions take the passes' times from these runs (the host's speed drifts: a
    # figure measured before them would describe another machine): t_v, the median verify
    # pass of batch 1; t_d, the median co-located draft pass of batch 1 over gamma; the
    # slope, fitted to the verify passes of every batch size.
    fits = {config: pass_fit(kw["passes"][config]) for config in configs}
    model = kw["passes"]["model"]
    for label, b in (("serial", 1), ("batched", 64)):
        ratios = [r for (_, mb, n), r in model.items() if mb == b and n > 1 and math.isfinite(r)]
        if ratios:
            results[f"point_model_ratio_{label}_median"] = statistics.median(ratios)
            results[f"point_model_ratio_{label}_max_dev"] = max(abs(r - 1) for r in ratios)
    t_v = statistics.median(c for config in (("dsd", 1), ("colocated", 1))
                            for k, b, c in kw["passes"][config].values() if k == "verify")
    t_d = fits["colocated", 1][2]
    for (mode, max_batch), (t1, slope, td) in fits.items():
        print(f"passes of {mode} max_batch {max_batch}: t_v(gamma={GAMMA}, b=1) {1e3 * t1:.2f} ms, slope {slope:.3f}"
              + (f", t_d {1e3 * td:.2f} ms" if mode == "colocated" else ""))
    print(f"\ncapacity at {target_rate:.1f} tok/s per client (a third of one co-located client alone); "
          f"t_d {1e3 * t_d:.2f} ms (edge {1e3 * t_d_edge:.2f} ms), t_v(gamma={GAMMA}) {1e3 * t_v:.2f} ms, "
          f"E {e:.2f} tokens/round")
    print("clients " + "".join(f"{n:>8d}" for n in counts))
    for (label, mode), rates in curves.items():
        print(f"{label[:5]} {mode[:3]}" + "".join(f"{rates[n]:8.1f}" if n in rates else f"{'':8s}" for n in counts))
    n = {key: capacity(rates, target_rate) for key, rates in curves.items()}
    predicted = 1 + GAMMA * t_d / t_v
    (tv_dsd, s_dsd, _), (tv_co, s_co, td_co) = fits["dsd", 64], fits["colocated", 64]
    p_dsd = batched_capacity(e, target_rate, GAMMA, td_co, tv_dsd, s_dsd)[0]
    p_co = batched_capacity(e, target_rate, GAMMA, td_co, tv_co, s_co)[1]
    results.update(
        clients_dsd_serial=n["serial", "dsd"], clients_colocated_serial=n["serial", "colocated"],
        clients_dsd_batched=n["batched", "dsd"], clients_colocated_batched=n["batched", "colocated"],
        capacity_ratio_serial=n["serial", "dsd"] / n["serial", "colocated"],
        capacity_ratio_batched=n["batched", "dsd"] / n["batched", "colocated"],
        predicted=predicted, predicted_batched=p_dsd / p_co, predicted_clients_dsd_batched=p_dsd,
        predicted_clients_colocated_batched=p_co, target_rate_tok_s=target_rate, tokens_per_round=e,
        t_draft_ms=1e3 * t_d, t_verify_ms=1e3 * t_v, batch_slope_dsd_runs=s_dsd, batch_slope_colocated_runs=s_co)
    print(f"clients sustained: serial dsd {n['serial', 'dsd']:.2f} co {n['serial', 'colocated']:.2f}; "
          f"batched dsd {n['batched', 'dsd']:.2f} co {n['batched', 'colocated']:.2f} "
          f"(predicted dsd {p_dsd:.2f} co {p_co:.2f})")


if __name__ == "__main__":
    main()
