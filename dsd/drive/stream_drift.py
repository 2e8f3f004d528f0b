"""A link that got faster, read from a server stream's arrivals (dsd/drive/driver.py, hand-overs).

The server sends a stream's tokens one pass apart (its compute per message). On a steady link
they reach the edge as far apart; when the link's delay falls (150 -> 10 ms RTT), the tokens
sent after the fall catch up with those still on the old path and arrive in a burst. Each
arrival's gap less the server's compute is added to a running drift: the change in the back
path's delay since the stream began (plus any wait of the edge's own). A fall shows as the drift
dropping below where it stood before the burst; a stall of the edge (or a retransmission) raises
it first and then brings it back, and so does not.

This matters where no segment's acknowledgement can show the fall: when the stream's whole
budget was asked before it: the stream then ends on the fast link with the estimate still the
slow one's, and the next request starts from it (docs/results/adaptive.md).
"""

from __future__ import annotations

from collections import deque

# A burst is a run of arrivals closer than this fraction of the server's compute per message
BURST_FRACTION = 0.5
# The drift before a burst is the lowest over this many arrivals before it (a slow upward creep of
# per-message overhead does not count as a fall; a stall's rise is not the baseline)
BASELINE_ARRIVALS = 8


class ArrivalDrift:
    """``add(gap_s, compute_s)`` per arrival of one stream after its first; returns how far the
    back path's delay has fallen (s, >= 0) during the current burst (growing along it), 0
    outside a burst."""

    def __init__(self) -> None:
        self.drift_s = 0.0
        self.before: deque[float] = deque([0.0], maxlen=BASELINE_ARRIVALS)  # drifts before the burst
        self.settled = False  # the current burst was read as a fall (``settle``)

    def add(self, gap_s: float, compute_s: float) -> float:
        if not (compute_s > 0 and gap_s >= 0):
            return 0.0
        self.drift_s += gap_s - compute_s
        if gap_s >= BURST_FRACTION * compute_s:
            if self.settled:  # the first arrival at the new link's pace: its new baseline
                self.before.clear()
                self.settled = False
            self.before.append(self.drift_s)
            return 0.0
        return max(0.0, min(self.before) - self.drift_s)

    def settle(self) -> None:
        """The current burst has been read as a fall: the drift after it is the new link's
        baseline (against the old one, every later early arrival would read as a further fall)."""
        self.settled = True


def fallen_rtt_s(rtt_s: float | None, fall_s: float, fell_ratio: float) -> float | None:
    """The link's RTT now, if a back path that fell by ``fall_s`` (both directions alike) puts it at
    ``fell_ratio`` of ``rtt_s`` or less; else None. At least a twentieth of the old RTT: the
    symmetric guess must not read a link as instant."""
    if rtt_s is None or rtt_s <= 0 or fall_s <= 0:
        return None
    now_s = rtt_s - 2 * fall_s
    return max(now_s, 0.05 * rtt_s) if now_s <= fell_ratio * rtt_s else None
