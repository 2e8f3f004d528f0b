"""What reaches the edge's DSD loop (dsd/drive/driver.py) from a transport, and what the loop reports:
an ``Arrival``, a tagged union of a verdict (``VerdictArrival``), a server round of a hand-over
(``ServedArrival``, carrying a ``ServerRound``), a segment's acknowledgement
(``AcknowledgedArrival``) or a withdraw's answer (``WithdrawnArrival``); and each answered
``Round``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsd.backends.protocol import Verdict
from dsd.features import FeatureBlock


@dataclass(frozen=True)
class ServerRound:
    """One step of a hand-over segment: the tokens the server generated (AR: proposed 0)."""

    proposed: int
    accepted: int
    tokens: tuple[int, ...]
    done: bool = False  # the request is finished on the server
    features: FeatureBlock | None = None  # the target's, at the positions this round decided


# What reaches the edge, one of four kinds (``Arrival``), each with its receive time, the
# verifier's account of its time where it has one, and the transport's own message (for its trace
# row).


@dataclass(frozen=True)
class VerdictArrival:
    """The verifier's verdict on a drafted block."""

    verdict: Verdict
    t_receive_s: float
    queue_s: float | None = None
    compute_s: float | None = None
    message: Any = None


@dataclass(frozen=True)
class ServedArrival:
    """One server round of a hand-over segment: the tokens the server generated."""

    served: ServerRound
    t_receive_s: float
    queue_s: float | None = None
    compute_s: float | None = None
    message: Any = None


@dataclass(frozen=True)
class AcknowledgedArrival:
    """A hand-over segment's acknowledgement (sent by the server as its Generate arrived): no
    verdict, no tokens; the link's round trip it measured."""

    link_rtt_s: float
    t_receive_s: float
    queue_s: float | None = None
    compute_s: float | None = None
    message: Any = None


@dataclass(frozen=True)
class WithdrawnArrival:
    """The answer to a withdraw: how many of the last segments asked the server dropped unstarted."""

    withdrawn: int
    t_receive_s: float
    queue_s: float | None = None
    compute_s: float | None = None
    message: Any = None


Arrival = VerdictArrival | ServedArrival | AcknowledgedArrival | WithdrawnArrival


def features_of(arrival: Arrival) -> FeatureBlock | None:
    """The target's features an arrival carries: a verdict's, or a server round's."""
    if isinstance(arrival, VerdictArrival):
        return arrival.verdict.features
    if isinstance(arrival, ServedArrival):
        return arrival.served.features
    return None


@dataclass(frozen=True)
class Round:
    """One answered block, as the driver hands it to its ``on_round`` callback."""

    index: int
    arrival: VerdictArrival | ServedArrival  # the rounds: verdicts, and server rounds of a hand-over
    emitted: list[int]
    gamma: int  # the plan the block was drafted in (a server round: its segment's)
    mode: str
    t_draft_start_s: float | None  # None for a server round
    t_draft_end_s: float | None
    t_send_s: float
    cache: Any = None  # the cached mode: what the verdict met (dsd.cache.filler.CacheRecord)
