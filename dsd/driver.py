"""The DSD drive loop, written once for every clock: the simulator's virtual time (dsd.simulate)
and the edge service's real one (services/edge.py).

The loop asks the edge state machine (``dsd.edge.EdgeDecoder``) what to draft, drafts it on a
``Device``, hands the blocks to a ``Transport`` and applies each verdict as it arrives; a
controller (``dsd.control``) may change gamma and the edge mode after every verdict; without one,
the mode's own policy (``dsd.modes``: e.g. a fixed gamma) or the configured gamma plans each round. What differs
between the simulator and the service is only behind those two interfaces:

- ``Device.draft(work, n_steps, then)``: run ``work`` (n_steps draft steps), return
  ``(then(), t_start_s)``; ``then`` hands the draft to the decoder while the device time runs.
- ``Transport.prepare(proposals)`` (e.g. encode), ``send(prepared, after)`` -> one send time per
  block (``after``: the arrival whose verdict released them, None for a block just drafted),
  ``poll()`` -> the arrivals already there, ``wait()`` -> the next arrival (an ``Arrival``).

A block with no block in flight cannot be cut short by a verdict, so it is drafted in one device
pass; otherwise the loop looks at the arrivals after every step and abandons a draft whose epoch
has passed (its prefix was refuted).

Hand-over: a transport whose ``hands_over`` is true also has ``generate(mode, gamma, max_tokens,
after)`` -> send time, and lets the controller pick a server mode (cloud AR, co-located SD) for a round. The driver then
stops drafting, waits until no block is in flight, and asks the server to generate the next
``max_tokens`` tokens on the open session (a segment); each of the server's steps comes back as an
arrival whose ``served`` is a ``ServerRound``, its tokens committed as they are (the server owns
the committed prefix while it generates, so nothing is drafted meanwhile and no token is counted
twice). While the controller keeps a server mode the next segment is asked for once what is
still due from the asked ones would run out within a round trip (every segment's first tokens
measure the link's RTT, and so does its acknowledgement, an arrival with ``link_rtt_s`` that the
server sends as the segment arrives, ahead of the segments asked before it), so the server never
idles between them; once it picks a DSD mode again, a transport that ``withdraws`` is asked
(``withdraw(drop, after)``, answered by an arrival with ``withdrawn``) to drop the last segments
asked beyond a round trip of the link as now measured, and drafting resumes after the last
segment kept ends. Under greedy decoding the
edge drafts along the stream (shadow drafting: its guess at every position, charged on the
device) so the controller keeps measuring alpha while the server generates.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from dsd.backends.protocol import LanguageModel, Proposal, SamplingParams, Verdict
from dsd.control import ControllerConfig, Decision, Observation, check_decision, make_controller
from dsd.drafting import begin_request, draft_step
from dsd.edge import DraftRequest, EdgeDecoder
from dsd.modes import SYNC, edge_modes, get_mode, server_modes
from dsd.stopping import StopRule
from dsd.stream_drift import ArrivalDrift, fallen_rtt_s


@dataclass(frozen=True)
class ServerRound:
    """One step of a hand-over segment: the tokens the server generated (AR: proposed 0)."""
    proposed: int
    accepted: int
    tokens: tuple[int, ...]
    done: bool = False               # the request is finished on the server


@dataclass(frozen=True)
class Arrival:
    """A verdict (or, in a hand-over, a server round) as it reached the edge, with the verifier's
    account of its time."""
    verdict: Verdict | None
    t_receive_s: float
    queue_s: float | None = None
    compute_s: float | None = None
    message: Any = None              # the transport's own message (for its trace row)
    served: ServerRound | None = None
    # a hand-over segment's acknowledgement (sent by the server as its Generate arrived): no
    # verdict, no tokens; the link's round trip it measured
    link_rtt_s: float | None = None
    # the answer to a withdraw: how many of the last segments asked the server dropped unstarted
    withdrawn: int | None = None


@dataclass(frozen=True)
class Round:
    """One answered block, as the driver hands it to its ``on_round`` callback."""
    index: int
    arrival: Arrival
    emitted: list[int]
    gamma: int                       # the plan the block was drafted in (a server round: its segment's)
    mode: str
    t_draft_start_s: float | None    # None for a server round
    t_draft_end_s: float | None
    t_send_s: float


class Device(Protocol):
    async def draft(self, work: Callable[[], None], n_steps: int,
                    then: Callable[[], Any]) -> tuple[Any, float]: ...


class Transport(Protocol):
    def prepare(self, proposals: list[Proposal]) -> Any: ...
    async def send(self, prepared: Any, after: Arrival | None) -> list[float]: ...
    async def poll(self) -> list[Arrival]: ...
    async def wait(self) -> Arrival: ...


def step_limit(max_new_tokens: int, gamma_max: int) -> int:
    """A bound on draft steps per request: far above any real run, so hitting it means a bug."""
    return 64 * (max_new_tokens + 1) * (gamma_max + 2)


@dataclass
class Segment:
    """A hand-over segment asked of the server: its plan, the tokens still due, its times."""
    gamma: int
    mode: str
    remaining: int
    t_send_s: float
    rounds: int = 0
    rtt_s: float | None = None       # the link as measured when it was asked
    ahead: bool = False              # asked only for the controller's look-ahead (stream_ahead_s)


# A stream is withdrawn only from a link at most this fraction of the one its segments were asked
# on: a step in the link (150 -> 10 ms), not a plan that moved on the same link
LINK_FELL_RATIO = 0.5


class DsdDriver:
    """One DSD request: ``await run()`` drafts until the stop rule holds; ``handle(arrival)``
    applies a verdict or a server round (also for the stale ones a transport drains after the end).
    ``handover_tokens``: the length of a hand-over segment (see the module's docstring)."""

    def __init__(self, draft: LanguageModel, seq_id: str, prompt: Sequence[int], gamma: int, stop: StopRule,
                 sampling: SamplingParams, device: Device, transport: Transport, clock: Callable[[], float],
                 on_round: Callable[[Round], None], mode: str = SYNC, max_in_flight: int = 1,
                 controller=None, gamma_max: int | None = None, handover_tokens: int = 4) -> None:
        if not (isinstance(handover_tokens, int) and handover_tokens >= 1):
            raise ValueError(f"handover_tokens must be a whole number >= 1, got {handover_tokens!r}")
        self.draft, self.seq_id, self.sampling = draft, seq_id, sampling
        self.device, self.transport, self.clock, self.on_round = device, transport, clock, on_round
        self.gamma_max = max(gamma_max or gamma, gamma)
        self.controller = controller or make_controller(ControllerConfig("static", gamma, mode, self.gamma_max))
        # the modes a round may take: the server's too where the transport can hand over
        self.modes = edge_modes() + (server_modes() if getattr(transport, "hands_over", False) else ())
        self.handover_tokens = handover_tokens
        self.segments: deque[Segment] = deque()
        self.server_plan: Decision | None = None
        self._stream_s = 0.0             # the hand-over's send, then its last server round's arrival
        self._rtt_s: float | None = None     # the link, as last measured (sizes the segments)
        self._step_s: float | None = None    # a server round's steady time per token
        self._withdrawing = False            # a withdraw of unstarted segments awaits its answer
        self._stream_tokens = 0              # tokens asked since the stream (its first segment) began
        self._drift: ArrivalDrift | None = None     # the stream's arrivals after its first
        self._burst_rtt_s: float | None = None      # the link a burst of them is read against
        self._fell_read_s: float | None = None      # when a burst was read as a fall (this request)
        self.stop = stop
        self.draft_steps = 0
        self.rounds = 0
        self.edge = EdgeDecoder(prompt, gamma, stop, max_in_flight=max_in_flight)
        self.mode = self.plan()
        self.generator = torch.Generator().manual_seed(sampling.seed + 1)
        self._drafted: dict[tuple[int, int], tuple[float, float, int, str]] = {}  # block -> times, plan
        self._sent: deque[tuple[float, float, int, str, float]] = deque()        # ... + send time
        begin_request(draft, seq_id, prompt, gamma)

    async def run(self) -> list[int]:
        """Draft, send and apply verdicts until the request is done; returns the output."""
        limit = step_limit(self.stop.max_new_tokens, self.gamma_max)
        while True:
            await self.deliver_ready()
            if self.edge.done:
                break
            if self.server_plan is not None and not self.segments and not self.edge.in_flight \
                    and self.edge.held is None:
                await self.keep_server_busy(None)
            # a withdraw's answer says which segments will still come: nothing is drafted before it
            request = None if self.segments or self._withdrawing else self.edge.next_draft()
            if request is None:
                await self.handle(await self.transport.wait())
                continue
            await self.draft_block(request)
            if self.draft_steps > limit:
                raise RuntimeError(f"more than {limit} draft steps in one request")
        self.draft.release(self.seq_id)
        return self.edge.generated

    async def deliver_ready(self) -> None:
        for arrival in await self.transport.poll():
            await self.handle(arrival)

    async def draft_block(self, request: DraftRequest) -> None:
        tokens, probs = list(request.prefix), []
        plan = (request.n_tokens, self.mode)

        def step() -> None:
            token, q = draft_step(self.draft, self.seq_id, tokens, self.sampling, self.generator)
            tokens.append(token)
            probs.append(q)

        def finish():
            drafted = tokens[len(request.prefix):]
            q_stack = None if self.sampling.greedy or not probs else torch.stack(probs)
            to_send = self.edge.add_draft(request, drafted, q_stack)
            return to_send, self.transport.prepare(to_send)

        if not self.edge.in_flight:     # no verdict can arrive that cuts this block short
            (to_send, prepared), t_start_s = await self.device.draft(
                lambda: [step() for _ in range(request.n_tokens)], request.n_tokens, finish)
            self.draft_steps += request.n_tokens
        else:                           # a verdict may refute the prefix mid-block: look after every step
            for i in range(request.n_tokens):
                _, step_start_s = await self.device.draft(step, 1, lambda: None)
                t_start_s = step_start_s if i == 0 else t_start_s
                self.draft_steps += 1
                await self.deliver_ready()
                if self.edge.epoch != request.epoch:
                    break
            to_send, prepared = finish()
        block = to_send[0] if to_send else self.edge.held      # the block just drafted, if any
        if block is not None and not request.with_guess:
            self._drafted[(block.start_pos, block.base_digest)] = (t_start_s, self.clock(), *plan)
        await self.send(to_send, prepared)

    async def send(self, proposals: list[Proposal], prepared, after: Arrival | None = None) -> None:
        for proposal, t_send_s in zip(proposals, await self.transport.send(prepared, after)):
            self._sent.append(self._drafted.pop((proposal.start_pos, proposal.base_digest)) + (t_send_s,))

    async def handle(self, arrival: Arrival) -> None:
        """Apply one verdict: emit, report the round, let the controller re-plan, send what is due."""
        if arrival.served is not None:
            await self.handle_served(arrival)
            return
        if arrival.link_rtt_s is not None:
            await self.handle_acknowledged(arrival)
            return
        if arrival.withdrawn is not None:
            await self.handle_withdrawn(arrival)
            return
        emitted, to_send = self.edge.on_verdict(arrival.verdict)
        t_draft_start_s, t_draft_end_s, gamma, mode, t_send_s = self._sent.popleft()
        self.on_round(Round(self.rounds, arrival, emitted, gamma, mode, t_draft_start_s, t_draft_end_s, t_send_s))
        self.rounds += 1
        seen = observation(arrival, gamma, mode, t_draft_start_s, t_draft_end_s, t_send_s, self.remaining_tokens)
        self._rtt_s = self._rtt_s if arrival.verdict.stale else seen.rtt_s
        self.controller.observe(seen)
        self.mode = self.plan()
        await self.send(to_send, self.transport.prepare(to_send), arrival)

    async def handle_served(self, arrival: Arrival) -> None:
        """One server round of a hand-over: commit its tokens, shadow-draft them, report the round,
        re-plan, and ask for the next segment while the plan stays on the server."""
        if not self.segments:
            return                       # the end of a stream asked for past the request's end
        served, segment = arrival.served, self.segments[0]
        prefix = list(self.edge.committed.tokens)
        emitted = self.edge.on_tokens(served.tokens)
        segment.remaining -= len(served.tokens)
        interval_s, first = arrival.t_receive_s - self._stream_s, segment.rounds == 0
        self._stream_s, segment.rounds = arrival.t_receive_s, segment.rounds + 1
        fell_to_s = self._link_fell_to_s(interval_s, arrival)
        if segment.remaining <= 0 or served.done or self.edge.done:
            self.segments.popleft()
        shadow = await self.shadow(prefix, emitted)
        self.on_round(Round(self.rounds, arrival, emitted, segment.gamma, segment.mode, None, None,
                            segment.t_send_s))
        self.rounds += 1
        seen = server_observation(arrival, segment, interval_s, first, shadow, self.remaining_tokens)
        if seen.rtt_s is not None and self._asked_before_the_fall(segment.t_send_s):
            seen = replace(seen, rtt_s=None)
        if seen.rtt_s is not None:
            self._rtt_s = seen.rtt_s
        elif not first and served.tokens:
            self._step_s = server_step_s(interval_s, arrival.compute_s, len(served.tokens))
        if self._step_s is None and served.tokens and arrival.compute_s:
            self._step_s = arrival.compute_s / len(served.tokens)    # until a gap between arrivals is seen
        self.controller.observe(seen)
        if fell_to_s is not None:           # a burst: the link got faster (dsd/stream_drift.py)
            self._fell_read_s = arrival.t_receive_s
            self._observe_link(segment, fell_to_s, inferred=True)
        self.mode = self.plan()
        await self.follow_plan(arrival)

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
        if self._burst_rtt_s is None:            # the whole burst is read against the link before it
            self._burst_rtt_s = self._asked_on_rtt_s()
        fell_to_s = fallen_rtt_s(self._burst_rtt_s, fall_s, LINK_FELL_RATIO)
        if fell_to_s is not None:
            self._drift.settle()
        return fell_to_s

    async def handle_acknowledged(self, arrival: Arrival) -> None:
        """A segment's acknowledgement: the link's round trip now. A segment's first tokens come
        after every segment asked before it, so a link that gets faster mid-stream (150 -> 10 ms)
        showed there only ~a round trip of the old link later, while the stream went on being
        asked as far ahead as the old link needs. The controller sees it as a server round
        without tokens (it may take the request back to the edge: nothing more is asked then)."""
        if self.edge.done or not self.segments or \
                self._asked_before_the_fall(arrival.t_receive_s - arrival.link_rtt_s):
            return                       # the end of a request, a stream already served, a stale measure
        self._observe_link(self.segments[-1], arrival.link_rtt_s)
        self.mode = self.plan()
        await self.follow_plan(arrival)

    def _observe_link(self, segment: Segment, rtt_s: float, inferred: bool = False) -> None:
        """The link measured (or, ``inferred``, guessed from a burst) outside a round: the
        driver's link from now on, and a server round without tokens for the controller."""
        self._rtt_s = rtt_s
        self.controller.observe(Observation(segment.gamma, segment.mode, 0, 0, False, rtt_s, None, None, None,
                                            remaining_tokens=self.remaining_tokens, rtt_inferred=inferred))

    async def follow_plan(self, after: Arrival) -> None:
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
        if self.server_plan is not None:
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
        if not getattr(self.transport, "withdraws", False) or self._withdrawing:
            return False
        self._withdrawing = True
        await self.transport.withdraw(drop, after)
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
        if self._rtt_s is None or not step_s:
            return 0
        ahead = getattr(self.controller, "stream_ahead_s", None)
        need_s = max(self._rtt_s, (ahead() if ahead else None) or 0.0) + step_s
        due_s, kept = 0.0, len(self.segments)
        for index, segment in enumerate(self.segments, start=1):
            due_s += segment.remaining * step_s
            if due_s > need_s:
                kept = index
                break
        beyond = list(self.segments)[kept:]
        fell = any(s.rtt_s is not None and self._rtt_s <= LINK_FELL_RATIO * s.rtt_s for s in beyond)
        return len(beyond) if fell else 0

    def _beyond_a_round_trip(self) -> int:
        """How many of the last segments asked are not needed to keep the server busy for a round
        trip of the link as last measured (and a step; ``_asked_enough``'s measure, from the
        first), if the link fell since they were asked; else the last ones asked for the
        controller's look-ahead only (``Segment.ahead``). Before the server's pace is
        measured (no tokens yet: a request that started on the server), only the first segment
        is kept: segments asked on a slow probe after the link fell would hold the hand-back."""
        if self._rtt_s is None:
            return 0
        beyond = list(self.segments)[self._segments_for_a_round_trip():]
        if any(s.rtt_s is not None and self._rtt_s <= LINK_FELL_RATIO * s.rtt_s for s in beyond):
            return len(beyond)
        return len(list(itertools.takewhile(lambda s: s.ahead, reversed(beyond))))

    def _segments_for_a_round_trip(self) -> int:
        """How many of the segments asked, from the first, keep the server busy for a round trip
        of the link as last measured and a step (1 while the server's pace is not measured)."""
        if not self._step_s:
            return 1
        due_s = 0.0
        for kept, segment in enumerate(self.segments, start=1):
            due_s += segment.remaining * self._step_s
            if due_s > self._rtt_s + self._step_s:
                return kept
        return len(self.segments)

    async def handle_withdrawn(self, arrival: Arrival) -> None:
        """The server dropped ``arrival.withdrawn`` of the last segments asked, unstarted."""
        self._withdrawing = False
        if self.edge.done:
            return
        for _ in range(min(arrival.withdrawn, len(self.segments))):
            self.segments.pop()
        if self.server_plan is not None:      # the plan went back to the server meanwhile
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
        if self._withdrawing:
            return                        # its answer counts the last segments asked: ask none meanwhile
        ahead = getattr(self.controller, "stream_ahead_s", None)
        ahead_s = ahead() if ahead else None
        for _ in range(self.remaining_tokens + 1):          # each segment asks for one token or more
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
        rtt_s, step_s = self._rtt_s, self._step_s
        if rtt_s is None:
            rtt_s = self._controller_hint("link_rtt_s")
        return rtt_s, step_s or self._controller_hint("server_step_s")

    def _controller_hint(self, name: str) -> float | None:
        hint = getattr(self.controller, name, None)
        return hint() if hint else None

    async def hand_over(self, after: Arrival | None, ahead: bool = False) -> None:
        """Ask the server for the next segment of the request (``_segment_tokens``), none past the
        token budget; ``ahead``: only for the controller's look-ahead, beyond the link's round trip."""
        due = self.remaining_tokens - sum(s.remaining for s in self.segments)
        if due <= 0 or self.edge.done:
            return
        if not self.segments:
            self._stream_tokens = 0
        plan, n_tokens = self.server_plan, min(self._segment_tokens(), due)
        t_send_s = await self.transport.generate(plan.mode, plan.gamma, n_tokens, after)
        if not self.segments:
            self._stream_s, self._drift = t_send_s, None
        self._stream_tokens += n_tokens
        self.segments.append(Segment(plan.gamma, plan.mode, n_tokens, t_send_s, rtt_s=self._asked_on_rtt_s(),
                                     ahead=ahead))

    def _segment_tokens(self) -> int:
        """``handover_tokens``; one for a stream's first segment while this request has not
        measured the link: the first segment is the one a Withdraw cannot take back, and the link
        the request was sent to the server on may have fallen since (its whole first segment
        would then be served before the hand-back; docs/results/adaptive.md). The next one is the
        rest of ``handover_tokens``, so the segments end on multiples of it: a hand-back at a
        later token waits for no more of them."""
        if self._stream_tokens == 0 and self._rtt_s is None:
            return 1
        return self.handover_tokens - self._stream_tokens % self.handover_tokens

    def _asked_on_rtt_s(self) -> float | None:
        """The link a segment is asked on: as last measured in this request; before any
        measurement, the RTT the controller decided on (``link_rtt_s()``, e.g. the probe that
        sent the request to the server), so a link that has fallen since shows as a fall."""
        return self._rtt_s if self._rtt_s is not None else self._controller_hint("link_rtt_s")

    async def shadow(self, prefix: list[int], tokens: list[int]) -> tuple[int, int]:
        """(positions, matches): the draft's greedy guess at each streamed token given the true
        prefix, one draft step each on the device (greedy only: under sampling a match is not alpha)."""
        if not tokens or not self.sampling.greedy:
            return 0, 0
        guesses = []

        def work() -> None:
            logits = self.draft.logits(self.seq_id, prefix + tokens[:-1], len(tokens))     # [n, vocab]
            guesses.extend(logits.argmax(dim=-1).tolist())

        await self.device.draft(work, len(tokens), lambda: None)
        self.draft_steps += len(tokens)
        return len(tokens), sum(int(g == t) for g, t in zip(guesses, tokens))

    @property
    def remaining_tokens(self) -> int:
        """What the token budget still allows (an end-of-sequence may come sooner)."""
        return self.stop.max_new_tokens - len(self.edge.generated)

    def plan(self) -> str:
        """Ask the controller for the next gamma and mode; returns the mode. A server mode stops
        drafting (the hand-over starts once no block is in flight)."""
        decision = check_decision(self.controller.decide(), self.gamma_max, self.modes)
        on_server = decision.mode in server_modes()
        self.server_plan = decision if on_server else None
        self.edge.set_plan(decision.gamma, not on_server and get_mode(decision.mode).pipelined)
        return decision.mode


def server_step_s(interval_s: float, compute_s: float | None, tokens: int) -> float:
    """A hand-over stream's time per token, from the gap since the previous arrival, at least the
    server's own compute per token. The gap is the server's pace only while the link holds still:
    tokens held back by a slow link arrive in a burst once it gets faster (gaps near 0, as on
    netns when the RTT falls from 150 to 10 ms), and a step that small made ``keep_server_busy``
    ask for the whole rest of the request at once -- committing it to the server just when the
    link had become fast enough to take it back (a 32-token AR stream ran 0.5 s into the 10 ms
    segment)."""
    return max(interval_s / tokens, (compute_s or 0.0) / tokens)


def observation(arrival: Arrival, gamma: int, mode: str, t_draft_start_s: float, t_draft_end_s: float,
                t_send_s: float, remaining_tokens: int | None = None) -> Observation:
    """What a controller learns from one round: the link's share of the round trip is what is left
    after the verifier's queue and compute."""
    v = arrival.verdict
    server_s = (arrival.queue_s or 0.0) + (arrival.compute_s or 0.0)
    return Observation(gamma, mode, v.proposed, v.accepted, v.stale,
                       max(arrival.t_receive_s - t_send_s - server_s, 0.0),
                       (t_draft_end_s - t_draft_start_s) / v.proposed if v.proposed else None,
                       arrival.compute_s, arrival.queue_s, remaining_tokens=remaining_tokens)


def server_observation(arrival: Arrival, segment: Segment, interval_s: float, first: bool,
                       shadow: tuple[int, int], remaining_tokens: int) -> Observation:
    """A server round of a hand-over: its tokens over the time since the stream's previous arrival
    (the hand-over's send, for the first round of a stream: the hand-over's cost included). The
    first round of every segment measures the link: its Generate's send to its first tokens, less
    the server's queueing (which, for a segment asked while another runs, is the wait behind it)
    and compute, as a DSD round does; so a stream sees the link move, once per segment."""
    s = arrival.served
    server_s = (arrival.queue_s or 0.0) + (arrival.compute_s or 0.0)
    return Observation(segment.gamma, segment.mode, s.proposed, s.accepted, False,
                       max(arrival.t_receive_s - segment.t_send_s - server_s, 0.0) if first else None, None,
                       arrival.compute_s,
                       arrival.queue_s, tokens=len(s.tokens), interval_s=interval_s,
                       shadow_positions=shadow[0], shadow_matches=shadow[1], remaining_tokens=remaining_tokens)


def run_to_end(coroutine):
    """Run a coroutine that never suspends (the simulator's: its clock is virtual) to its result."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a virtual-time driver suspended: its device or transport awaited real I/O")
