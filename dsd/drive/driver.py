"""The DSD drive loop, written once for every clock: the simulator's virtual time (dsd.simulation.one_client)
and the edge service's real one (services/edge/).

The loop asks the edge state machine (``dsd.drive.edge_decoder.EdgeDecoder``) what to draft, drafts it on a
``Device``, hands the blocks to a ``Transport`` and applies each verdict as it arrives; a
controller (``dsd.controller.interface``) may change gamma and the edge mode after every verdict; without one,
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
The hand-over stream is ``dsd.drive.handover.HandoverStream``; what arrives, ``dsd.drive.arrivals``; the
interfaces and a transport's optional abilities (``HandsOver``, ``Withdraws``), ``dsd.drive.device_transport``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar


from dsd.checks import is_int
from dsd.drive.arrivals import (
    AcknowledgedArrival,
    Arrival,
    Round,
    ServedArrival,
    ServerRound,
    VerdictArrival,
    WithdrawnArrival,
    features_of,
)
from dsd.backends.protocol import LanguageModel, Proposal, SamplingParams
from dsd.cache.filler import CacheFiller, CacheMemory
from dsd.drive.device_transport import Device, HandsOver, Transport
from dsd.controller.interface import Controller, ControllerConfig, Decision, Observation, check_decision
from dsd.controller.policies import make_controller
from dsd.speculation.draws import Draws
from dsd.speculation.drafting import Block, begin_request
from dsd.drive.edge_decoder import DraftRequest, EdgeDecoder
from dsd.features import FeatureBlock, hand_features
from dsd.drive.handover import HandoverStream
from dsd.modes import EDGE, SYNC, edge_modes, get_mode, server_modes
from dsd.cache.speculation_cache import CacheConfig
from dsd.speculation.stopping import StopRule

__all__ = [
    "AcknowledgedArrival",
    "Arrival",
    "Device",
    "DrivePorts",
    "DriveRequest",
    "DriverConfig",
    "DsdDriver",
    "Round",
    "ServedArrival",
    "ServerRound",
    "Transport",
    "VerdictArrival",
    "WithdrawnArrival",
    "observation",
    "run_to_end",
    "step_limit",
]


def step_limit(max_new_tokens: int, gamma_max: int) -> int:
    """A bound on draft steps per request: far above any real run, so hitting it means a bug."""
    return 64 * (max_new_tokens + 1) * (gamma_max + 2)


@dataclass(frozen=True)
class DriverConfig:
    """How a DSD request is driven. Its mode is ``mode``, or, with an adaptive controller, what
    the controller picks each round (then ``mode`` is only where a static run would stay)."""

    gamma: int
    mode: str = SYNC
    max_in_flight: int = 1  # blocks in flight when pipelined
    gamma_max: int | None = None  # the largest gamma a controller may pick (default: gamma)
    handover_tokens: int = 4  # the length of a hand-over segment (the module's docstring)
    cache: CacheConfig = CacheConfig()  # the cached mode's speculation cache

    def __post_init__(self) -> None:
        for name in ("gamma", "max_in_flight", "handover_tokens"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if get_mode(self.mode).drafts != EDGE:
            raise ValueError(f"mode must be one the edge drafts in, {edge_modes()}, got {self.mode!r}")
        object.__setattr__(self, "gamma_max", max(self.gamma_max or self.gamma, self.gamma))


@dataclass(frozen=True)
class DriveRequest:
    """The request a driver drafts for: its sequence id (the draft's cache key), prompt, stop rule
    and sampling; ``prefill_features``: the target's features over the prompt (dsd.features), for
    a feature draft."""

    seq_id: str
    prompt: Sequence[int]
    stop: StopRule
    sampling: SamplingParams = SamplingParams()
    prefill_features: FeatureBlock | None = None


@dataclass(frozen=True)
class DrivePorts:
    """What differs between the simulator and the service (the module's docstring): the draft
    device, the transport, the clock, and where each round is reported."""

    device: Device
    transport: Transport
    clock: Callable[[], float]
    on_round: Callable[[Round], None]


class DsdDriver:
    """One DSD request: ``await run()`` drafts until the stop rule holds; ``handle(arrival)``
    applies a verdict or a server round (also for the stale ones a transport drains after the end).
    Without a ``controller`` every round is ``config.mode`` at ``config.gamma``.
    ``cache_memory``: what the cached mode's fills learnt in earlier requests on this draft
    (dsd.cache.filler: pass times, the ranking's calibration)."""

    def __init__(
        self,
        draft: LanguageModel,
        request: DriveRequest,
        ports: DrivePorts,
        config: DriverConfig,
        controller: Controller | None = None,
        cache_memory: CacheMemory | None = None,
    ) -> None:
        seq_id, prompt, stop, sampling = request.seq_id, request.prompt, request.stop, request.sampling
        self.draft, self.seq_id, self.sampling = draft, seq_id, sampling
        self.device, self.transport, self.clock, self.on_round = (
            ports.device,
            ports.transport,
            ports.clock,
            ports.on_round,
        )
        self.gamma_max = config.gamma_max or config.gamma  # DriverConfig set it (>= gamma)
        self.controller = controller or make_controller(
            ControllerConfig("static", config.gamma, config.mode, self.gamma_max, modes=(config.mode,))
        )
        # the modes a round may take: the server's too where the transport can hand over
        self.modes = edge_modes() + (
            server_modes() if isinstance(self.transport, HandsOver) and self.transport.hands_over else ()
        )
        self.server_decision: Decision | None = None
        self.stream = HandoverStream(self, config.handover_tokens)
        self.stop = stop
        self.draft_steps = 0
        self.rounds = 0
        self.edge = EdgeDecoder(prompt, config.gamma, stop, max_in_flight=config.max_in_flight)
        self.decide()
        self.draws = Draws(sampling.seed)
        # the cached mode's speculation cache (dsd.cache.filler), made when a round first plans it
        self.cache_config = config.cache
        self.filler: CacheFiller | None = None
        self.cache_memory = cache_memory
        self._drafted: dict[tuple[int, int], tuple[float, float, int, str]] = {}  # block -> times, plan
        self._sent: deque[tuple[float, float, int, str, float]] = deque()  # ... + send time
        begin_request(draft, seq_id, prompt, config.gamma)
        hand_features(draft, seq_id, request.prefill_features)

    async def run(self) -> list[int]:
        """Draft, send and apply verdicts until the request is done; returns the output."""
        limit = step_limit(self.stop.max_new_tokens, self.gamma_max)
        while True:
            await self.deliver_ready()
            if self.edge.done:
                break
            if (
                self.server_decision is not None
                and not self.stream.segments
                and not self.edge.in_flight
                and self.edge.held is None
            ):
                await self.stream.keep_server_busy(None)
            # a withdraw's answer says which segments will still come: nothing is drafted before it
            request = None if self.stream.segments or self.stream.withdrawing else self.edge.next_draft()
            if request is None:
                if self.filler is not None and self.filler.wants_work and self.edge.in_flight:
                    await self.fill_step()
                else:
                    await self.handle(await self.transport.wait())
                continue
            await self.draft_block(request)
            if self.draft_steps > limit:
                raise RuntimeError(f"more than {limit} draft steps in one request")
        if self.filler is not None:
            self.filler.release()
        self.draft.release(self.seq_id)
        return self.edge.generated

    async def deliver_ready(self) -> None:
        for arrival in await self.transport.poll():
            await self.handle(arrival)

    async def draft_block(self, request: DraftRequest) -> None:
        plan = (request.n_tokens, self.mode)
        branch = self.filler.take(request.prefix) if self.filler is not None and not request.with_guess else None
        # a speculation cache may have drafted (part of) this block already
        block = (
            branch.block
            if branch is not None
            else Block(request.prefix, self.sampling, self.draws, keep_rows=get_mode(self.mode).cache)
        )
        del block.drafted[request.n_tokens :], block.probs[request.n_tokens :], block.rows[request.n_tokens :]

        def step() -> None:
            block.step(self.draft, self.seq_id)

        def finish() -> tuple[list[Proposal], Any]:
            drafted, q_stack = block.result()
            to_send = self.edge.add_draft(request, drafted, q_stack)
            if to_send and self._fills_cache() and self.filler is not None:
                self.filler.block_sent(request.prefix, drafted, block.rows)
            return to_send, self.transport.prepare(to_send)

        remaining = request.n_tokens - len(block.drafted)
        if remaining == 0:  # a complete cached block: out at once
            t_start_s = self.clock()
            to_send, prepared = finish()
        elif not self.edge.in_flight:  # no verdict can arrive that cuts this block short

            def steps() -> None:
                for _ in range(remaining):
                    step()

            (to_send, prepared), t_start_s = await self.device.draft(steps, remaining, finish)
            self.draft_steps += remaining
        else:  # a verdict may refute the prefix mid-block: look after every step
            for i in range(remaining):
                _, step_start_s = await self.device.draft(step, 1, lambda: None)
                t_start_s = step_start_s if i == 0 else t_start_s
                self.draft_steps += 1
                await self.deliver_ready()
                if self.edge.epoch != request.epoch:
                    break
            to_send, prepared = finish()
        proposal = to_send[0] if to_send else self.edge.held  # the block just drafted, if any
        if proposal is not None and not request.with_guess:
            self._drafted[(proposal.start_pos, proposal.base_digest)] = (t_start_s, self.clock(), *plan)
        await self.send(to_send, prepared)

    def _fills_cache(self) -> bool:
        """Whether this round's mode keeps a speculation cache (made at its first such round)."""
        if not get_mode(self.mode).cache:
            return False
        if self.filler is None:
            self.filler = CacheFiller(
                self.draft, self.seq_id, self.sampling, self.draws, self.cache_config, self.cache_memory
            )
        return True

    async def fill_step(self) -> None:
        """One device pass of the speculation cache's fill (dsd.cache.filler)."""
        filler = self.filler
        if filler is None:
            raise RuntimeError("a fill step without a speculation cache")
        work, n_steps, branches = filler.next_work()
        _, t_start_s = await self.device.draft(work, n_steps, lambda: None)
        filler.note_pass(branches, self.clock() - t_start_s)
        self.draft_steps += 1

    async def send(self, proposals: list[Proposal], prepared: Any, after: Arrival | None = None) -> None:
        for proposal, t_send_s in zip(proposals, await self.transport.send(prepared, after)):
            self._sent.append(self._drafted.pop((proposal.start_pos, proposal.base_digest)) + (t_send_s,))

    async def handle(self, arrival: Arrival) -> None:
        """Apply one verdict: emit, report the round, let the controller re-plan, send what is due."""
        hand_features(self.draft, self.seq_id, features_of(arrival))
        if isinstance(arrival, ServedArrival):
            await self.stream.handle_served(arrival)
            return
        if isinstance(arrival, AcknowledgedArrival):
            await self.stream.handle_acknowledged(arrival)
            return
        if isinstance(arrival, WithdrawnArrival):
            await self.stream.handle_withdrawn(arrival)
            return
        emitted, to_send = self.edge.on_verdict(arrival.verdict)
        t_draft_start_s, t_draft_end_s, gamma, mode, t_send_s = self._sent.popleft()
        cache = None
        if self.filler is not None and not arrival.verdict.stale:
            cache = self.filler.on_verdict(arrival.verdict, self.edge.committed.tokens, arrival.t_receive_s - t_send_s)
        self.report(Round(self.rounds, arrival, emitted, gamma, mode, t_draft_start_s, t_draft_end_s, t_send_s, cache))
        seen = observation(arrival, gamma, mode, t_draft_start_s, t_draft_end_s, t_send_s, self.remaining_tokens)
        self.stream.rtt_s = self.stream.rtt_s if arrival.verdict.stale else seen.rtt_s
        self.controller.observe(seen)
        self.decide()
        await self.send(to_send, self.transport.prepare(to_send), arrival)

    def report(self, round_: Round) -> None:
        """Hand a round (its index the next: ``self.rounds``) to the caller's ``on_round``."""
        self.on_round(round_)
        self.rounds += 1

    async def shadow(self, prefix: list[int], tokens: list[int]) -> tuple[int, int]:
        """(positions, matches): the draft's greedy guess at each streamed token given the true
        prefix, one draft step each on the device (greedy only: under sampling a match is not alpha)."""
        if not tokens or not self.sampling.greedy:
            return 0, 0
        guesses = []

        def work() -> None:
            logits = self.draft.logits(self.seq_id, prefix + tokens[:-1], len(tokens))  # [n, vocab]
            guesses.extend(logits.argmax(dim=-1).tolist())

        await self.device.draft(work, len(tokens), lambda: None)
        self.draft_steps += len(tokens)
        return len(tokens), sum(int(g == t) for g, t in zip(guesses, tokens))

    @property
    def remaining_tokens(self) -> int:
        """What the token budget still allows (an end-of-sequence may come sooner)."""
        return self.stop.max_new_tokens - len(self.edge.generated)

    def decide(self) -> None:
        """Ask the controller for the next gamma and mode, and follow it from now on. A server mode
        stops drafting (the hand-over starts once no block is in flight)."""
        decision = check_decision(self.controller.decide(), self.gamma_max, self.modes)
        on_server = decision.mode in server_modes()
        self.server_decision = decision if on_server else None
        self.edge.set_drafting(decision.gamma, not on_server and get_mode(decision.mode).pipelined)
        self.mode = decision.mode


def observation(
    arrival: VerdictArrival,
    gamma: int,
    mode: str,
    t_draft_start_s: float,
    t_draft_end_s: float,
    t_send_s: float,
    remaining_tokens: int | None = None,
) -> Observation:
    """What a controller learns from one round: the link's share of the round trip is what is left
    after the verifier's queue and compute."""
    v = arrival.verdict
    server_s = (arrival.queue_s or 0.0) + (arrival.compute_s or 0.0)
    return Observation(
        gamma,
        mode,
        v.proposed,
        v.accepted,
        v.stale,
        max(arrival.t_receive_s - t_send_s - server_s, 0.0),
        (t_draft_end_s - t_draft_start_s) / v.proposed if v.proposed else None,
        arrival.compute_s,
        arrival.queue_s,
        remaining_tokens=remaining_tokens,
    )


Result = TypeVar("Result")


def run_to_end(coroutine: Coroutine[Any, Any, Result]) -> Result:
    """Run a coroutine that never suspends (the simulator's: its clock is virtual) to its result."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: Result = done.value
        return result
    coroutine.close()
    raise RuntimeError("a virtual-time driver suspended: its device or transport awaited real I/O")
