"""The per-segment oracle's estimators (benchmarks/adaptive.py, benchmarks/adaptive_netns.py).

``constant_oracle`` (the judged one on netns): every static arm measured with the
link held at each condition's RTT on the run's own prompts of each class, every arm on the same
prompts (``pilot_survivors``: after a pilot of 2 prompts per class only the arms within 1.25x of
the pilot's best there go on); per condition the best arm chosen on every other prompt and
scored on the others (and vice versa, averaged), the in-sample best beside it.

The estimators below it, from the static runs under the schedule (``--oracle schedule``, printed
beside): each static arm's per-token time in each (RTT, alpha)
condition, from every piece of every request, the best arm chosen on one half of the requests
and scored on the other. Their weakness: each arm runs different prompts in each condition than
the policies (their timing differs), so a seed's unlucky prompts move the oracle.

Why not the minimum over each arm's requests that fell wholly inside one segment: that is a minimum over noisy estimates of few requests (the winner's curse), so biased
low, which inflates every policy's ``vs_oracle`` and moves it from seed to seed.

- ``condition_rates``: an arm's requests of one alpha class span one or more RTT pieces; a request
  that spent t_i seconds in condition i emitted its n tokens at the conditions' rates, so its
  tokens are shared out in proportion to t_i * rate_i (rates from the previous pass, equal at
  first; a few passes settle) and a condition's rate is its tokens over its seconds. A request
  wholly inside one condition counts in full; a straddling one counts in each of its conditions.
- ``split_oracle``: per condition, the requests that touched it split alternately in two halves
  (by their order, so each half spans the whole run); the arm best on one half is scored on the other, and
  the two scores averaged. The choice does not see the noise it is scored on, so the oracle is not
  biased low; it is biased high only by as much as noise makes the choice miss the best arm
  (small when the arms are close, which is when a miss is likely). An arm competes in a condition
  of a half only with at least a median request's worth of seconds there (a sliver of a straddling
  request alone says little).
"""

from __future__ import annotations

import math
import statistics

PASSES = 20


def condition_rates(runs, scenario) -> dict[tuple[float, float], tuple[float, float]]:
    """(rtt_ms, alpha) -> (tokens, seconds) of one arm's ``runs`` (RequestRun: start_s, wall_s,
    tokens, alpha), every piece of every request, tokens shared by time times rate."""
    pieces = [
        (r.tokens, [((rtt, r.alpha), s) for rtt, s in scenario.pieces(r.start_s, r.start_s + r.wall_s)]) for r in runs
    ]
    seconds: dict = {}
    for _, parts in pieces:
        for key, s in parts:
            seconds[key] = seconds.get(key, 0.0) + s
    rate = {key: 1.0 for key in seconds}
    tokens: dict = {}
    for _ in range(PASSES):
        tokens = {key: 0.0 for key in seconds}
        for n, parts in pieces:
            weight = sum(s * rate[key] for key, s in parts)
            for key, s in parts:
                tokens[key] += n * s * rate[key] / weight if weight > 0 else n * s / sum(x for _, x in parts)
        rate = {key: tokens[key] / seconds[key] if seconds[key] > 0 else 0.0 for key in seconds}
    return {key: (tokens[key], seconds[key]) for key in seconds}


def _keys(r, scenario) -> set:
    return {(rtt, r.alpha) for rtt, _ in scenario.pieces(r.start_s, r.start_s + r.wall_s)}


def _per_token(runs, scenario, half: int | None = None) -> dict:
    """Condition -> seconds per token, only where the arm spent at least its median request's
    wall time there; with ``half`` (0 or 1), per condition from every other one of the requests
    that touched it (by their order), starting with the first or the second."""
    if not runs:
        return {}
    least_s = statistics.median(r.wall_s for r in runs)
    if half is None:
        rates = condition_rates(runs, scenario)
    else:
        rates = {}
        for key in set().union(*(_keys(r, scenario) for r in runs)):
            mine = [r for r in runs if key in _keys(r, scenario)][half::2]
            if mine:
                rates[key] = condition_rates(mine, scenario)[key]
    return {key: s / n for key, (n, s) in rates.items() if n > 0 and s >= least_s}


def in_sample_oracle(statics: dict, scenario) -> dict:
    """The best arm's per-token time per condition over all requests (chosen and scored on the
    same data: biased low; printed beside ``split_oracle`` for comparison)."""
    best: dict = {}
    for runs in statics.values():
        for key, value in _per_token(runs, scenario).items():
            best[key] = min(best.get(key, math.inf), value)
    return best


def split_oracle(statics: dict, scenario) -> dict:
    """Condition -> the oracle's seconds per token: per half of the requests (of those that touched
    the condition, every other one),
    the arm best there scored on the other half; the two scores averaged. A condition no arm
    can be cross-scored in falls back to ``in_sample_oracle``'s value."""
    halves = [{arm: _per_token(runs, scenario, h) for arm, runs in statics.items()} for h in (0, 1)]
    fallback = in_sample_oracle(statics, scenario)
    best: dict = {}
    for key in fallback:
        scores = []
        for h in (0, 1):
            chosen = [(est[key], arm) for arm, est in halves[h].items() if key in est and key in halves[1 - h][arm]]
            if chosen:
                scores.append(halves[1 - h][min(chosen)[1]][key])
        best[key] = statistics.mean(scores) if scores else fallback[key]
    return best


def print_oracle(label: str, best: dict, *others: dict) -> None:
    """One line: each condition's oracle ms/token, then each of ``others``' in parentheses."""
    print(
        f"  {label} oracle ms/token: "
        + " ".join(
            f"{k}={v * 1e3:.2f}" + "".join(f" ({o[k] * 1e3:.2f})" for o in others if k in o)
            for k, v in sorted(best.items())
        ),
        flush=True,
    )


# ---- the constant-condition oracle (netns): each arm measured at each condition held still ------

PILOT_PROMPTS = 2  # per class: every arm runs these first, at each RTT
ELIMINATE_FACTOR = 1.25  # an arm slower than this times the pilot's best is not measured further


def per_token_s(rows) -> float:
    """Pooled seconds per token of ``rows`` ((prompt index, seconds, tokens), ...)."""
    tokens = sum(n for _, _, n in rows)
    return sum(s for _, s, _ in rows) / tokens if tokens else math.inf


def pilot_survivors(pilot: dict, factor: float = ELIMINATE_FACTOR) -> dict:
    """Condition -> the arms worth measuring on the rest of its prompts: those whose pilot per-token
    time (every arm on the same prompts at the same constant condition, so the prompts' acceptance
    luck is common to all: the synthetic draft matches by position) is within ``factor`` of the
    pilot's best. ``pilot``: arm -> condition -> rows."""
    times: dict = {}
    for arm, conditions in pilot.items():
        for key, rows in conditions.items():
            times.setdefault(key, {})[arm] = per_token_s(rows)
    return {
        key: sorted(arm for arm, t in arms.items() if t <= factor * min(arms.values())) for key, arms in times.items()
    }


def _full_arms(measured: dict) -> dict:
    """Condition -> the arms measured on every prompt it was measured on -> prompt -> (prompt,
    seconds, tokens) (the pilot's eliminated arms ran a few and do not compete)."""
    by_key: dict = {}
    for arm, conditions in measured.items():
        for key, rows in conditions.items():
            by_key.setdefault(key, {})[arm] = {p: (p, s, n) for p, s, n in rows}
    out = {}
    for key, arms in by_key.items():
        prompts = set().union(*(set(rows) for rows in arms.values()))
        out[key] = {arm: rows for arm, rows in arms.items() if set(rows) == prompts}
    return out


def _chosen_elsewhere(full: dict) -> list[tuple[list, str]]:
    """The prompts in index order split alternately in two halves: each half with the arm best on
    the other half (the choice does not see the timing noise it is scored on); one half only
    (a single prompt): it with the arm best on it."""
    order = sorted(next(iter(full.values())))
    halves = [order[0::2], order[1::2]]

    def best_on(prompts: list) -> str:
        return min(full, key=lambda arm: per_token_s([full[arm][p] for p in prompts]))

    if not halves[1]:
        return [(halves[0], best_on(halves[0]))]
    return [(halves[h], best_on(halves[1 - h])) for h in (0, 1)]


def constant_oracle(measured: dict) -> tuple[dict, dict]:
    """(split, in_sample): condition -> the oracle's seconds per token from arms run at that
    constant condition (``measured``: arm -> condition -> rows (prompt index, seconds, tokens)).
    Only the arms measured on every prompt the condition was measured on compete, all of them on
    the same prompts. ``split``: each half of the prompts scored with the arm best on the other
    half (``_chosen_elsewhere``), the two averaged; ``in_sample``: the best arm over all the
    prompts (chosen and scored on the same data)."""
    split, in_sample = {}, {}
    for key, full in _full_arms(measured).items():
        in_sample[key] = min(per_token_s(rows.values()) for rows in full.values())
        split[key] = statistics.mean(per_token_s([full[arm][p] for p in half]) for half, arm in _chosen_elsewhere(full))
    return split, in_sample


def levels_err_pct(statics: dict, measured: dict, scenario) -> dict[str, float]:
    """How well the oracle's levels stand for the link the runs saw: static arm -> the tokens its own
    per-token times at the levels held still (``measured``: arm -> condition -> rows) give for its
    run's pieces under the link (``statics``: arm -> [RequestRun]), over the tokens it emitted there,
    less 1, in % (``vs_oracle_pct`` with the arm as its own oracle). 0: the levels are the link for
    that arm; above 0: they are faster than the link was (a policy is charged that much of the
    link's variation against the oracle too). Only the requests whose every condition the arm was
    measured in on every prompt (on netns, where the pilot kept it); an arm with none is left out."""
    from benchmarks.adaptive_scenario import vs_oracle_pct

    full = _full_arms(measured)
    out = {}
    for arm, runs in statics.items():
        own = {key: per_token_s(arms[arm].values()) for key, arms in full.items() if arm in arms}
        mine = [
            r
            for r in runs
            if {(rtt, r.alpha) for rtt, _ in scenario.pieces(r.start_s, r.start_s + r.wall_s)} <= set(own)
        ]
        if mine:
            out[arm] = vs_oracle_pct(mine, own, scenario)
    return out


def prompt_matched_oracle(measured: dict) -> dict:
    """Condition -> prompt -> the oracle's seconds per token on that very prompt: the arm chosen on
    the other half of the prompts (as ``constant_oracle``'s split), timed on this one at the
    condition held still. A policy's request on prompt i is then set beside the oracle on prompt
    i: the prompt's acceptance luck (the synthetic draft matches by position) is common to both,
    where the class-average oracle charges a policy whose unlucky prompts fell in a costly
    condition (seed 3's request 14, a 0.9-class prompt at 10 ms: static pipelined 8 took 0.46 s
    on it, the class's oracle 0.25 s) and credits one whose lucky prompts did."""
    out: dict = {}
    for key, full in _full_arms(measured).items():
        for half, arm in _chosen_elsewhere(full):
            for p in half:
                _, seconds, tokens = full[arm][p]
                out.setdefault(key, {})[p] = seconds / tokens if tokens else math.inf
    return out


def after_warmup(results: dict, measured: dict, warmup: int, split: bool) -> tuple[dict, dict]:
    """The run scored from request ``warmup`` on, the same cut for everyone: every policy's and
    static arm's first ``warmup`` requests left out (``results``: name -> [RequestRun], request i
    on prompt i), and the oracle re-measured without those prompts (``measured``: arm -> condition
    -> rows, ``constant_oracle``'s split if ``split``, else its in-sample best). A policy's cold
    start (its estimates forming on its first request) then weighs as it would in a long session
    rather than as one twelfth of a short run. Returns (results, oracle)."""
    kept = {
        arm: {key: mine for key, rows in conditions.items() if (mine := [row for row in rows if row[0] >= warmup])}
        for arm, conditions in measured.items()
    }
    split_s, in_sample_s = constant_oracle(kept)
    return {name: runs[warmup:] for name, runs in results.items()}, (split_s if split else in_sample_s)
