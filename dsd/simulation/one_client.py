"""Run the real protocol of every mode in process on virtual time.

The edge state machine, the drafter and the verifier session are the production code; only the
clock and the link are simulated: each draft step costs ``t_draft_s``, each verification
``t_verify_s`` (stale blocks cost nothing), each AR step ``t_ar_s``, and each message half the
round trip. The verifier serves one edge, first come first served. DSD runs through
``simulate_dsd``; cloud AR and co-located SD through ``simulate_on_server``, the same exchange
the services have (Open and Generate out, one Tokens message back per step or round), so no
mode's time comes from the closed form. With synthetic models this is the prediction the
measurements are compared with; with real models it checks that every mode emits the target's
tokens whatever the timing.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dsd.backends.protocol import LanguageModel, Proposal, SamplingParams
from dsd.drive.generation import Generation, RoundRecord
from dsd.speculation.drafting import begin_request, draft_block
from dsd.features import hand_features
from dsd.drive.arrivals import (
    AcknowledgedArrival,
    Arrival,
    Round,
    ServedArrival,
    ServerRound,
    VerdictArrival,
    WithdrawnArrival,
)
from dsd.drive.driver import DrivePorts, DriveRequest, DriverConfig, DsdDriver, run_to_end
from dsd.drive.edge_decoder import EdgeDecoder
from dsd.modes import SERVER, get_mode, server_modes
from dsd.cache.filler import CacheMemory
from dsd.controller.interface import Controller
from dsd.speculation.stopping import StopRule
from dsd.drive.verifier_session import VerifierSession


@dataclass(frozen=True)
class LinkCosts:
    """A DSD request's virtual-time costs; with ``t_ar_s`` (and, for co-located SD,
    ``t_draft_server_s``) the verifier can also take the request over mid-way (a hand-over).
    ``rtt_at(t_s)``: the link's RTT for a message sent at virtual time t_s, for links that change
    during the request (default: ``rtt_s``); ``t_verify_of(n_drafted)``: a block's verification
    time, for plans whose gamma changes (default: ``t_verify_s`` for every block); ``t_open_s``
    (the prefill): the session's Open goes out at time 0 and the edge drafts at once, as
    services/edge/ does, so the verifier serves nothing before the Open arrived and was prefilled
    (None: the session is already open at time 0)."""

    t_draft_s: float
    t_verify_s: float
    rtt_s: float
    t_ar_s: float | None = None
    t_draft_server_s: float | None = None
    rtt_at: Callable[[float], float] | None = None
    t_verify_of: Callable[[int], float] | None = None
    t_open_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("t_draft_s", "t_verify_s", "rtt_s", "t_ar_s", "t_draft_server_s", "t_open_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        for name in ("rtt_at", "t_verify_of"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"{name} must be a function, got {getattr(self, name)!r}")

    @property
    def one_way_s(self) -> float:
        """The link's delay per message: half the round trip."""
        return self.rtt_s / 2


@dataclass(frozen=True)
class ServerCosts:
    """Virtual-time costs of the modes the server runs alone: per AR step, per draft step of its
    own draft model, per verification, the prefill, and the link's delay per message."""

    t_ar_s: float
    t_draft_s: float
    t_verify_s: float
    t_prefill_s: float
    one_way_s: float

    def __post_init__(self) -> None:
        for name in ("t_ar_s", "t_draft_s", "t_verify_s", "t_prefill_s", "one_way_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")


@dataclass
class SimulatedRun:
    generation: Generation
    total_s: float  # from the first draft step to the last verdict
    first_token_s: float  # until the first verdict arrives
    draft_steps: int
    edge: EdgeDecoder | None  # None for the modes the server runs alone

    @property
    def per_token_s(self) -> float:
        return self.total_s / max(len(self.generation.tokens), 1)


class VirtualClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


Result = TypeVar("Result")


class VirtualDevice:
    """The edge's draft device on virtual time: every step costs ``t_draft_s``."""

    def __init__(self, clock: VirtualClock, t_draft_s: float) -> None:
        self.clock, self.t_draft_s = clock, t_draft_s

    async def draft(self, work: Callable[[], None], n_steps: float, then: Callable[[], Result]) -> tuple[Result, float]:
        start_s = self.clock.now_s
        work()
        whole = int(n_steps)
        for _ in range(whole):  # step by step: the same sums as a clock that ticks per step
            self.clock.now_s += self.t_draft_s
        if n_steps > whole:  # a batched pass (a speculation cache's) costs a fraction more
            self.clock.now_s += (n_steps - whole) * self.t_draft_s
        return then(), start_s


class VirtualLink:
    """The link and a verifier serving one edge, first come first served, on virtual time: each
    message takes half the round trip (``rtt_at(t)`` for links that change), each fresh block
    ``t_verify_of(n_drafted)``, a stale one nothing. With ``costs.t_ar_s`` it also takes hand-overs
    (``generate``): AR steps of t_ar_s, or co-located rounds (gamma steps of t_draft_server_s on
    ``draft`` under the session's own id, then a verification), back to back, each sent at once,
    each segment acknowledged as it arrives (the verifier's Queued: an arrival with ``link_rtt_s``),
    and ``withdraw`` drops the segments not started when it arrives (an arrival with ``withdrawn``)."""

    def __init__(
        self, clock: VirtualClock, session: VerifierSession, costs: LinkCosts, draft: LanguageModel | None = None
    ) -> None:
        self.clock, self.session, self.costs = clock, session, costs
        self.rtt_at, self.t_verify_of = costs.rtt_at, costs.t_verify_of
        t_open_s = costs.t_open_s
        self.arrivals: list[tuple[float, int, Arrival]] = []  # (time at the edge, send order, arrival)
        self.order = itertools.count()
        # the session's Open, sent at 0 ahead of everything: the verifier prefills it on arrival
        self.verifier_free_at_s = 0.0 if t_open_s is None else self.one_way_s(0.0) + t_open_s
        self.last_out_s = self.last_back_s = 0.0  # one connection: each direction is FIFO
        self.back_log: list[tuple[float, float]] = []  # (sent by the verifier, reaches the edge)
        self.hands_over = costs.t_ar_s is not None
        self.pending: deque[tuple[float, str, int, int]] = deque()  # segments asked, not started
        self.draft, self.server_seq_id = draft, f"{session.seq_id}/server"

    @property
    def withdraws(self) -> bool:
        return self.hands_over

    def one_way_s(self, at_s: float) -> float:
        return self.costs.one_way_s if self.rtt_at is None else self.rtt_at(at_s) / 2

    def to_server_s(self, sent_s: float) -> float:
        """When a message sent at sent_s reaches the verifier: a link whose delay falls does not
        let it overtake the one before (a TCP connection delivers in order)."""
        self.last_out_s = max(sent_s + self.one_way_s(sent_s), self.last_out_s)
        return self.last_out_s

    def to_edge_s(self, sent_s: float) -> float:
        """When the verifier's message sent at sent_s reaches the edge, in order likewise."""
        self.last_back_s = max(sent_s + self.one_way_s(sent_s), self.last_back_s)
        self.back_log.append((sent_s, self.last_back_s))
        return self.last_back_s

    def reply_to_edge_s(self, sent_s: float) -> float:
        """When a reply sent at once (a Queued, a Withdrawn) at sent_s reaches the edge: behind what
        the verifier sent before it, which the simulator may already have scheduled along with
        messages it sends later (a started segment's rounds are laid out when it starts). Those
        later ones are not held back behind it (they would be, on one TCP connection, only where
        the link's delay fell between the two sends)."""
        before = [back_s for s, back_s in self.back_log if s <= sent_s]
        back_s = max([sent_s + self.one_way_s(sent_s)] + before)
        self.back_log.append((sent_s, back_s))
        self.last_back_s = max(self.last_back_s, back_s)
        return back_s

    def prepare(self, proposals: list[Proposal]) -> list[Proposal]:
        return proposals

    async def send(self, proposals: list[Proposal], after: Arrival | None) -> list[float]:
        # A verdict's consequences leave when it arrives, even if the step it interrupted runs on.
        sent_s = self.clock.now_s if after is None else after.t_receive_s
        self._start_segments(math.inf)  # asked before: served before
        for proposal in proposals:
            arrive_s = self.to_server_s(sent_s)
            start_s = max(arrive_s, self.verifier_free_at_s)
            verdict = self.session.verify(proposal)
            compute_s = (
                0.0
                if verdict.stale
                else (self.costs.t_verify_s if self.t_verify_of is None else self.t_verify_of(proposal.gamma))
            )
            self.verifier_free_at_s = start_s + compute_s
            back_s = self.to_edge_s(self.verifier_free_at_s)
            heapq.heappush(
                self.arrivals,
                (back_s, next(self.order), VerdictArrival(verdict, back_s, start_s - arrive_s, compute_s)),
            )
        return [sent_s] * len(proposals)

    async def generate(self, mode: str, gamma: int, max_tokens: int, after: Arrival | None) -> float:
        """A hand-over segment: the server generates up to ``max_tokens`` tokens on the session
        once it has arrived and the segments before it are done (laid out when it starts: a
        withdraw may drop it before)."""
        if not self.hands_over:
            raise RuntimeError("this virtual link was given no t_ar_s: it cannot hand over")
        sent_s = self.clock.now_s if after is None else after.t_receive_s
        arrive_s = self.to_server_s(sent_s)
        self._start_segments(arrive_s)
        self.acknowledge(sent_s, arrive_s)
        self.pending.append((arrive_s, mode, gamma, max_tokens))
        return sent_s

    async def withdraw(self, drop: int, after: Arrival | None) -> float:
        """Of the last ``drop`` segments asked, those not started when the withdraw arrives are
        dropped; the answer (how many) is sent at once."""
        sent_s = self.clock.now_s if after is None else after.t_receive_s
        arrive_s = self.to_server_s(sent_s)
        self._start_segments(arrive_s)
        dropped, back_s = min(drop, len(self.pending)), self.reply_to_edge_s(arrive_s)
        for _ in range(dropped):
            self.pending.pop()
        heapq.heappush(self.arrivals, (back_s, next(self.order), WithdrawnArrival(dropped, back_s)))
        return sent_s

    def acknowledge(self, sent_s: float, arrive_s: float) -> None:
        """The Queued the verifier sends as a segment's Generate (sent at sent_s) arrives."""
        ack_s = self.reply_to_edge_s(arrive_s)
        heapq.heappush(self.arrivals, (ack_s, next(self.order), AcknowledgedArrival(ack_s - sent_s, ack_s)))

    def _next_start_s(self) -> float:
        """When the first asked segment starts (inf if none is asked)."""
        return max(self.pending[0][0], self.verifier_free_at_s) if self.pending else math.inf

    def _server_draft(self) -> LanguageModel:
        if self.draft is None:
            raise ValueError("a co-located round on the server needs the link's draft model")
        return self.draft

    def _start_segments(self, before_s: float) -> None:
        """Lay out every asked segment that starts before ``before_s``, in order."""
        while self.pending and self._next_start_s() < before_s:
            self._run_segment(*self.pending.popleft())

    def _run_segment(self, arrive_s: float, mode: str, gamma: int, max_tokens: int) -> None:
        """One segment's steps, back to back from its start, each round's Tokens sent at once."""
        t_s = max(arrive_s, self.verifier_free_at_s)
        if get_mode(mode).drafts == SERVER:
            begin_request(self._server_draft(), self.server_seq_id, self.session.committed.tokens, gamma)
            hand_features(self.draft, self.server_seq_id, self.session.decided_features(1))
        produced, steps = 0, 0
        while (produced < max_tokens and not self.session.finished) or steps == 0:
            start_s = t_s
            served, step_s = self._server_step(mode, gamma)
            t_s += step_s
            produced, steps = produced + len(served.tokens), steps + 1
            back_s = self.to_edge_s(t_s)
            heapq.heappush(
                self.arrivals,
                (
                    back_s,
                    next(self.order),
                    ServedArrival(served, back_s, start_s - arrive_s if steps == 1 else 0.0, step_s),
                ),
            )
        self.verifier_free_at_s = t_s

    def _server_step(self, mode: str, gamma: int) -> tuple[ServerRound, float]:
        """One AR step or co-located round on the session (nothing once it is finished)."""
        session = self.session
        if session.finished:
            return ServerRound(0, 0, (), True), 0.0
        before = len(session.committed)
        if not get_mode(mode).speculative:
            tokens = session.ar_step()
            if self.costs.t_ar_s is None:
                raise ValueError("an AR step on the server needs costs.t_ar_s")
            return (
                ServerRound(0, 0, tuple(tokens), session.finished, session.decided_features(before)),
                self.costs.t_ar_s,
            )
        drafted, q = draft_block(
            self._server_draft(), self.server_seq_id, session.committed.tokens, gamma, session.sampling, session.draws
        )
        verdict = session.verify(session.proposal_for(drafted, q))
        hand_features(self.draft, self.server_seq_id, verdict.features)
        t_verify_s = self.costs.t_verify_s if self.t_verify_of is None else self.t_verify_of(gamma)
        return (
            ServerRound(
                gamma, verdict.accepted, tuple(session.committed.tokens[before:]), session.finished, verdict.features
            ),
            gamma * (self.costs.t_draft_server_s or 0.0) + t_verify_s,
        )

    async def poll(self) -> list[Arrival]:
        self._start_segments(math.nextafter(self.clock.now_s, math.inf))  # those started by now
        ready = []
        while self.arrivals and self.arrivals[0][0] <= self.clock.now_s:
            ready.append(heapq.heappop(self.arrivals)[2])
        return ready

    async def wait(self) -> Arrival:
        # a segment that starts before the next arrival may send one sooner
        while self.pending and self._next_start_s() < (self.arrivals[0][0] if self.arrivals else math.inf):
            self._run_segment(*self.pending.popleft())
        if not self.arrivals:
            raise RuntimeError("edge waits for a verdict but none is in flight")
        self.clock.now_s = max(self.clock.now_s, self.arrivals[0][0])
        return heapq.heappop(self.arrivals)[2]


def simulate_dsd(
    draft: LanguageModel,
    target: LanguageModel,
    prompt: Sequence[int],
    stop: StopRule,
    costs: LinkCosts,
    config: DriverConfig,
    sampling: SamplingParams = SamplingParams(),
    seq_id: str = "sim",
    controller: Controller | None = None,
    cache_memory: CacheMemory | None = None,
) -> SimulatedRun:
    """The edge's own drive loop (dsd.drive.driver) on a virtual clock, driven as ``config`` says (its
    mode an edge mode of dsd.modes). ``controller`` (dsd.controller.interface; None: gamma and the mode stay)
    is asked for the next plan before the first block and after every verdict; its gamma must be
    in 1..config.gamma_max. With ``costs.t_ar_s`` the controller may also hand the request to the
    server mid-way, ``config.handover_tokens`` at a time (dsd.drive.driver). ``cache_memory``: the
    cached mode's learning from earlier requests (dsd.cache.filler), as an edge's run keeps it."""
    clock = VirtualClock()
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    session.prefill()
    link = VirtualLink(clock, session, costs, draft)
    generation = Generation([])
    emits_s: list[float] = []

    def on_round(r: Round) -> None:
        if isinstance(r.arrival, ServedArrival):
            served = r.arrival.served
            record = RoundRecord(r.index, served.proposed, served.accepted, len(r.emitted), False, r.gamma, r.mode)
        else:
            record = RoundRecord.from_verdict(r.index, r.arrival.verdict, len(r.emitted), r.gamma, r.mode, r.cache)
        generation.rounds.append(record)
        if r.emitted:
            emits_s.append(r.arrival.t_receive_s)

    driver = DsdDriver(
        draft,
        DriveRequest(seq_id, prompt, stop, sampling, session.decided_features(1)),
        DrivePorts(VirtualDevice(clock, costs.t_draft_s), link, clock, on_round),
        config,
        controller,
        cache_memory,
    )
    generation.tokens = run_to_end(driver.run())
    session.close()
    draft.release(link.server_seq_id)
    # The output is complete when the last emitting verdict arrives; stale answers to doomed
    # blocks still on the way do not delay it.
    return SimulatedRun(
        generation, emits_s[-1] if emits_s else 0.0, emits_s[0] if emits_s else 0.0, driver.draft_steps, driver.edge
    )


def simulate_on_server(
    draft: LanguageModel,
    target: LanguageModel,
    prompt: Sequence[int],
    gamma: int,
    stop: StopRule,
    mode: str,
    costs: ServerCosts,
    sampling: SamplingParams = SamplingParams(),
    seq_id: str = "sim",
) -> SimulatedRun:
    """Cloud AR or co-located SD as the services run it (services/edge/client.py Client.on_server,
    services/verifier/): at time 0 the client sends Open and Generate; each arrives one link
    delay later; the verifier prefills, then runs one AR step (t_ar) or one co-located round
    (gamma draft steps on its own draft model, then one verification) after another and sends
    each step's tokens at once, which the client receives one link delay later. Times run from
    the client's first send (the request's one-off costs are in them, unlike simulate_dsd)."""
    if mode not in server_modes():
        raise ValueError(f"mode must be one of {server_modes()} (the server's own modes), got {mode!r}")
    drafts = get_mode(mode).drafts == SERVER
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    clock_s = costs.one_way_s  # the Open (and the Generate behind it) arrives
    session.prefill()
    clock_s += costs.t_prefill_s
    if drafts:
        begin_request(draft, seq_id, prompt, gamma)  # as dsd.drive.generation.generate_colocated
        hand_features(draft, seq_id, session.decided_features(1))
    generation = Generation([])
    receipts_s: list[float] = []
    draft_steps = 0
    while not session.finished:
        if not drafts:
            emitted = session.ar_step()
            clock_s += costs.t_ar_s
            record = RoundRecord(len(generation.rounds), 0, 0, len(emitted))
        else:
            drafted, q = draft_block(draft, seq_id, session.committed.tokens, gamma, sampling, session.draws)
            clock_s += gamma * costs.t_draft_s
            draft_steps += gamma
            before = len(session.committed)
            verdict = session.verify(session.proposal_for(drafted, q))
            hand_features(draft, seq_id, verdict.features)
            clock_s += costs.t_verify_s
            record = RoundRecord.from_verdict(len(generation.rounds), verdict, len(session.committed) - before)
        generation.rounds.append(record)
        receipts_s.append(clock_s + costs.one_way_s)  # this step's Tokens message reaches the client
    generation.tokens = session.generated
    session.close()
    if drafts:
        draft.release(seq_id)
    emitting = [t for t, r in zip(receipts_s, generation.rounds) if r.emitted]
    return SimulatedRun(
        generation, emitting[-1] if emitting else clock_s, emitting[0] if emitting else 0.0, draft_steps, None
    )
