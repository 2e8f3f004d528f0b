"""benchmarks/adaptive.py on real packets: one netns testbed (experiments/adaptive-netns.toml:
profile, backend with its alpha classes, the link schedule), every static point of its grid and
every policy run through the edges' control API under the same schedule (orchestrator.launchers.control_api),
the same prompts for all. Times come from the traces: each request's start and wall time on the
edge's epoch clock, the schedule's start from links.csv (change_t_unix_s - change_at_s).

The per-segment oracle is measured with the link held still (``--oracle constant``, the default):
every static arm of the grid at each of the schedule's RTTs, no schedule, on the run's own
prompts -- first 2 of each class (the pilot), then the rest of the class's prompts for the arms
within 1.25x of the pilot's best in that condition (``constant_runs``; the eliminated ones are
slower on the same prompts by more than the arms ever differ by luck of timing) -- and per
condition the best arm chosen on every other prompt and scored on the others, the two averaged
(benchmarks/adaptive_oracle.py ``constant_oracle``). About 4-5 minutes a seed on top of the
schedule's 12 runs. The estimate from the static arms' runs under the schedule (every piece of
every request, split by request; the judged one before) is printed beside it, with the policies
scored against it too: those arms ran other prompts in each condition than the policies, so
it moved with the prompts' luck from seed to seed.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from benchmarks.adaptive_oracle import (
    constant_oracle,
    in_sample_oracle,
    pilot_survivors,
    print_oracle,
    prompt_matched_oracle,
    split_oracle,
)
from dsd.backends.synthetic import parse_alpha_classes

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "experiments" / "adaptive-netns.toml"


def _runs(requests: list[dict], rounds: list[dict], links: list[dict], alpha_of) -> list:
    from benchmarks.adaptive_scenario import RequestRun

    changes = [
        row for row in links if row.get("change_index", 0) and row.get("change_index") == row.get("change_index")
    ]
    if not changes:
        raise ValueError(
            "links.csv has no change of the link schedule within this run: the requests are "
            "placed on the schedule by its changes' times, so the RTT trace must change while "
            "every run lasts (a link held constant is the oracle's --rtt-ms condition, not a "
            "schedule)"
        )
    t0_unix = min(row["change_t_unix_s"] - row["change_at_s"] for row in changes)
    plans: dict[int, list] = {}
    for r in sorted(rounds, key=lambda r: (r["request_index"], r["round_index"])):
        if r.get("stale") in (True, "True", 1):
            continue
        gamma = r.get("round_gamma")
        plans.setdefault(int(r["request_index"]), []).append(
            (int(gamma) if gamma == gamma and gamma is not None else int(r["gamma"]), r.get("round_mode") or r["mode"])
        )
    return [
        RequestRun(
            q["t_start_s"] - t0_unix,
            q["wall_s"],
            int(q["tokens"]),
            alpha_of(int(q["request_index"])),
            plans.get(int(q["request_index"]), []),
        )
        for q in sorted(requests, key=lambda q: q["request_index"])
    ]


def scenario_experiment(scenario, schedule_order: str | None):
    """EXPERIMENT with the schedule's order (None: the file's), checked against the scenario: its
    prompt classes' alphas and its link schedule must be the scenario's."""
    from benchmarks.adaptive_scenario import CLASS_TOKEN
    from orchestrator.spec.experiment import load_experiment

    experiment = load_experiment(EXPERIMENT)
    order = schedule_order or experiment.link.schedule_order
    experiment = dataclasses.replace(experiment, link=dataclasses.replace(experiment.link, schedule_order=order))
    classes = dict(parse_alpha_classes(experiment.backend.alpha_classes))
    if any(classes.get(CLASS_TOKEN + k) != alpha for k, alpha in enumerate(scenario.alphas)):
        raise ValueError(
            f"--alphas {scenario.alphas} must match {EXPERIMENT.name}'s backend.alpha_classes "
            f"{experiment.backend.alpha_classes!r}"
        )
    if scenario.trace:
        return _with_trace(experiment, scenario), classes
    base = experiment.rtt_ms[0]
    for step in experiment.link.schedule.steps:
        rtt = dict(step.changes).get("rtt_ms", base)
        if rtt != scenario.rtt_at_ms(step.at_s) or scenario.rtt_at_ms(0.0) != base:
            raise ValueError(
                f"{EXPERIMENT.name}'s link schedule ({step.at_s} s: {rtt} ms) is not the scenario's "
                f"(--rtt-ms {scenario.rtts_ms} every --segment-s {scenario.segment_s})"
            )
    return experiment, classes


def _with_trace(experiment, scenario):
    """EXPERIMENT with the link following ``scenario.trace`` (--rtt-trace) in place of its
    schedule: the trace's first RTT is the points' link, its later rows the schedule's steps."""
    from netem.schedule import LinkSchedule, LinkStep

    steps = tuple(LinkStep(t_s, (("rtt_ms", rtt),)) for t_s, rtt in scenario.trace[1:])
    link = dataclasses.replace(
        experiment.link, schedule=LinkSchedule(steps, scenario.trace_name), trace_csv=scenario.trace_name
    )
    return dataclasses.replace(experiment, rtt_ms=(scenario.trace[0][1],), link=link)


def run_common(run, point, common: dict, **settings):
    """run(point, testbed, prompts, PointSettings) with the scenario's common keys and these."""
    from orchestrator.launchers.base import PointSettings

    keys = {k: v for k, v in common.items() if k not in ("testbed", "prompts")}
    return run(point, common["testbed"], common["prompts"], PointSettings(**keys, **settings), timeout_s=300.0)


def netns_seed(scenario, args, seed: int):
    from benchmarks.adaptive_scenario import touched_levels_ms
    from orchestrator.running.run import GroupTestbeds
    from orchestrator.spec.plan import plan_points

    experiment, classes = scenario_experiment(scenario, getattr(args, "schedule_order", None))
    prompts = scenario.prompts(seed)

    def alpha_of(index: int) -> float:
        return classes.get(prompts[index][0], experiment.backend.alpha)

    plan = [p for p in plan_points(experiment) if p.mode in scenario.modes]
    work = Path(f"/tmp/dsd-adaptive-netns-{seed}-{int(time.time())}")
    with GroupTestbeds("netns", experiment, work, {}, None) as testbeds:  # no sim times or pairs: netns
        testbed = testbeds.for_point(plan[0])
        prefix = time.strftime("%Y%m%dT%H%M%S") + f"-s{seed}"
        common = dict(
            testbed=testbed,
            prompts=prompts,
            warmup=0,
            max_new_tokens=scenario.tokens,
            max_in_flight=1,
            run_prefix=prefix,
            link_options=experiment.link,
        )
        results = _arms_under_schedule(plan, scenario, common, alpha_of, seed)
        if args.oracle == "constant":
            constant = {
                **common,
                "link_options": dataclasses.replace(
                    experiment.link, schedule_order="path", schedule=type(experiment.link.schedule)()
                ),
            }
            levels = touched_levels_ms(results, scenario)
            measured = constant_runs(plan, scenario, prompts, alpha_of, constant, seed, levels)
            (split_c, in_sample_c), by_prompt = constant_oracle(measured), prompt_matched_oracle(measured)
    statics = {k: v for k, v in results.items() if k.startswith("static")}
    best = split_oracle(statics, scenario)
    missing = [
        (rtt, a) for rtt in touched_levels_ms(results, scenario) for a in scenario.alphas if (rtt, a) not in best
    ]
    if missing and args.oracle == "schedule":
        raise RuntimeError(
            f"no static arm spent a request's worth of time in the conditions {missing}: "
            "lengthen --segment-s or --requests"
        )
    print_oracle(f"seed {seed} under the schedule (split, in-sample)", best, in_sample_oracle(statics, scenario))
    if args.oracle == "constant":
        _print_constant_scores(seed, scenario, results, best, split_c, in_sample_c)
        best = split_c
    if args.oracle == "constant":
        return results, best, by_prompt, measured
    return results, best, None, None


def _arms_under_schedule(plan, scenario, common: dict, alpha_of, seed: int) -> dict:
    """Every static arm of ``plan``, then every policy (starting at sync, gamma 4), each over the
    scenario's schedule: label -> its runs."""
    from benchmarks.adaptive_scenario import POLICIES, policy_config
    from orchestrator.launchers.control_api import run_point_on_edges

    jobs = [(f"static {p.mode} {p.gamma}", p, "static", ()) for p in plan]
    start = dataclasses.replace(plan[0], mode="sync", gamma=4)
    jobs += [(name, start, name, policy_config(name, scenario).modes) for name in POLICIES]
    results: dict = {}
    for label, point, controller, modes in jobs:
        t_s = time.monotonic()
        rounds, requests, links, _ = run_common(
            run_point_on_edges,
            point,
            common,
            controller=controller,
            gamma_max=scenario.gamma_max,
            controller_modes=modes,
        )
        results[label] = _runs(requests, rounds, links, alpha_of)
        print(
            f"  seed {seed} {label}: {sum(r.tokens for r in results[label])} tokens in {time.monotonic() - t_s:.1f} s",
            flush=True,
        )
    return results


def _print_constant_scores(seed: int, scenario, results: dict, best: dict, split_c: dict, in_sample_c: dict) -> None:
    """The constant-condition oracle, the policies scored with it, and with the oracle under the
    schedule (``best``) when that covers the same conditions."""
    from benchmarks.adaptive_scenario import POLICIES, vs_oracle_pct

    print_oracle(f"seed {seed} constant-condition (split, in-sample)", split_c, in_sample_c)
    print(
        f"  seed {seed} scored with the in-sample constant-condition oracle: "
        + " ".join(f"{name}={vs_oracle_pct(results[name], in_sample_c, scenario):.1f}%" for name in POLICIES),
        flush=True,
    )
    if all(k in best for k in split_c):
        print(
            f"  seed {seed} scored with the oracle under the schedule: "
            + " ".join(f"{name}={vs_oracle_pct(results[name], best, scenario):.1f}%" for name in POLICIES),
            flush=True,
        )


def constant_runs(plan, scenario, prompts, alpha_of, common: dict, seed: int, levels_ms: list[float]) -> dict:
    """Every static arm at each RTT of ``levels_ms`` held constant (no schedule), on the run's own
    prompts: first ``PILOT_PROMPTS`` of each class, then the rest of the class's prompts for the
    arms within ``ELIMINATE_FACTOR`` of the pilot's best there (benchmarks/adaptive_oracle.py).
    Returns arm -> (rtt_ms, alpha) -> [(prompt index, wall_s, tokens), ...]."""
    from benchmarks.adaptive_oracle import PILOT_PROMPTS
    from orchestrator.launchers.control_api import run_point_on_edges

    by_alpha: dict = {}
    for i in range(len(prompts)):
        by_alpha.setdefault(alpha_of(i), []).append(i)
    measured: dict = {}

    def run(point, rtt, indices) -> None:
        if not indices:
            return
        t_s = time.monotonic()
        _, requests, _, _ = run_common(
            run_point_on_edges,
            dataclasses.replace(point, rtt_ms=rtt),
            {
                **common,
                "prompts": [prompts[i] for i in indices],
                "run_prefix": common["run_prefix"] + f"-const{round(rtt * 10)}",
            },
        )
        for q in requests:
            i = indices[int(q["request_index"])]
            measured.setdefault(f"static {point.mode} {point.gamma}", {}).setdefault((rtt, alpha_of(i)), []).append(
                (i, float(q["wall_s"]), int(q["tokens"]))
            )
        print(
            f"  seed {seed} constant {int(rtt)} ms static {point.mode} {point.gamma}: {len(indices)} prompts "
            f"in {time.monotonic() - t_s:.1f} s",
            flush=True,
        )

    for rtt in levels_ms:
        for point in plan:
            run(point, rtt, sorted(i for ids in by_alpha.values() for i in ids[:PILOT_PROMPTS]))
    survivors = pilot_survivors(measured)
    for rtt in levels_ms:
        for point in plan:
            arm = f"static {point.mode} {point.gamma}"
            run(
                point,
                rtt,
                sorted(
                    i
                    for alpha, ids in by_alpha.items()
                    if arm in survivors.get((rtt, alpha), ())
                    for i in ids[PILOT_PROMPTS:]
                ),
            )
    return measured
