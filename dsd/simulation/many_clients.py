"""N closed-loop clients sharing one verifier, on virtual time, through the real protocol code.

``dsd.simulation.one_client`` runs one request against a verifier that serves it alone. Here ``n_clients``
clients each run their requests one after another (a client issues its next request when its
last one ends, so the clients' requests overlap) against one verifier device, shared the way
services/verifier/scheduler.py shares it: a queue of passes, each pass one job of a session or a batch of
jobs of one kind. The drafter, the edge state machine (``dsd.drive.driver``'s drive loop) and the
verifier session are the production code as in ``dsd.simulation.one_client``; only the clock, the link and
the device's queue are simulated.

What is a job on the shared verifier (each costs what the scheduler charges an emulated pass,
``pass_cost_s``: t_verify(gamma, b), t_ar(b), gamma draft steps scaled like t_ar(b), the prefill):
- every session's Open: a prefill (never batched);
- sync, pipelined and cached DSD: each block's verification (a stale block's answer costs no
  device time); the edge drafts on its own device, one per client, shared with nobody;
- cloud AR: every token step;
- co-located SD: every round's draft block (gamma steps of the server's draft model) and then its
  verification, two passes, so the server pays every client's drafting.

The device (``dsd.simulation.shared_verifier``): work-conserving (or waiting ``batch_window_ms``
for a batch to fill, as the scheduler does), first come first served by when a job could start;
a session's jobs run in the order sent, one at a time (a session's next job waits for its last).
A pass takes its first job and every other waiting session's job of the same kind, up to
``max_batch``. With ``max_batch = 1`` it is strictly serial (the paper's capacity setting).

The event loop (``dsd.simulation.virtual_time``): each client is one coroutine (its requests in
turn); it suspends when its clock moves (a draft step, waiting for a verdict) and resumes at that
virtual time, so every send happens in time order across clients. A pass is laid out when it
starts (its members and so its cost are known then), so a verdict's arrival time is known before
it is due.

NOTE: the adaptive controllers' hand-over (dsd.drive.driver: the server generating a segment of a DSD
request) is not modelled here, so the link does not hand over; a run with them at one client is
``dsd.simulation.one_client``'s. A link whose RTT changes over time (``rtt_at``) keeps each message's delay at
its send time, so a message sent into a falling delay may reach the verifier ahead of one another
client sent before it; each connection still delivers in order.
NOTE: services/verifier/scheduler.py gives the next pass to the client served least recently; here it
goes to the job ready first. The two agree while each client has at most one job waiting (every
mode but pipelined DSD with blocks queued behind each other).
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dsd.drive.arrivals import Arrival, Round, VerdictArrival
from dsd.controller.interface import GAMMA_MAX
from dsd.backends.protocol import LanguageModel, Proposal, SamplingParams, Verdict
from dsd.drive.generation import Generation, RoundRecord
from dsd.speculation.drafting import begin_request, draft_block
from dsd.drive.driver import DrivePorts, DriveRequest, DriverConfig, DsdDriver
from dsd.features import hand_features
from dsd.modes import AR, SERVER, get_mode, server_modes
from dsd.cache.speculation_cache import CacheConfig
from dsd.speculation.stopping import StopRule
from dsd.costs.compute_times import DRAFT, PREFILL, STALE, VERIFY, ComputeTimes
from dsd.drive.verifier_session import VerifierSession
from dsd.drive.batching import BatchingConfig
from dsd.simulation.shared_verifier import SharedVerifier
from dsd.simulation.virtual_time import ClientCoroutine, Suspend, VirtualLoop

MAX_CLIENTS = 4096  # the sim launcher's ceiling: thousands of clients in seconds (docs/launchers.md)


@dataclass(frozen=True)
class ClientsSetup:
    """One point's clients: their mode and plan, the link, and the shared verifier.
    ``rtt_at(t_s)``: the link's RTT (s) at virtual time t_s from the point's start."""

    n_clients: int
    mode: str
    gamma: int
    times: ComputeTimes
    rtt_at: Callable[[float], float]
    verifier: BatchingConfig = BatchingConfig()
    max_in_flight: int = 1
    gamma_max: int = GAMMA_MAX  # as dsd.simulation.one_client's runs: what a mode's own policy may reach
    cache: CacheConfig = CacheConfig()

    def __post_init__(self) -> None:
        if not (isinstance(self.n_clients, int) and 1 <= self.n_clients <= MAX_CLIENTS):
            raise ValueError(
                f"clients must be a whole number in 1..{MAX_CLIENTS} on the sim launcher, got {self.n_clients!r}"
            )
        get_mode(self.mode)
        for name in ("gamma", "max_in_flight", "gamma_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.verifier.max_batch > 1 and self.times.batch_slope is None:
            raise ValueError(
                f"max_batch {self.verifier.max_batch}: a batched verifier costs the compute times' "
                "batch curve (batch_slope), and these times carry none (a measurement of single "
                "passes; dsd.costs.measurement.fit_batch_slope measures it)"
            )


@dataclass(frozen=True)
class RoundTimes:
    """A round's times on the point's virtual clock (services/traces.py RoundRow's columns of
    the same names): the edge's drafting (None for the server's own modes), the send of its
    block (the Generate for the server's modes), its answer's receipt, and on the verifier the
    wait for and the time of its passes (a co-located round's two summed) and the batch's size."""

    t_draft_start_s: float | None
    t_draft_end_s: float | None
    t_send_s: float
    t_receive_s: float
    server_queue_s: float
    server_compute_s: float
    server_batch_size: int


@dataclass
class ClientRequest:
    """One request as its client saw it: times (s) from the request's start, which is
    ``start_s`` on the point's virtual clock."""

    client: int
    index: int
    start_s: float
    tokens: list[int]
    rounds: list[RoundRecord]
    total_s: float  # until its last tokens arrived
    first_token_s: float  # until its first tokens arrived
    round_times: list[RoundTimes]


# --- a client's device and link ------------------------------------------------------------------


Result = TypeVar("Result")


class _EdgeDevice:
    """A client's own draft device: every step costs ``t_draft_s``; the client waits it out."""

    def __init__(self, loop: VirtualLoop, t_draft_s: float) -> None:
        self.loop, self.t_draft_s = loop, t_draft_s

    async def draft(self, work: Callable[[], None], n_steps: float, then: Callable[[], Result]) -> tuple[Result, float]:
        start_s = t_s = self.loop.now_s
        work()
        whole = int(n_steps)
        for _ in range(whole):  # step by step: the same sums as dsd.simulation.one_client's device
            t_s += self.t_draft_s
        if n_steps > whole:
            t_s += (n_steps - whole) * self.t_draft_s
        await Suspend(t_s)
        return then(), start_s


class _SharedLink:
    """A client's connection to the shared verifier (a ``dsd.drive.device_transport.Transport``): each message
    takes half the RTT at its send, each block is a job on the verifier."""

    def __init__(
        self,
        loop: VirtualLoop,
        verifier: SharedVerifier,
        client: ClientCoroutine,
        session: VerifierSession,
        setup: ClientsSetup,
    ) -> None:
        self.loop, self.verifier, self.client, self.session, self.setup = loop, verifier, client, session, setup
        self.arrivals: list[tuple[float, int, Arrival]] = []
        self.order = itertools.count()
        self.last_out_s = self.last_back_s = 0.0  # one connection: each direction is FIFO
        self.batch_sizes: dict[int, int] = {}  # id(verdict arrival) -> its pass's batch size

    def one_way_s(self, at_s: float) -> float:
        return self.setup.rtt_at(at_s) / 2

    def to_server_s(self, sent_s: float) -> float:
        self.last_out_s = max(sent_s + self.one_way_s(sent_s), self.last_out_s)
        return self.last_out_s

    def to_edge_s(self, sent_s: float) -> float:
        self.last_back_s = max(sent_s + self.one_way_s(sent_s), self.last_back_s)
        return self.last_back_s

    def open(self, n_prompt_tokens: int) -> None:
        """The session's Open, sent as the request starts: a prefill on the verifier."""
        self.verifier.submit(
            self.session,
            self.to_server_s(self.loop.now_s),
            PREFILL,
            n_prompt_tokens,
            lambda start_s, end_s, batch_size: None,
        )

    def prepare(self, proposals: list[Proposal]) -> list[Proposal]:
        return proposals

    async def send(self, proposals: list[Proposal], after: Arrival | None) -> list[float]:
        sent_s = self.loop.now_s if after is None else after.t_receive_s
        for proposal in proposals:
            verdict = self.session.verify(proposal)  # a session's blocks are verified in order
            arrive_s = self.to_server_s(sent_s)
            gamma = proposal.gamma if self.setup.times.knows_gamma(proposal.gamma) else self.setup.gamma
            self.verifier.submit(
                self.session,
                arrive_s,
                STALE if verdict.stale else VERIFY,
                gamma,
                functools.partial(self._answer, verdict, arrive_s),
            )
        return [sent_s] * len(proposals)

    def _answer(self, verdict: Verdict, arrive_s: float, start_s: float, end_s: float, batch_size: int) -> None:
        back_s = self.to_edge_s(end_s)
        arrival = VerdictArrival(verdict, back_s, start_s - arrive_s, end_s - start_s)
        self.batch_sizes[id(arrival)] = batch_size
        heapq.heappush(self.arrivals, (back_s, next(self.order), arrival))
        self.loop.at(back_s, self.client.wake)

    async def poll(self) -> list[Arrival]:
        ready = []
        while self.arrivals and self.arrivals[0][0] <= self.loop.now_s:
            ready.append(heapq.heappop(self.arrivals)[2])
        return ready

    async def wait(self) -> Arrival:
        while not (self.arrivals and self.arrivals[0][0] <= self.loop.now_s):
            await Suspend(None)
        return heapq.heappop(self.arrivals)[2]


# --- one request of each kind --------------------------------------------------------------------


async def _dsd_request(
    loop: VirtualLoop,
    verifier: SharedVerifier,
    client: ClientCoroutine,
    setup: ClientsSetup,
    draft: LanguageModel,
    target: LanguageModel,
    prompt: Sequence[int],
    stop: StopRule,
    sampling: SamplingParams,
    seq_id: str,
) -> tuple[Generation, list[RoundTimes]]:
    """The request's output and its rounds' times. As dsd.simulation.one_client.simulate_dsd: the edge's
    drive loop, its Open sent as it starts drafting."""
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    session.prefill()
    link = _SharedLink(loop, verifier, client, session, setup)
    link.open(len(prompt) - 1)
    generation, times = Generation([]), []

    def on_round(r: Round) -> None:
        a = r.arrival
        if not isinstance(a, VerdictArrival) or a.queue_s is None or a.compute_s is None:
            raise RuntimeError("a round on the shared verifier is a verdict with its queue and compute times")
        generation.rounds.append(RoundRecord.from_verdict(r.index, a.verdict, len(r.emitted), r.gamma, r.mode, r.cache))
        times.append(
            RoundTimes(
                r.t_draft_start_s,
                r.t_draft_end_s,
                r.t_send_s,
                a.t_receive_s,
                a.queue_s,
                a.compute_s,
                link.batch_sizes.pop(id(a)),
            )
        )

    config = DriverConfig(setup.gamma, setup.mode, setup.max_in_flight, setup.gamma_max, cache=setup.cache)
    driver = DsdDriver(
        draft,
        DriveRequest(seq_id, prompt, stop, sampling, session.decided_features(1)),
        DrivePorts(_EdgeDevice(loop, setup.times.t_draft_edge_s), link, loop, on_round),
        config,
    )
    generation.tokens = await driver.run()
    session.close()
    return generation, times


async def _session_pass(
    loop: VirtualLoop,
    verifier: SharedVerifier,
    client: ClientCoroutine,
    session: VerifierSession,
    kind: str,
    size: int,
    ready_s: float,
) -> tuple[float, float, int]:
    """Queue one pass of the session once it is ready; returns (queue_s, end_s, batch size) at its end."""
    passes: list[tuple[float, float, int]] = []  # the pass's (start, end, batch size) once it starts

    def done(start_s: float, end_s: float, batch_size: int) -> None:
        passes.append((start_s, end_s, batch_size))
        loop.at(end_s, client.wake)

    verifier.submit(session, ready_s, kind, size, done)
    while not passes or loop.now_s < passes[-1][1]:
        await Suspend(None)
    start_s, end_s, batch_size = passes.pop()
    return start_s - ready_s, end_s, batch_size


async def _server_request(
    loop: VirtualLoop,
    verifier: SharedVerifier,
    client: ClientCoroutine,
    setup: ClientsSetup,
    draft: LanguageModel,
    target: LanguageModel,
    prompt: Sequence[int],
    stop: StopRule,
    sampling: SamplingParams,
    seq_id: str,
) -> tuple[Generation, list[RoundTimes]]:
    """The request's output and its rounds' times. As dsd.simulation.one_client.simulate_on_server: Open and
    Generate out, then the server's steps, each a job on the shared verifier queued behind the
    session's last, each step's Tokens sent back at once."""
    sent_s = loop.now_s
    one_way_s = setup.rtt_at(sent_s) / 2
    gamma, drafts = setup.gamma, get_mode(setup.mode).drafts == SERVER
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    job = functools.partial(_session_pass, loop, verifier, client, session)
    session.prefill()
    _, t_s, _ = await job(PREFILL, len(prompt) - 1, sent_s + one_way_s)
    if drafts:
        begin_request(draft, seq_id, prompt, gamma)  # as dsd.drive.generation.generate_colocated
        hand_features(draft, seq_id, session.decided_features(1))
    generation, times = Generation([]), []
    while not session.finished:
        started_s = t_s
        if not drafts:
            emitted = session.ar_step()
            queue_s, t_s, batch_size = await job(AR, 1, t_s)
            record = RoundRecord(len(generation.rounds), 0, 0, len(emitted))
        else:
            drafted, q = draft_block(draft, seq_id, session.committed.tokens, gamma, sampling, session.draws)
            queue_s, t_s, _ = await job(DRAFT, gamma, t_s)
            before = len(session.committed)
            verdict = session.verify(session.proposal_for(drafted, q))
            hand_features(draft, seq_id, verdict.features)
            verify_queue_s, t_s, batch_size = await job(VERIFY, gamma, t_s)
            queue_s += verify_queue_s
            record = RoundRecord.from_verdict(len(generation.rounds), verdict, len(session.committed) - before)
        generation.rounds.append(record)
        times.append(RoundTimes(None, None, sent_s, t_s + one_way_s, queue_s, t_s - started_s - queue_s, batch_size))
    generation.tokens = session.generated
    session.close()
    if drafts:
        draft.release(seq_id)
    # the client has the request's last Tokens when they arrive
    while loop.now_s < times[-1].t_receive_s:
        await Suspend(times[-1].t_receive_s)
    return generation, times


# --- the clients ---------------------------------------------------------------------------------


def simulate_clients(
    setup: ClientsSetup,
    draft: LanguageModel,
    target: LanguageModel,
    prompts: Sequence[Sequence[int]],
    stop: StopRule,
    sampling_of: Callable[[int], SamplingParams] = lambda _i: SamplingParams(),
    seq_prefix: str = "sim",
) -> list[ClientRequest]:
    """Every client runs every prompt in turn from time 0, all on one verifier; returns each
    request (client by client, in order). ``sampling_of(index)``: a request's sampling."""
    loop = VirtualLoop()
    verifier = SharedVerifier(loop, setup.times, setup.verifier)
    run = _server_request if setup.mode in server_modes() else _dsd_request
    done: list[ClientRequest] = []

    async def client_run(c: int, client: ClientCoroutine) -> None:
        for index, prompt in enumerate(prompts):
            start_s = loop.now_s
            generation, times = await run(
                loop,
                verifier,
                client,
                setup,
                draft,
                target,
                prompt,
                stop,
                sampling_of(index),
                f"{seq_prefix}-c{c}-{index}",
            )
            # the output is complete when the last emitting answer arrives; a stale one after it
            # does not delay it
            emits_s = [t.t_receive_s for t, r in zip(times, generation.rounds) if r.emitted] or [loop.now_s]
            done.append(
                ClientRequest(
                    c,
                    index,
                    start_s,
                    generation.tokens,
                    generation.rounds,
                    emits_s[-1] - start_s,
                    emits_s[0] - start_s,
                    times,
                )
            )

    for c in range(setup.n_clients):
        loop.at(0.0, ClientCoroutine(loop, functools.partial(client_run, c)).resume)
    loop.run()
    if len(done) != setup.n_clients * len(prompts):
        raise RuntimeError(
            f"{setup.n_clients * len(prompts) - len(done)} simulated request(s) never finished "
            "(a client waited for an answer that was never sent)"
        )
    return sorted(done, key=lambda r: (r.client, r.index))
