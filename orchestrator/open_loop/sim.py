"""Open-loop serving on virtual time: many requests, one verifier, each edge behind its own link.

The sim launcher's serving model (pure, seeded, seconds for thousands of requests). It keeps the
verifier's scheduling (services/verifier/scheduler.py) and the exchange of every mode, and draws each
round's accepted count instead of running models:

- the verifier is one device: work-conserving, each pass takes the oldest waiting job and every
  other waiting job of its kind up to ``max_batch`` (prefills alone), priced as the scheduler
  prices an emulated pass (t_verify(gamma, b), t_ar(b), gamma draft steps scaled like t_ar(b),
  the prefill per token), each followed by ``gap_s`` (the harness's hand-off between passes);
- a request arrives at its edge at its arrival time, whether or not earlier ones finished; its
  Open reaches the verifier one link delay (half the edge's RTT) later and is admitted while
  fewer than ``max_sessions`` sessions are open, else refused (the edge hears so one delay later:
  a row with its reason, never a silent drop). A session stays open until its Close arrives;
- cloud AR: a prefill, then one AR step per token, each a job queued behind the last;
- co-located SD: a prefill, then rounds of a draft job (gamma steps) and a verify job;
- sync DSD: the edge drafts gamma steps on its own device (every request is its own device, as
  every run on an edge is), sends the block; the verify job waits for the block and for the
  session's previous job (the prefill first); the verdict returns one link delay later, and the
  edge drafts the next block.
Every round emits accepted + 1 tokens, accepted drawn from the truncated geometric of i.i.d.
acceptance (the same draws for a request in every mode, so modes at one rate are paired).

NOTE: pipelined DSD is not modelled here (its speculation across verdicts needs the edge state
machine); the network launchers run it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dsd.modes import AR, COLOCATED, SYNC
from dsd.costs.compute_times import ComputeTimes, pass_cost_s
from orchestrator.spec.arrivals import OpenLoopRequest

SIM_MODES = (AR, COLOCATED, SYNC)
REFUSED_MAX_SESSIONS = "limit max_sessions"


@dataclass(frozen=True)
class ServingSetup:
    mode: str
    gamma: int
    alpha: float
    times: ComputeTimes
    rtt_ms_per_edge: tuple[float, ...]
    prompt_tokens: int
    max_batch: int = 1
    max_sessions: int = 256
    gap_s: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in SIM_MODES:
            raise ValueError(f"mode must be one of {SIM_MODES} on the serving sim, got {self.mode!r}")
        if not self.rtt_ms_per_edge or min(self.rtt_ms_per_edge) < 0:
            raise ValueError(f"rtt_ms_per_edge must be a non-empty list of RTTs >= 0, got {self.rtt_ms_per_edge!r}")
        for name in ("gamma", "max_batch", "max_sessions", "prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.alpha <= 1 or self.gap_s < 0:
            raise ValueError(f"alpha must be in [0, 1] and gap_s >= 0, got {self.alpha!r}, {self.gap_s!r}")


@dataclass
class Served:
    """One request as the edge saw it (absolute virtual times, seconds)."""

    arrival: OpenLoopRequest
    rtt_ms: float
    refused: str = ""
    first_token_s: float = math.nan
    last_token_s: float = math.nan
    tokens: int = 0
    rounds: int = 0
    queue_s: float = 0.0  # summed over the request's jobs: ready until its pass started
    passes: int = 0

    def row(self) -> dict:
        a = self.arrival
        tpot_s = (self.last_token_s - self.first_token_s) / (self.tokens - 1) if self.tokens > 1 else math.nan
        end_s = math.nan if self.refused else self.last_token_s
        return {
            "request_index": a.index,
            "edge": a.edge,
            "arrival_s": a.arrival_s,
            "warmup": a.warmup,
            "link_rtt_configured_ms": self.rtt_ms,
            "max_tokens": a.max_tokens,
            "admitted": not self.refused,
            "refused_reason": self.refused,
            "start_lag_s": 0.0,
            "queue_s": self.queue_s if not self.refused else math.nan,
            "ttft_s": self.first_token_s - a.arrival_s,
            "tpot_s": tpot_s,
            "e2e_s": end_s - a.arrival_s,
            "tokens": self.tokens,
            "rounds": self.rounds,
            "server_passes": self.passes,
        }


@dataclass(order=True)
class _Job:
    ready_s: float
    order: int
    kind: str = field(compare=False)
    size: int = field(compare=False)
    request: Served = field(compare=False)
    done: Callable[[float], None] = field(compare=False)


class _Verifier:
    """The one device and its queue, on the simulation's event heap."""

    def __init__(self, sim: _Sim, setup: ServingSetup) -> None:
        self.sim, self.setup = sim, setup
        self.waiting: list[_Job] = []
        self.busy = False
        self.open_sessions = 0
        self.order = itertools.count()

    def submit(self, t_s: float, kind: str, size: int, request: Served, done: Callable[[float], None]) -> None:
        heapq.heappush(self.waiting, _Job(t_s, next(self.order), kind, size, request, done))
        if not self.busy:
            self._start(t_s)

    def _cost_s(self, kind: str, sizes: list[int]) -> float:
        return pass_cost_s(self.setup.times, kind, sizes)

    def _start(self, now_s: float) -> None:
        if not self.waiting:
            self.busy = False
            return
        first = heapq.heappop(self.waiting)
        batch = [first]
        limit = 1 if first.kind == "prefill" else self.setup.max_batch
        if limit > 1:
            same = sorted(j for j in self.waiting if j.kind == first.kind)[: limit - 1]
            if same:
                taken = {id(j) for j in same}
                self.waiting = [j for j in self.waiting if id(j) not in taken]
                heapq.heapify(self.waiting)
                batch += same
        self.busy = True
        end_s = now_s + self._cost_s(first.kind, [j.size for j in batch])
        for job in batch:
            job.request.queue_s += now_s - job.ready_s
            job.request.passes += 1
            self.sim.at(end_s, job.done)
        self.sim.at(end_s + self.setup.gap_s, self._start)


class _Sim:
    def __init__(self) -> None:
        self.events: list = []
        self.order = itertools.count()

    def at(self, t_s: float, fn: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (t_s, next(self.order), fn))

    def run(self, max_events: int) -> None:
        for _ in range(max_events):
            if not self.events:
                return
            t_s, _, fn = heapq.heappop(self.events)
            fn(t_s)
        raise RuntimeError(f"the serving simulation did not finish within {max_events} events")


def accepted_draws(alpha: float, gamma: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n rounds' accepted counts under i.i.d. acceptance: leading successes of gamma Bernoulli(alpha)."""
    hits = rng.random((n, gamma)) < alpha
    return np.where(hits.all(axis=1), gamma, np.argmin(hits, axis=1))


def simulate_serving(setup: ServingSetup, arrivals: list[OpenLoopRequest], seed: int) -> list[dict]:
    """Every request of one open-loop point, served on virtual time; one row each (Served.row)."""
    sim = _Sim()
    verifier = _Verifier(sim, setup)
    served = []
    for a in arrivals:
        request = Served(a, setup.rtt_ms_per_edge[a.edge % len(setup.rtt_ms_per_edge)])
        served.append(request)
        draws = accepted_draws(setup.alpha, setup.gamma, a.max_tokens, np.random.default_rng([seed, a.index]))
        sim.at(a.arrival_s, _starter(sim, verifier, setup, request, draws))
    sim.run(max_events=50 * sum(a.max_tokens + 4 for a in arrivals) + 1000)
    return [r.row() for r in served]


def _starter(sim: _Sim, verifier: _Verifier, setup: ServingSetup, r: Served, draws: np.ndarray):
    return _RequestEvents(sim, verifier, setup, r, draws).start


class _RequestEvents:
    """One request's events on the virtual clock: its Open, prefill, rounds and Close."""

    def __init__(self, sim: _Sim, verifier: _Verifier, setup: ServingSetup, r: Served, draws: np.ndarray) -> None:
        self.sim, self.verifier, self.setup, self.r, self.draws = sim, verifier, setup, r, draws
        self.one_way_s = r.rtt_ms / 2e3
        self.gamma, self.times = setup.gamma, setup.times
        self.remaining = r.arrival.max_tokens
        self.block_at = math.nan  # sync DSD: when the edge's current block reaches the verifier
        self.session_free_at = math.nan  # when the session's previous job ended (nan: still running)

    def emit(self, t_edge_s: float, n: int) -> None:
        r = self.r
        n = min(n, self.remaining)
        if n <= 0:
            return
        if math.isnan(r.first_token_s):
            r.first_token_s = t_edge_s
        r.last_token_s, r.tokens, r.rounds = t_edge_s, r.tokens + n, r.rounds + 1
        self.remaining -= n

    def close(self, t_server_s: float) -> None:
        # the edge sends Close when the last tokens reach it; the verifier frees the session on arrival
        self.sim.at(t_server_s + 2 * self.one_way_s, lambda _t: self._closed())

    def _closed(self) -> None:
        self.verifier.open_sessions -= 1

    def _server_round(self, t_s: float) -> None:
        self.verifier.submit(
            t_s,
            "draft",
            self.gamma,
            self.r,
            lambda t: self.verifier.submit(t, "verify", self.gamma, self.r, self.on_server_step),
        )

    def on_server_step(self, t_s: float) -> None:  # AR step or co-located round: next job at once
        if self.setup.mode == AR:
            self.emit(t_s + self.one_way_s, 1)
            if self.remaining > 0:
                self.verifier.submit(t_s, AR, 1, self.r, self.on_server_step)
            else:
                self.close(t_s)
            return
        self.emit(t_s + self.one_way_s, int(self.draws[self.r.rounds]) + 1)
        if self.remaining > 0:
            self._server_round(t_s)
        else:
            self.close(t_s)

    def on_verdict(self, t_s: float) -> None:  # sync DSD: the verdict goes back, the edge drafts on
        self.session_free_at = t_s
        edge_s = t_s + self.one_way_s
        self.emit(edge_s, int(self.draws[self.r.rounds]) + 1)
        if self.remaining <= 0:
            self.close(t_s)
            return
        self.send_block(edge_s + self.gamma * self.times.t_draft_edge_s)

    def send_block(self, t_edge_s: float) -> None:
        self.block_at = t_edge_s + self.one_way_s
        self.sim.at(self.block_at, lambda t: self.maybe_verify(t))

    def maybe_verify(self, now_s: float) -> None:
        if math.isnan(self.session_free_at) or math.isnan(self.block_at):
            return  # the other of (block, session free) comes later
        ready_s = max(self.block_at, self.session_free_at)
        self.block_at = self.session_free_at = math.nan
        if ready_s > now_s:
            # the prefill ended before the block reached the verifier: the block joins the queue
            # when it arrives, not now (a job queued early would start before it is there)
            self.sim.at(ready_s, lambda t: self.verifier.submit(t, "verify", self.gamma, self.r, self.on_verdict))
        else:
            self.verifier.submit(ready_s, "verify", self.gamma, self.r, self.on_verdict)

    def after_prefill(self, t_s: float) -> None:
        if self.setup.mode == SYNC:
            self.session_free_at = t_s
            self.maybe_verify(t_s)
        elif self.setup.mode == AR:
            self.verifier.submit(t_s, AR, 1, self.r, self.on_server_step)
        else:
            self._server_round(t_s)

    def open_arrives(self, t_s: float) -> None:
        if self.verifier.open_sessions >= self.setup.max_sessions:
            self.r.refused = REFUSED_MAX_SESSIONS  # the edge hears so one link delay later; no tokens
            return
        self.verifier.open_sessions += 1
        self.verifier.submit(t_s, "prefill", self.setup.prompt_tokens, self.r, self.after_prefill)

    def start(self, t_s: float) -> None:
        self.sim.at(t_s + self.one_way_s, self.open_arrives)
        if self.setup.mode == SYNC:  # the edge drafts at once, not waiting for Opened
            self.send_block(t_s + self.gamma * self.times.t_draft_edge_s)
