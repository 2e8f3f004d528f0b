"""A "roaming client" RTT trace from measured country pairs (seeded, pure; a CLI writes the CSV).

    python benchmarks/roaming_trace.py --pairs DE-DE DE-US DE-JP --duration-s 300 \\
        --mean-segment-s 6 --min-segment-s 3 --seed 0 --out experiments/traces/roaming-de.csv

The cloud stays put; the client moves between networks (a pair "XX-YY" is one of its
(edge country, cloud country) paths). The RTT is piecewise constant: each segment's level is a
pair's MEAN RTT from data/country_rtt_stat.csv.gz (RIPE Atlas, RIPE NCC; provenance in
data/README.md; the file's ``rtt_avg``), rounded to whole milliseconds. The levels are therefore
as few as the pairs, so every (level, prompt class) condition recurs and the per-segment oracle
can be measured at each one with the link held still (benchmarks/adaptive.py --rtt-trace).
Why the mean and not a draw: one trace level stands for one path, and the data's spread is over
many paths (orchestrator/links/geography.py draws a path; here the level is the pairs' typical path).

Segments: the first is on the first pair (the client's home network); every later one on a pair
drawn uniformly from the OTHER pairs (each boundary is a real change). Lengths: min_segment_s
plus an exponential of mean (mean_segment_s - min_segment_s) -- a memoryless hand-over with a
floor, so no condition lasts less than a few requests -- rounded to 0.1 s; the last segment is
cut at duration_s. ``random.Random(seed)``: the same config gives the same trace.

Output: rows (t_s, rtt_ms, pair), t_s the segment's start (0 first); the CSV holds t_s and rtt_ms
(the link schedule's trace format, netem/schedule.py ``LinkSchedule.from_trace_csv``).
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.links.geography import DATA_PATH, pair_stats  # noqa: E402


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class RoamingConfig:
    pairs: tuple[str, ...] = ("DE-DE", "DE-US", "DE-JP")  # "EDGE-CLOUD", ISO 3166 alpha-2
    duration_s: float = 300.0
    mean_segment_s: float = 6.0
    min_segment_s: float = 3.0
    seed: int = 0
    data_path: str = str(DATA_PATH)

    def __post_init__(self) -> None:
        if not isinstance(self.pairs, tuple) or len(self.pairs) < 2 or len(set(self.pairs)) != len(self.pairs):
            raise ValueError(f"pairs must be at least two distinct country pairs like 'DE-US', got {self.pairs!r}")
        for i, pair in enumerate(self.pairs):
            if not (isinstance(pair, str) and len(pair.split("-")) == 2):
                raise ValueError(
                    f"pairs[{i}] must be 'EDGE-CLOUD' (ISO 3166 alpha-2 codes, e.g. 'DE-US'), got {pair!r}"
                )
        if not (_number(self.duration_s) and 0 < self.duration_s <= 86_400):
            raise ValueError(f"duration_s must be a number of seconds in (0, 86400], got {self.duration_s!r}")
        if not (_number(self.min_segment_s) and self.min_segment_s > 0):
            raise ValueError(f"min_segment_s must be a number of seconds > 0, got {self.min_segment_s!r}")
        if not (_number(self.mean_segment_s) and self.mean_segment_s > self.min_segment_s):
            raise ValueError(
                f"mean_segment_s must be a number of seconds > min_segment_s "
                f"({self.min_segment_s}), got {self.mean_segment_s!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a whole number >= 0, got {self.seed!r}")


def pair_levels_ms(config: RoamingConfig) -> dict[str, float]:
    """Pair -> its mean RTT in the data, rounded to whole ms; ValueError naming pairs[i] for a
    pair the data does not hold."""
    levels = {}
    for i, pair in enumerate(config.pairs):
        edge, cloud = pair.split("-")
        try:
            levels[pair] = float(round(pair_stats(edge, cloud, config.data_path).mean_ms))
        except ValueError as error:
            raise ValueError(f"pairs[{i}] {pair!r}: {error}") from None
    return levels


def roaming_trace(config: RoamingConfig) -> list[tuple[float, float, str]]:
    """(t_s, rtt_ms, pair) per segment, in time order, the first at 0 (module docstring)."""
    levels = pair_levels_ms(config)
    rng = random.Random(config.seed)
    rows, t_s, pair = [], 0.0, config.pairs[0]
    while t_s < config.duration_s - 1e-9:
        rows.append((round(t_s, 1), levels[pair], pair))
        length_s = config.min_segment_s + rng.expovariate(1.0 / (config.mean_segment_s - config.min_segment_s))
        t_s = round(t_s + length_s, 1)
        pair = rng.choice([p for p in config.pairs if p != pair])
    return rows


def write_trace(rows: list[tuple[float, float, str]], path: Path) -> None:
    with Path(path).open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["t_s", "rtt_ms"])
        out.writerows((f"{t_s:g}", f"{rtt_ms:g}") for t_s, rtt_ms, _ in rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = RoamingConfig()
    parser.add_argument("--pairs", nargs="+", default=list(defaults.pairs))
    parser.add_argument("--duration-s", type=float, default=defaults.duration_s)
    parser.add_argument("--mean-segment-s", type=float, default=defaults.mean_segment_s)
    parser.add_argument("--min-segment-s", type=float, default=defaults.min_segment_s)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--out", required=True, help="the trace CSV (t_s, rtt_ms)")
    args = parser.parse_args(argv)
    config = RoamingConfig(tuple(args.pairs), args.duration_s, args.mean_segment_s, args.min_segment_s, args.seed)
    rows = roaming_trace(config)
    write_trace(rows, Path(args.out))
    seconds: dict[str, float] = {}
    for (t_s, _, pair), end_s in zip(rows, [r[0] for r in rows[1:]] + [config.duration_s]):
        seconds[pair] = seconds.get(pair, 0.0) + end_s - t_s
    levels = pair_levels_ms(config)
    print(
        f"{args.out}: {len(rows)} segments over {config.duration_s:g} s; "
        + ", ".join(f"{p} {levels[p]:g} ms {seconds.get(p, 0.0):.1f} s" for p in config.pairs)
    )


if __name__ == "__main__":
    main()
