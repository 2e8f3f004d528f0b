"""Acceptance traces: a real pair's per-round accepted counts, replayed by the synthetic draft.

The synthetic draft is normally right with probability alpha at every position, independently.
A real pair is burstier: easy stretches accept whole blocks, hard ones reject at once. A trace
carries that to any hardware profile and RTT: the live rounds of a ``rounds.csv`` recorded with
real models (here or on someone's GPU), as (proposed, accepted) pairs in recorded order.

Replay is per position. A trace round (proposed g, accepted a) becomes a accepted positions
followed by one more: a rejection when a < g; when a == g the position of the bonus token, which
the draft never proposed, so the trace does not say whether it would have been accepted
(``UNTESTED``: decided i.i.d. at the trace's fitted alpha). Rounds follow one another, so a
run's round that starts at a trace round's first position reads exactly that round.

How the trace's gamma relates to the run's gamma g_run:
- g_run == the trace round's proposed: the round is replayed as recorded. Every run round
  starts right after a rejection or a bonus, i.e. where a trace round starts, and every request
  starts at a trace round, so a run at the trace's gamma replays its rounds one for one (the
  accepted-count histogram is the trace's, up to which stretches the requests land on).
- g_run smaller: a round accepts min(the run of accepts left, g_run) -- the trace truncated to
  the run's gamma; the next round goes on from where it stopped (bursts are kept).
- g_run larger: a round reads on past an untested bonus position into the next trace round:
  an extrapolation that strings recorded rounds together; say so when you report it.

Seeds and wrap-around: each request (sequence) starts at a trace round chosen by hashing the
backend seed with the request's prompt (uniformly over positions, see ``start_index``), so the same prompt replays the same stretch in every
mode and on every launcher (paired comparisons), other seeds or prompts land elsewhere; reading
past the trace's end wraps around to its start.

Launchers send a trace to the services inline (``to_text``: "proposed:accepted,...") so a
container needs no access to the file.
"""

from __future__ import annotations

import bisect
import csv
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dsd.checks import is_int

ACCEPT, REJECT, UNTESTED = 1, 0, 2
MAX_TEXT_CHARS = 100_000  # one argv string must stay well under Linux's 128 KiB limit


@dataclass(frozen=True)
class AcceptanceTrace:
    rounds: tuple[tuple[int, int], ...]  # (proposed, accepted) per live round, recorded order
    source: str = ""

    def __post_init__(self) -> None:
        if not self.rounds:
            raise ValueError(f"acceptance trace {self.source!r}: no live rounds (proposed >= 1, not stale)")
        for index, pair in enumerate(self.rounds):
            ok = len(pair) == 2 and all(is_int(v) for v in pair) and 1 <= pair[0] <= 1024 and 0 <= pair[1] <= pair[0]
            if not ok:
                raise ValueError(
                    f"acceptance trace {self.source!r}: round {index} must be (proposed in "
                    f"1..1024, accepted in 0..proposed), got {pair!r}"
                )

    @property
    def alpha_measured(self) -> float:
        """Maximum-likelihood alpha under i.i.d. acceptance (as orchestrator.analysis.fits.fit_alpha):
        accepted successes, one failure per round that rejected."""
        accepted = sum(a for _, a in self.rounds)
        rejections = sum(a < g for g, a in self.rounds)
        return accepted / (accepted + rejections) if accepted + rejections else 1.0

    @property
    def mean_accepted(self) -> float:
        return sum(a for _, a in self.rounds) / len(self.rounds)

    def histogram(self) -> dict[int, int]:
        """accepted -> number of rounds."""
        counts: dict[int, int] = {}
        for _, a in self.rounds:
            counts[a] = counts.get(a, 0) + 1
        return dict(sorted(counts.items()))

    def summary(self) -> dict[str, Any]:
        """What a sidecar records of the trace."""
        return {
            "source": self.source,
            "rounds": len(self.rounds),
            "alpha_measured": self.alpha_measured,
            "mean_accepted": self.mean_accepted,
            "histogram": self.histogram(),
        }

    @cached_property
    def outcomes(self) -> bytes:
        """Per position: ACCEPT, REJECT or UNTESTED (the bonus position of a full block)."""
        out = bytearray()
        for proposed, accepted in self.rounds:
            out += bytes([ACCEPT]) * accepted
            out.append(REJECT if accepted < proposed else UNTESTED)
        return bytes(out)

    @cached_property
    def round_starts(self) -> tuple[int, ...]:
        starts, at = [], 0
        for _, accepted in self.rounds:
            starts.append(at)
            at += accepted + 1
        return tuple(starts)

    def start_index(self, seed: int, prompt: Sequence[int]) -> int:
        """Where a request with this prompt starts: the first position of the trace round that
        holds a position drawn uniformly. Uniform over positions, not rounds: requests are a
        number of tokens long, so every round is then replayed equally often; starting at a
        uniform round would favour rounds in hard stretches (more rounds per token)."""
        digest = hashlib.blake2b(repr((int(seed), [int(t) for t in prompt])).encode(), digest_size=8).digest()
        position = int.from_bytes(digest, "little") % len(self.outcomes)
        return self.round_starts[bisect.bisect_right(self.round_starts, position) - 1]

    def outcome(self, index: int) -> int:
        return self.outcomes[index % len(self.outcomes)]  # wrap around

    def to_text(self) -> str:
        text = ",".join(f"{g}:{a}" for g, a in self.rounds)
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(
                f"acceptance trace {self.source!r}: {len(self.rounds)} rounds are too many to send "
                f"to the services ({len(text)} characters, at most {MAX_TEXT_CHARS}); "
                "use a shorter trace"
            )
        return text

    @classmethod
    def from_text(cls, text: str, source: str = "inline") -> AcceptanceTrace:
        rounds = []
        for item in text.split(","):
            try:
                proposed, accepted = item.split(":")
                rounds.append((int(proposed), int(accepted)))
            except ValueError:
                raise ValueError(
                    f"acceptance rounds {source!r}: expected 'proposed:accepted' pairs separated "
                    f"by commas, got {item!r}"
                ) from None
        return cls(tuple(rounds), source)


def read_rounds_csv(path: Path | str) -> AcceptanceTrace:
    """The live rounds of a rounds.csv (any of this project's: a sweep's merged one, a point's, an
    edge run's): rows with proposed >= 1 that are not stale and carry no error, each request's
    rounds together and in order."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"acceptance_trace {str(path)!r} does not exist or is not a file")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"proposed", "accepted"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"acceptance_trace {str(path)!r}: not a rounds.csv (no column(s) {sorted(missing)})")
        rows = list(reader)
    live = []
    for order, row in enumerate(rows):
        try:
            proposed, accepted = int(float(row["proposed"])), int(float(row["accepted"]))
        except ValueError:
            raise ValueError(
                f"acceptance_trace {str(path)!r}: row {order + 2} has proposed={row['proposed']!r}, "
                f"accepted={row['accepted']!r}"
            ) from None
        stale = str(row.get("stale", "")).strip().lower() in ("true", "1", "yes")
        if proposed < 1 or stale or str(row.get("error") or "").strip() not in ("", "nan"):
            continue
        live.append((_request_key(row), _int(row.get("round_index")), order, proposed, accepted))
    live.sort(key=lambda r: (r[0], r[1], r[2]))
    return AcceptanceTrace(tuple((g, a) for *_, g, a in live), source=str(path))


def _request_key(row: dict[str, Any]) -> tuple[str | int, ...]:
    """Groups a request's rounds: a sweep's rows carry point/client/run ids beside request_index."""
    return tuple(str(row.get(k, "")) for k in ("point", "run_id", "client_id")) + (_int(row.get("request_index")),)


def _int(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


class TraceReplay:
    """The synthetic draft's cursor into a trace: where each sequence started."""

    def __init__(self, trace: AcceptanceTrace, seed: int) -> None:
        self.trace = trace
        self.seed = seed
        self._anchors: dict[str, tuple[int, int]] = {}  # seq_id -> (first drafted position, trace index)

    def alpha_of(self, seq_id: str, tokens: Sequence[int], n_last: int) -> Callable[[int], float]:
        """For a logits call: position -> this position's acceptance probability (1, 0, or the
        trace's alpha for an untested position). A sequence's first call anchors it: its first
        predicted position is the first position of a trace round."""
        if seq_id not in self._anchors:
            first = len(tokens) - n_last + 1
            self._anchors[seq_id] = (first, self.trace.start_index(self.seed, tokens[:first]))
        base, start = self._anchors[seq_id]
        alpha_measured = self.trace.alpha_measured

        def alpha_at(position: int) -> float:
            if position < base:
                return alpha_measured
            outcome = self.trace.outcome(start + position - base)
            return 1.0 if outcome == ACCEPT else 0.0 if outcome == REJECT else alpha_measured

        return alpha_at

    def fork(self, seq_id: str, new_seq_id: str) -> None:
        """new_seq_id replays the trace where seq_id does (a branch of its speculation cache)."""
        if seq_id in self._anchors:
            self._anchors[new_seq_id] = self._anchors[seq_id]

    def release(self, seq_id: str) -> None:
        self._anchors.pop(seq_id, None)
