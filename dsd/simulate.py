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
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsd.backends.protocol import LanguageModel, Proposal, SamplingParams
from dsd.decoding import Generation, RoundRecord
from dsd.drafting import begin_request, draft_block, draft_step
from dsd.edge import EdgeDecoder
from dsd.stopping import StopRule
from dsd.verifier_session import VerifierSession


@dataclass(frozen=True)
class LinkCosts:
    t_draft_s: float
    t_verify_s: float
    rtt_s: float

    def __post_init__(self) -> None:
        for name in ("t_draft_s", "t_verify_s", "rtt_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

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
    total_s: float                 # from the first draft step to the last verdict
    first_token_s: float           # until the first verdict arrives
    draft_steps: int
    edge: EdgeDecoder | None       # None for the modes the server runs alone

    @property
    def per_token_s(self) -> float:
        return self.total_s / max(len(self.generation.tokens), 1)


def simulate_dsd(draft: LanguageModel, target: LanguageModel, prompt: Sequence[int], gamma: int,
                 stop: StopRule, costs: LinkCosts, pipelined: bool, max_in_flight: int = 1,
                 sampling: SamplingParams = SamplingParams(), seq_id: str = "sim") -> SimulatedRun:
    edge = EdgeDecoder(prompt, gamma, stop, pipelined=pipelined, max_in_flight=max_in_flight)
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    session.prefill()
    draft_generator = torch.Generator().manual_seed(sampling.seed + 1)
    begin_request(draft, seq_id, prompt, gamma)
    arrivals: list[tuple[float, int, object]] = []   # (time at the edge, send order, verdict)
    order = itertools.count()
    verifier_free_at = 0.0
    clock_s = 0.0
    first_token_s = None
    last_emit_s = 0.0
    generation = Generation([])
    draft_steps = 0

    def send(proposals: list[Proposal], at_s: float) -> None:
        nonlocal verifier_free_at
        for proposal in proposals:
            start_s = max(at_s + costs.one_way_s, verifier_free_at)
            verdict = session.verify(proposal)
            verifier_free_at = start_s + (0.0 if verdict.stale else costs.t_verify_s)
            heapq.heappush(arrivals, (verifier_free_at + costs.one_way_s, next(order), verdict))

    def deliver_until(time_s: float) -> None:
        nonlocal first_token_s, last_emit_s
        while arrivals and arrivals[0][0] <= time_s:
            arrival_s, _, verdict = heapq.heappop(arrivals)
            emitted, to_send = edge.on_verdict(verdict)
            generation.rounds.append(RoundRecord.from_verdict(len(generation.rounds), verdict, len(emitted)))
            if emitted:
                last_emit_s = arrival_s
                if first_token_s is None:
                    first_token_s = arrival_s
            send(to_send, arrival_s)

    step_limit = 64 * (stop.max_new_tokens + 1) * (gamma + 2)
    while True:
        deliver_until(clock_s)
        if edge.done:
            break
        request = edge.next_draft()
        if request is None:
            if not arrivals:
                raise RuntimeError("edge waits for a verdict but none is in flight")
            clock_s = max(clock_s, arrivals[0][0])
            continue
        tokens = list(request.prefix)
        probs = []
        for _ in range(request.n_tokens):
            token, q = draft_step(draft, seq_id, tokens, sampling, draft_generator)
            tokens.append(token)
            probs.append(q)
            clock_s += costs.t_draft_s
            draft_steps += 1
            deliver_until(clock_s)
            if edge.epoch != request.epoch:
                break
        if draft_steps > step_limit:
            raise RuntimeError(f"simulation exceeded {step_limit} draft steps")
        drafted = tokens[len(request.prefix):]
        q_stack = None if sampling.greedy else torch.stack(probs)
        send(edge.add_draft(request, drafted, q_stack), clock_s)
    generation.tokens = edge.generated
    session.close()
    draft.release(seq_id)
    # The output is complete when the last emitting verdict arrives; stale answers to doomed
    # blocks still on the way do not delay it.
    return SimulatedRun(generation, last_emit_s, first_token_s or 0.0, draft_steps, edge)


def simulate_on_server(draft: LanguageModel, target: LanguageModel, prompt: Sequence[int], gamma: int,
                       stop: StopRule, mode: str, costs: ServerCosts,
                       sampling: SamplingParams = SamplingParams(), seq_id: str = "sim") -> SimulatedRun:
    """Cloud AR or co-located SD as the services run it (services/edge.py Client.on_server,
    services/verifier.py): at time 0 the client sends Open and Generate; each arrives one link
    delay later; the verifier prefills, then runs one AR step (t_ar) or one co-located round
    (gamma draft steps on its own draft model, then one verification) after another and sends
    each step's tokens at once, which the client receives one link delay later. Times run from
    the client's first send (the request's one-off costs are in them, unlike simulate_dsd)."""
    if mode not in ("ar", "colocated"):
        raise ValueError(f"mode must be 'ar' or 'colocated' (the server's own modes), got {mode!r}")
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    clock_s = costs.one_way_s                     # the Open (and the Generate behind it) arrives
    session.prefill()
    clock_s += costs.t_prefill_s
    draft_generator = torch.Generator().manual_seed(sampling.seed + 1)
    generation = Generation([])
    receipts_s: list[float] = []
    draft_steps = 0
    while not session.finished:
        if mode == "ar":
            emitted = session.ar_step()
            clock_s += costs.t_ar_s
            record = RoundRecord(len(generation.rounds), 0, 0, len(emitted))
        else:
            drafted, q = draft_block(draft, seq_id, session.committed.tokens, gamma, sampling, draft_generator)
            clock_s += gamma * costs.t_draft_s
            draft_steps += gamma
            before = len(session.committed)
            verdict = session.verify(session.proposal_for(drafted, q))
            clock_s += costs.t_verify_s
            record = RoundRecord.from_verdict(len(generation.rounds), verdict, len(session.committed) - before)
        generation.rounds.append(record)
        receipts_s.append(clock_s + costs.one_way_s)      # this step's Tokens message reaches the client
    generation.tokens = session.generated
    session.close()
    if mode == "colocated":
        draft.release(seq_id)
    emitting = [t for t, r in zip(receipts_s, generation.rounds) if r.emitted]
    return SimulatedRun(generation, emitting[-1] if emitting else clock_s, emitting[0] if emitting else 0.0,
                        draft_steps, None)
