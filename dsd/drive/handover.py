"""The hand-over stream of one DSD request (dsd/drive/driver.py's module docstring describes it): the
segments asked of the server while the controller keeps a server mode, kept asked a round trip
ahead, the link measured from their acknowledgements and first tokens, a fall of the link read
from a burst of arrivals, and the segments withdrawn when the plan comes back to the edge.

``HandoverStream`` belongs to one ``DsdDriver``, of which it uses only ``StreamDriver``: it
commits the server's tokens through the driver's edge decoder, reports rounds through the driver,
asks segments of its transport, and re-plans with its controller.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, replace
from typing import Protocol

from dsd.drive.arrivals import AcknowledgedArrival, Arrival, Round, ServedArrival, WithdrawnArrival
from dsd.drive.device_transport import HandsOver, Transport, Withdraws
from dsd.controller.interface import Controller, Decision, LinkRttHint, Observation, ServerStepHint, StreamAheadHint
from dsd.drive.edge_decoder import EdgeDecoder
from dsd.drive.stream_drift import ArrivalDrift, fallen_rtt_s


@dataclass
class Segment:
    """A hand-over segment asked of the server: its plan, the tokens still due, its times."""

    gamma: int
    mode: str
    remaining: int
    t_send_s: float
    rounds: int = 0
    rtt_s: float | None = None  # the link as measured when it was asked
    ahead: bool = False  # asked only for the controller's look-ahead (stream_ahead_s)


# A stream is withdrawn only from a link at most this fraction of the one its segments were asked
# on: a step in the link (150 -> 10 ms), not a plan that moved on the same link
LINK_FELL_RATIO = 0.5


def server_step_s(interval_s: float, compute_s: float | None, tokens: int) -> float:
    """A hand-over stream's time per token, from the gap since the previous arrival, at least the
    server's own compute per token. The gap is the server's pace only while the link holds still:
    tokens held back by a slow link arrive in a burst once it gets faster (gaps near 0, as on
    netns when the RTT falls from 150 to 10 ms), and a step that small made ``keep_server_busy``
    ask for the whole rest of the request at once -- committing it to the server just when the
    link had become fast enough to take it back (a 32-token AR stream ran 0.5 s into the 10 ms
    segment)."""
    return max(interval_s / tokens, (compute_s or 0.0) / tokens)


def server_observation(
    arrival: ServedArrival,
    segment: Segment,
    interval_s: float,
    first: bool,
    shadow: tuple[int, int],
    remaining_tokens: int,
) -> Observation:
    """A server round of a hand-over: its tokens over the time since the stream's previous arrival
    (the hand-over's send, for the first round of a stream: the hand-over's cost included). The
    first round of every segment measures the link: its Generate's send to its first tokens, less
    the server's queueing (which, for a segment asked while another runs, is the wait behind it)
    and compute, as a DSD round does; so a stream sees the link move, once per segment."""
    s = arrival.served
    server_s = (arrival.queue_s or 0.0) + (arrival.compute_s or 0.0)
    return Observation(
        segment.gamma,
        segment.mode,
        s.proposed,
        s.accepted,
        False,
        max(arrival.t_receive_s - segment.t_send_s - server_s, 0.0) if first else None,
        None,
        arrival.compute_s,
        arrival.queue_s,
        tokens=len(s.tokens),
        interval_s=interval_s,
        shadow_positions=shadow[0],
        shadow_matches=shadow[1],
        remaining_tokens=remaining_tokens,
    )


class StreamDriver(Protocol):
    """What a hand-over stream uses of its request's driver (dsd.drive.driver.DsdDriver)."""

    edge: EdgeDecoder  # commits the server's tokens; says when the request is done
    controller: Controller  # observes the stream's rounds; its hints size the stream
    transport: Transport  # asks segments of the server (HandsOver), withdraws them (Withdraws)
    server_decision: Decision | None  # the plan while it is on the server, None once back on the edge

    @property
    def remaining_tokens(self) -> int: ...

    async def shadow(self, prefix: list[int], tokens: list[int]) -> tuple[int, int]: ...

    def report(self, round_: Round) -> None: ...

    def decide(self) -> None: ...

    @property
    def rounds(self) -> int: ...


class HandoverStream:
    """The segments asked of the server for one request, and what the stream measured."""

    def __init__(self, driver: StreamDriver, handover_tokens: int) -> None:
        self.driver = driver
        self.handover_tokens = handover_tokens
        self.segments: deque[Segment] = deque()
        self._stream_s = 0.0  # the hand-over's send, then its last server round's arrival
        self.rtt_s: float | None = None  # the link, as last measured (sizes the segments)
        self._step_s: float | None = None  # a server round's steady time per token
        self.withdrawing = False  # a withdraw of unstarted segments awaits its answer
        self._stream_tokens = 0  # tokens asked since the stream (its first segment) began
        self._drift: ArrivalDrift | None = None  # the stream's arrivals after its first
        self._burst_rtt_s: float | None = None  # the link a burst of them is read against
        self._fell_read_s: float | None = None  # when a burst was read as a fall (this request)

    async def handle_served(self, arrival: ServedArrival) -> None:
        """One server round of a hand-over: commit its tokens, shadow-draft them, report the round,
        re-plan, and ask for the next segment while the plan stays on the server."""
        if not self.segments:
            return  # the end of a stream asked for past the request's end
        served, segment = arrival.served, self.segments[0]
        prefix = list(self.driver.edge.committed.tokens)
        emitted = self.driver.edge.on_tokens(served.tokens)
        segment.remaining -= len(served.tokens)
        interval_s, first = arrival.t_receive_s - self._stream_s, segment.rounds == 0
        self._stream_s, segment.rounds = arrival.t_receive_s, segment.rounds + 1
        fell_to_s = self._link_fell_to_s(interval_s, arrival)
        if segment.remaining <= 0 or served.done or self.driver.edge.done:
            self.segments.popleft()
        shadow = await self.driver.shadow(prefix, emitted)
        self.driver.report(
            Round(self.driver.rounds, arrival, emitted, segment.gamma, segment.mode, None, None, segment.t_send_s)
        )
        seen = server_observation(arrival, segment, interval_s, first, shadow, self.driver.remaining_tokens)
        if seen.rtt_s is not None and self._asked_before_the_fall(segment.t_send_s):
            seen = replace(seen, rtt_s=None)
        if seen.rtt_s is not None:
            self.rtt_s = seen.rtt_s
        elif not first and served.tokens:
            self._step_s = server_step_s(interval_s, arrival.compute_s, len(served.tokens))
        if self._step_s is None and served.tokens and arrival.compute_s:
            self._step_s = arrival.compute_s / len(served.tokens)  # until a gap between arrivals is seen
        self.driver.controller.observe(seen)
        if fell_to_s is not None:  # a burst: the link got faster (dsd/drive/stream_drift.py)
            self._fell_read_s = arrival.t_receive_s
            self._observe_link(segment, fell_to_s, inferred=True)
        self.driver.decide()
        await self.follow_decision(arrival)

    def _asked_before_the_fall(self, t_send_s: float) -> bool:
        """Whether a segment sent at ``t_send_s`` was asked before a burst read as a fall arrived:
        its round trip straddles the fall (out on the old link, back on the new: 80 ms across a
        150 -> 10 ms fall on netns), no measure of either link: taken as one, it pulls the
        estimate back up after the fall (docs/results/adaptive.md)."""
        return self._fell_read_s is not None and t_send_s < self._fell_read_s

    def _link_fell_to_s(self, gap_s: float, arrival: Arrival) -> float | None:
        """The link's RTT now if this arrival ends a burst that shows it fell (to ``LINK_FELL_RATIO``
        of the link last measured or decided on before the burst, or less; each arrival of the
        burst reads it lower); else None. The stream's first arrival starts the count (its gap is
        from the hand-over's send)."""
        if self._drift is None:
            self._drift = ArrivalDrift()
            return None
        fall_s = self._drift.add(gap_s, arrival.compute_s or 0.0)
        if fall_s <= 0:
            self._burst_rtt_s = None
            return None
        if self._burst_rtt_s is None:  # the whole burst is read against the link before it
            self._burst_rtt_s = self._asked_on_rtt_s()
        fell_to_s = fallen_rtt_s(self._burst_rtt_s, fall_s, LINK_FELL_RATIO)
        if fell_to_s is not None:
            self._drift.settle()
        return fell_to_s

    async def handle_acknowledged(self, arrival: AcknowledgedArrival) -> None:
        """A segment's acknowledgement: the link's round trip now. A segment's first tokens come
        after every segment asked before it, so a link that gets faster mid-stream (150 -> 10 ms)
        showed there only ~a round trip of the old link later, while the stream went on being
        asked as far ahead as the old link needs. The controller sees it as a server round
        without tokens (it may take the request back to the edge: nothing more is asked then)."""
        if (
            self.driver.edge.done
            or not self.segments
            or self._asked_before_the_fall(arrival.t_receive_s - arrival.link_rtt_s)
        ):
            return  # the end of a request, a stream already served, a stale measure
        self._observe_link(self.segments[-1], arrival.link_rtt_s)
        self.driver.decide()
        await self.follow_decision(arrival)

    def _observe_link(self, segment: Segment, rtt_s: float, inferred: bool = False) -> None:
        """The link measured (or, ``inferred``, guessed from a burst) outside a round: the
        driver's link from now on, and a server round without tokens for the controller."""
        self.rtt_s = rtt_s
        self.driver.controller.observe(
            Observation(
                segment.gamma,
                segment.mode,
                0,
                0,
                False,
                rtt_s,
                None,
                None,
                None,
                remaining_tokens=self.driver.remaining_tokens,
                rtt_inferred=inferred,
            )
        )

    async def follow_decision(self, after: Arrival) -> None:
        """After a server round or an acknowledgement re-planned: on the server, keep the stream
        asked ahead; back to the edge after the link fell (to ``LINK_FELL_RATIO`` of the link the
        segments were asked on or less: 150 -> 10 ms), withdraw the segments asked beyond a
        round trip of the link as now measured (where the transport can). The stream then comes
        back after what the new link needs instead of after a round trip of the old one, at the
        server's pace. On the same link only the segments asked for the controller's look-ahead
        (``stream_ahead_s``: a slower link than this one) are withdrawn, so a request asked ahead
        from its start (a step of the link in its first tokens then leaves the server busy)
        comes back to the edge after a round trip of this link when its prompt turns out to
        draft well; the segments of the link's own round trip stay. A plan that stays on the
        server across a fall withdraws what is asked beyond the new link's needs too
        (``_asked_for_a_fallen_link``), and asks again as the stream goes on."""
        if self.driver.server_decision is not None:
            drop = self._asked_for_a_fallen_link()
            if not (drop and await self._withdraw(drop, after)):
                await self.keep_server_busy(after)
            return
        drop = self._beyond_a_round_trip()
        if drop:
            await self._withdraw(drop, after)

    async def _withdraw(self, drop: int, after: Arrival) -> bool:
        """Withdraw the last ``drop`` segments asked, where the transport can and no withdraw
        awaits its answer; whether it was sent."""
        transport = self.driver.transport
        if not (isinstance(transport, Withdraws) and transport.withdraws) or self.withdrawing:
            return False
        self.withdrawing = True
        await transport.withdraw(drop, after)
        return True

    def _asked_for_a_fallen_link(self) -> int:
        """On the server: how many of the last segments asked, if the link fell since they were
        asked (to ``LINK_FELL_RATIO`` of it or less), are beyond what keeps the server busy for
        the longer of the new link's round trip and the controller's look-ahead (and a step, at
        the pace ``_pace`` knows); else 0. While the tokens of segments asked long ahead come,
        no new segment is asked, so nothing measures the link; withdrawn, they are asked again
        as the stream goes on, and each ask's acknowledgement measures the link
        (docs/results/adaptive.md)."""
        step_s = self._pace()[1]
        if self.rtt_s is None or not step_s:
            return 0
        need_s = max(self.rtt_s, self._stream_ahead_s() or 0.0) + step_s
        due_s, kept = 0.0, len(self.segments)
        for index, segment in enumerate(self.segments, start=1):
            due_s += segment.remaining * step_s
            if due_s > need_s:
                kept = index
                break
        beyond = list(self.segments)[kept:]
        fell = any(s.rtt_s is not None and self.rtt_s <= LINK_FELL_RATIO * s.rtt_s for s in beyond)
        return len(beyond) if fell else 0

    def _beyond_a_round_trip(self) -> int:
        """How many of the last segments asked are not needed to keep the server busy for a round
        trip of the link as last measured (and a step; ``_asked_enough``'s measure, from the
        first), if the link fell since they were asked; else the last ones asked for the
        controller's look-ahead only (``Segment.ahead``). Before the server's pace is
        measured (no tokens yet: a request that started on the server), only the first segment
        is kept: segments asked on a slow probe after the link fell would hold the hand-back."""
        if self.rtt_s is None:
            return 0
        beyond = list(self.segments)[self._segments_for_a_round_trip() :]
        if any(s.rtt_s is not None and self.rtt_s <= LINK_FELL_RATIO * s.rtt_s for s in beyond):
            return len(beyond)
        return len(list(itertools.takewhile(lambda s: s.ahead, reversed(beyond))))

    def _segments_for_a_round_trip(self) -> int:
        """How many of the segments asked, from the first, keep the server busy for a round trip
        of the link as last measured and a step (1 while the server's pace is not measured)."""
        if not self._step_s or self.rtt_s is None:
            return 1
        due_s = 0.0
        for kept, segment in enumerate(self.segments, start=1):
            due_s += segment.remaining * self._step_s
            if due_s > self.rtt_s + self._step_s:
                return kept
        return len(self.segments)

    async def handle_withdrawn(self, arrival: WithdrawnArrival) -> None:
        """The server dropped ``arrival.withdrawn`` of the last segments asked, unstarted."""
        self.withdrawing = False
        if self.driver.edge.done:
            return
        for _ in range(min(arrival.withdrawn, len(self.segments))):
            self.segments.pop()
        if self.driver.server_decision is not None:  # the plan went back to the server meanwhile
            await self.keep_server_busy(arrival)

    async def keep_server_busy(self, after: Arrival | None) -> None:
        """Ask for segments while the tokens still due from those asked would run out within a
        round trip (and a step) at the server's measured rate, so the next Generate reaches the
        server before it idles; while the link or the rate is not measured yet (a request that
        starts on the server), keep two segments asked. Segments stay short (``handover_tokens``):
        each one's first tokens measure the link, so a long stream sees the RTT move within a few
        tokens, and a plan back to the edge waits only for what is due. A controller may ask for
        a longer round trip than the last measured (``stream_ahead_s()``, e.g. the model policy,
        the slowest link seen while no edge plan would take the request back): a link that slows
        mid-stream then does not leave the server idle."""
        if self.withdrawing:
            return  # its answer counts the last segments asked: ask none meanwhile
        ahead_s = self._stream_ahead_s()
        for _ in range(self.driver.remaining_tokens + 1):  # each segment asks for one token or more
            if self._asked_enough(ahead_s):
                return
            asked = len(self.segments)
            await self.hand_over(after, ahead=self._asked_enough(None))
            if len(self.segments) == asked:
                return

    def _asked_enough(self, ahead_s: float | None) -> bool:
        """The tokens due from the asked segments last a round trip (the longer of the link's and
        ``ahead_s``) and a step; while neither this request nor the controller knows the link or
        the server's pace (``_pace``), more than one segment's (two segments: counted in tokens,
        as a stream's first segment may be one token, ``_segment_tokens``)."""
        rtt_s, step_s = self._pace()
        due = sum(s.remaining for s in self.segments)
        if rtt_s is not None and step_s:
            return due * step_s > max(rtt_s, ahead_s or 0.0) + step_s
        return due > self.handover_tokens

    def _pace(self) -> tuple[float | None, float | None]:
        """(the link's RTT, the server's step per token) as this request measured them; before it
        has, as the controller knows them from earlier requests (``link_rtt_s()``,
        ``server_step_s()``; None where it has no such method). A stream begun on the server used
        to keep two segments asked until its first token measured the step: 8 tokens, 0.16 s of
        a 20 ms server, less than a 150 ms link's round trip and a step, so the server idled
        ~12 ms in every cloud AR request at 150 ms on netns (~0.1 s a seed)."""
        rtt_s, step_s = self.rtt_s, self._step_s
        if rtt_s is None:
            rtt_s = self._link_rtt_hint_s()
        return rtt_s, step_s or self._server_step_hint_s()

    # The controller's optional hints (dsd.controller.interface): None from a controller that gives none.
    def _stream_ahead_s(self) -> float | None:
        controller = self.driver.controller
        return controller.stream_ahead_s() if isinstance(controller, StreamAheadHint) else None

    def _link_rtt_hint_s(self) -> float | None:
        controller = self.driver.controller
        return controller.link_rtt_s() if isinstance(controller, LinkRttHint) else None

    def _server_step_hint_s(self) -> float | None:
        controller = self.driver.controller
        return controller.server_step_s() if isinstance(controller, ServerStepHint) else None

    async def hand_over(self, after: Arrival | None, ahead: bool = False) -> None:
        """Ask the server for the next segment of the request (``_segment_tokens``), none past the
        token budget; ``ahead``: only for the controller's look-ahead, beyond the link's round trip."""
        due = self.driver.remaining_tokens - sum(s.remaining for s in self.segments)
        if due <= 0 or self.driver.edge.done:
            return
        if not self.segments:
            self._stream_tokens = 0
        plan, transport, n_tokens = self.driver.server_decision, self.driver.transport, min(self._segment_tokens(), due)
        if plan is None or not isinstance(transport, HandsOver):
            raise RuntimeError("a hand-over needs a server decision and a transport that hands over")
        t_send_s = await transport.generate(plan.mode, plan.gamma, n_tokens, after)
        if not self.segments:
            self._stream_s, self._drift = t_send_s, None
        self._stream_tokens += n_tokens
        self.segments.append(
            Segment(plan.gamma, plan.mode, n_tokens, t_send_s, rtt_s=self._asked_on_rtt_s(), ahead=ahead)
        )

    def _segment_tokens(self) -> int:
        """``handover_tokens``; one for a stream's first segment while this request has not
        measured the link: the first segment is the one a Withdraw cannot take back, and the link
        the request was sent to the server on may have fallen since (its whole first segment
        would then be served before the hand-back; docs/results/adaptive.md). The next one is the
        rest of ``handover_tokens``, so the segments end on multiples of it: a hand-back at a
        later token waits for no more of them."""
        if self._stream_tokens == 0 and self.rtt_s is None:
            return 1
        return self.handover_tokens - self._stream_tokens % self.handover_tokens

    def _asked_on_rtt_s(self) -> float | None:
        """The link a segment is asked on: as last measured in this request; before any
        measurement, the RTT the controller decided on (``link_rtt_s()``, e.g. the probe that
        sent the request to the server), so a link that has fallen since shows as a fall."""
        return self.rtt_s if self.rtt_s is not None else self._link_rtt_hint_s()
