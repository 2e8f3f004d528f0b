"""The per-segment oracle's segments of a measured RTT trace: windows of fixed length, each at its
median RTT, grouped into a few levels.

The per-segment oracle (benchmarks/adaptive.py) times every static (mode, gamma) with the link
held at each RTT level of the link, so a link needs few levels. A step schedule has them; a
measured trace (data/cicv5g/: one echo every ~55 ms) changes its RTT at every row, and a packet
the link held shows as a run of echoes whose RTT falls by the echo interval (they were released
together). The rule that turns such a trace into the oracle's segments:

1. **Windows.** The trace is cut into windows of ``window_s`` from its start; a window's RTT is the
   time-weighted median of the trace over it (the RTT in force for at least half its time is at
   most that). A hold shorter than half a window does not move it: no link held at one RTT shows
   a hold, and the policies and the static arms under the trace wait it out alike, so what it
   costs them stays in what each is charged against the oracle.
2. **Levels.** The windows whose RTT falls in one bin of a geometric grid (bin k holds
   ``factor**k <= rtt_ms < factor**(k+1)``) form one level, whose RTT is the mean of theirs (every
   window is ``window_s`` long, the last one too: the trace's last row holds on). A static arm's
   per-token time is close to linear in the RTT, so the mean keeps its total time over the
   level's windows.
3. **Segments.** Consecutive windows of one level are one segment of the oracle; the last one holds
   on past the trace's end, as the link does.

How well the levels stand for the trace is measured, not assumed: benchmarks/adaptive.py sets
every static arm's time under the trace beside what its own times at the levels give for the same
requests (``levels_err_pct``).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

Trace = tuple[tuple[float, float], ...]  # (t_s, rtt_ms) from t_s 0, the link schedule's trace rows


@dataclass(frozen=True)
class LevelRule:
    window_s: float = 1.0  # the windows' length
    factor: float = 1.25  # the levels' bins: rtt_ms in [factor**k, factor**(k+1))

    def __post_init__(self) -> None:
        if not (isinstance(self.window_s, (int, float)) and math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s must be a number of seconds > 0, got {self.window_s!r}")
        if not (isinstance(self.factor, (int, float)) and math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(f"factor must be a number > 1, got {self.factor!r}")


def time_weighted_median(pieces: list[tuple[float, float]]) -> float:
    """The value in force for at least half the time and beyond which the rest lies: ``pieces`` are
    (value, seconds)."""
    total_s = sum(s for _, s in pieces)
    if not pieces or total_s <= 0:
        raise ValueError(f"a median needs pieces with time in them, got {pieces!r}")
    covered_s = 0.0
    for value, seconds in sorted(pieces):
        covered_s += seconds
        if covered_s >= total_s / 2 - 1e-12:
            return value
    return sorted(pieces)[-1][0]


def trace_pieces(trace: Trace, start_s: float, end_s: float) -> list[tuple[float, float]]:
    """(rtt_ms, seconds) of [start_s, end_s) under each row of ``trace`` in force there."""
    times = [t for t, _ in trace]
    out, t_s = [], start_s
    while t_s < end_s - 1e-12:
        i = max(bisect.bisect_right(times, t_s) - 1, 0)
        until_s = min(times[i + 1] if i + 1 < len(times) else math.inf, end_s)
        out.append((trace[i][1], until_s - t_s))
        t_s = until_s
    return out


def window_rtts_ms(trace: Trace, window_s: float) -> list[tuple[float, float]]:
    """(start_s, median rtt_ms) of each window of ``window_s`` from 0 through the trace's last row."""
    count = math.floor(trace[-1][0] / window_s + 1e-9) + 1
    return [
        (round(k * window_s, 9), time_weighted_median(trace_pieces(trace, k * window_s, (k + 1) * window_s)))
        for k in range(count)
    ]


def level_bin(rtt_ms: float, factor: float) -> int:
    return math.floor(math.log(max(rtt_ms, 1e-3)) / math.log(factor) + 1e-9)


def level_segments(trace: Trace, rule: LevelRule = LevelRule()) -> Trace:
    """The oracle's segments of ``trace``: (t_s, level rtt_ms) at each change of level (module doc)."""
    windows = window_rtts_ms(trace, rule.window_s)
    members: dict[int, list[float]] = {}
    for _, rtt_ms in windows:
        members.setdefault(level_bin(rtt_ms, rule.factor), []).append(rtt_ms)
    level = {k: round(sum(rtts) / len(rtts), 1) for k, rtts in members.items()}
    out: list[tuple[float, float]] = []
    for start_s, rtt_ms in windows:
        mine = level[level_bin(rtt_ms, rule.factor)]
        if not out or out[-1][1] != mine:
            out.append((start_s, mine))
    return tuple(out)
