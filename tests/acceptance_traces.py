"""Acceptance traces for the tests: a bimodal trace, histograms of accepted counts and their
distance, a rounds.csv written by hand."""

import csv
import random

from dsd.backends.acceptance_trace import AcceptanceTrace


def bimodal_trace(n_rounds=400, gamma=4, seed=1) -> AcceptanceTrace:
    """Far from geometric: a round rejects at once or accepts everything, in bursts."""
    rng = random.Random(seed)
    rounds, easy = [], True
    for _ in range(n_rounds):
        if rng.random() < 0.15:
            easy = not easy
        rounds.append((gamma, gamma if easy and rng.random() < 0.9 else rng.choice((0, 0, 1))))
    return AcceptanceTrace(tuple(rounds), "test")


def histogram(accepted):
    counts = {}
    for a in accepted:
        counts[a] = counts.get(a, 0) + 1
    return {a: c / len(accepted) for a, c in counts.items()}


def total_variation(p, q):
    return 0.5 * sum(abs(p.get(k, 0) - q.get(k, 0)) for k in set(p) | set(q))


def write_rounds(
    path, rows, columns=("point", "client_id", "request_index", "round_index", "proposed", "accepted", "stale", "error")
):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(rows)
    return path
