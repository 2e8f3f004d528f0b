"""N clients sharing one verifier: mean-value analysis (MVA) of a closed network (docs/concepts.md,
"Many clients on one server").

Each client is one customer that cycles between two stations:

    the delay station   what the client's round holds besides the server (its edge's drafting, the
                        round trip); no queueing
    the verifier        one job per round, served one after another (``max_batch`` = 1) or up to
                        ``max_batch`` in one pass

A job's service is one pass of the server: t_verify for a DSD round, gamma*t_draft_server + t_verify
for a co-located round (the server drafts too, and the round trip is not in the steady state), t_ar
for a cloud AR token. A client's cycle, given R, its mean residence at the verifier (queueing plus
service), is the closed form of dsd.analytic.latency_model with t_verify replaced by R:

    sync DSD         cycle(R) = gamma*t_draft_edge + rtt + R
    pipelined DSD    cycle(R) = the pipelined closed form with W = rtt + R: while the edge's drafting
                     window (gamma + 1)*t_draft_edge is longer than W it hides the queue too
    cached DSD       cycle(R) likewise from its closed form
    co-located, AR   cycle(R) = R

so at one client (R = the service) every mode is today's closed form. Per output token: cycle / E
(E(alpha, gamma) tokens a round; 1 for AR).

The recursion over the number of clients n = 1..N is mean-value analysis: an arriving client sees
the verifier as the other n - 1 leave it (the arrival theorem), and the residence follows from
what it finds there. On a serial server (``max_batch`` = 1, service S) that is the textbook
R(n) = S * (1 + Q(n-1)), Q = X * R, X(n) = n / cycle(R(n)) (clients' rounds per second,
together).

That recursion is exact for exponential service; the testbed's passes are nearly constant. With
``service_cv2`` (the passes' squared coefficient of variation, 0 constant, 1 exponential) the
pass in progress that an arrival waits for is charged its mean residual E[S^2] / (2 E[S]) =
S * (1 + cv2) / 2 instead of a whole S (Reiser's approximation for FCFS with general service):

    R(n) = S * (1 + Q(n-1)) - U(n-1) * S * (1 - cv2) / 2,   U = X * S

A batching server works as services/verifier/scheduler.py does: a pass takes the jobs waiting at its start
(up to ``max_batch``, t_pass(b) the batch curve ``ComputeTimes.t_verify_s(gamma, b)``) and admits
nobody once it runs. With U(n-1) the chance the verifier is busy, b_r the pass in progress and q
the jobs queued behind it (means given busy, seen with n - 1 clients), an arrival

    finds it idle:  starts a pass of its own, t_pass(1)
    finds it busy:  waits the residual (1 + cv2)/2 * t_pass(b_r), then the full passes of those
                    queued ahead, max(0, q + 1 - max_batch) / max_batch of them (a mean), then
                    its own pass with the rest of the queue and the clients that arrive while it
                    waits (up to max_batch)

and the same means for n clients follow from X(n): jobs in service X * (its pass), queued X *
(the rest of R), busy X * (its share of its pass, t_pass(b) / b). With max_batch = 1 that is
Reiser's recursion above. A client without a delay station (co-located SD, AR) comes back as its
pass ends, when the next starts with it: no residual, and its clients go round at the server's
fastest rate.

X(n) is held to that rate (the cycle at least N * t_pass(b) / b, b = min(N, max_batch)): an
arrival just behind another's completion waits a whole pass, which the residual undercounts
(without a think time the cycle is N * S exactly on a serial server).

Approximations, each what it breaks:
- Reiser's residual assumes an arrival sees the pass in progress at a random moment. With
  constant times a closed network runs at the asymptote max(Z + S, N*S) (no waiting until it
  saturates); at two clients the residence is too long by rho^2 / 2 of the cycle (rho =
  S / (S + Z)), at most 1/8 at the knee Z = S (exponential MVA: rho^2, 1/4), so the crossovers
  still come out short of the constant-time asymptote; ``serial_bound_rtt_s`` is that end (the
  issue's first-order bound).
- On a batching server, constant times make clients that once waited for the same pass go
  together from then on (dsd.simulation.many_clients' clients fall into step); the random arrival
  does not know it, so the model has them wait residuals they do not and pay smaller passes
  than they do.
- Means throughout: the pass in progress, the queue and the late arrivals are their means, and
  a pass's cost is the batch curve at the mean size.
- A pipelined or cached client's cycle is its closed form at the mean residence, not the mean
  over the residence's distribution.
- Co-located drafting batches with the same slope as verification, and a pass that waits for a
  batch to fill (the scheduler's windows) is not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from dsd.analytic import latency_model as lm
from dsd.modes import AR, CACHED, COLOCATED, CROSSOVERS, EDGE, NOWHERE, PIPELINED, SYNC, get_mode, predict_per_token_s
from dsd.costs.compute_times import ComputeTimes

# The pairs of the RTT x clients map: name -> (mode that wins at low RTT, reference). The references
# run on the server alone, so their per-token time does not depend on the RTT.
FRONTIER_PAIRS: dict[str, tuple[str, str]] = {
    **CROSSOVERS,
    "sync_vs_colocated": (SYNC, COLOCATED),
    "pipelined_vs_ar": (PIPELINED, AR),
    "cached_vs_ar": (CACHED, AR),
}


def mva_residence_s(
    n_clients: int,
    pass_s: Callable[[int], float],
    cycle_s: Callable[[float], float],
    max_batch: int = 1,
    service_cv2: float = 0.0,
) -> float:
    """R(N): a client's mean residence at the verifier (queueing and service) with n_clients in
    the closed network. pass_s(b): one pass of b jobs; cycle_s(R): a client's cycle given R;
    service_cv2: the passes' squared coefficient of variation (0 constant, 1 exponential)."""
    _check_whole("n_clients", n_clients)
    _check_whole("max_batch", max_batch)
    if not pass_s(1) > 0:
        raise ValueError(f"a pass of one job must take > 0 s, got {pass_s(1)!r}")
    if not (isinstance(service_cv2, (int, float)) and 0 <= service_cv2 < math.inf):
        raise ValueError(f"service_cv2 must be a finite number >= 0, got {service_cv2!r}")
    if max_batch == 1:
        return _serial_residence_s(n_clients, pass_s(1), cycle_s, service_cv2)
    return _batched_residence_s(n_clients, pass_s, cycle_s, max_batch, service_cv2)


def _serial_residence_s(
    n_clients: int, service_s: float, cycle_s: Callable[[float], float], service_cv2: float
) -> float:
    """Reiser's recursion: R(n) = S*(1 + Q(n-1)) - U(n-1)*S*(1 - cv2)/2, Q = X*R, U = X*S."""
    queue, busy = 0.0, 0.0  # Q(0), U(0)
    residence_s = service_s
    for n in range(1, n_clients + 1):
        residence_s = service_s * (1 + queue) - busy * service_s * (1 - service_cv2) / 2
        residence_s = _within_the_servers_rate(residence_s, n, 1 / service_s, cycle_s)
        throughput = n / cycle_s(residence_s)
        queue, busy = throughput * residence_s, throughput * service_s
    return residence_s


def _batched_residence_s(
    n_clients: int,
    pass_s: Callable[[int], float],
    cycle_s: Callable[[float], float],
    max_batch: int,
    service_cv2: float,
) -> float:
    """Mean-value recursion for a verifier that batches as services/verifier/scheduler.py does: a pass
    takes the jobs waiting at its start (up to max_batch) and nobody joins it once it runs. An
    arrival that finds the verifier idle starts a pass of one; one that finds it busy (U, seen
    with n - 1 clients) waits the residual of the running pass, (1 + cv2)/2 of it, then any full
    passes of those queued ahead of it, then its own pass with the rest of them and the clients
    that arrive while it waits. Means throughout; with max_batch = 1 it is Reiser's recursion."""
    busy, in_service, waiting, throughput = 0.0, 0.0, 0.0, 0.0  # U, jobs in service, queued, X of n - 1
    residence_s = pass_s(1)
    if cycle_s(0.0) <= 0:
        # No delay station (co-located SD, AR): a job comes back as its pass ends, when the next
        # pass starts with it and all that wait; the clients go round in passes of max_batch at
        # the server's fastest rate.
        return _within_the_servers_rate(
            residence_s, n_clients, max(b / pass_s(b) for b in range(1, min(n_clients, max_batch) + 1)), cycle_s
        )
    for n in range(1, n_clients + 1):
        if busy > 0:
            running, ahead = in_service / busy, waiting / busy  # given busy: the pass, the queue
            outside = max(0.0, n - 1 - running - ahead)  # the others not at the verifier
        else:
            running, ahead, outside = 1.0, 0.0, 0.0
        full_before = max(0.0, ahead + 1 - max_batch) / max_batch  # full passes ahead of its own
        wait_s = (1 + service_cv2) / 2 * _pass_at_s(pass_s, running, max_batch) + full_before * pass_s(max_batch)
        late = min(throughput * wait_s, outside)  # arrive before its pass starts
        own = min(float(max_batch), ahead + 1 - full_before * max_batch + late)
        own_s = _pass_at_s(pass_s, own, max_batch)
        residence_s = (1 - busy) * pass_s(1) + busy * (wait_s + own_s)
        rate = max(b / pass_s(b) for b in range(1, min(n, max_batch) + 1))
        residence_s = _within_the_servers_rate(residence_s, n, rate, cycle_s)
        throughput = n / cycle_s(residence_s)
        service_s = (1 - busy) * pass_s(1) + busy * own_s
        busy_share_s = (1 - busy) * pass_s(1) + busy * own_s / own  # a job's share of its pass
        busy, in_service = min(1.0, throughput * busy_share_s), throughput * service_s
        waiting = throughput * max(residence_s - service_s, 0.0)
    return residence_s


def _pass_at_s(pass_s: Callable[[int], float], batch: float, max_batch: int) -> float:
    """A pass of a mean batch size: the batch curve between the whole sizes around it."""
    batch = min(max(batch, 1.0), float(max_batch))
    low = math.floor(batch)
    if low == batch:
        return pass_s(low)
    return pass_s(low) + (batch - low) * (pass_s(low + 1) - pass_s(low))


def _within_the_servers_rate(
    residence_s: float, n_clients: int, max_rate: float, cycle_s: Callable[[float], float]
) -> float:
    """The residence raised, if need be, until the clients' rounds (n / cycle) are no faster than
    the verifier's fastest rate: with constant times the residual correction underestimates the
    wait of a client that arrives as another's pass starts (no think time: cycle = N*S exactly)."""
    floor_s = n_clients / max_rate
    if cycle_s(residence_s) >= floor_s:
        return residence_s
    return lm.bisect_increasing(cycle_s, floor_s, residence_s, max(floor_s, residence_s), tol=1e-12)


def per_token_s(
    mode: str,
    n_clients: int,
    alpha: float,
    gamma: int,
    rtt_s: float,
    times: ComputeTimes,
    max_batch: int = 1,
    service_cv2: float = 0.0,
) -> float:
    """Seconds per output token of one of n_clients clients in this mode (the module docstring)."""
    m = get_mode(mode)
    tokens = lm.expected_tokens_per_round(alpha, gamma) if m.speculative else 1.0
    terms = times.closed_form_terms(gamma)

    def pass_s(batch: int) -> float:
        if m.drafts == NOWHERE:
            return times.t_ar_batch_s(batch)
        verify_s = times.t_verify_s(gamma, batch)
        if m.drafts == EDGE:
            return verify_s
        return gamma * times.t_draft_server_s * (verify_s / times.t_verify_s(gamma)) + verify_s

    def cycle_s(residence_s: float) -> float:
        if m.drafts != EDGE:
            return residence_s
        return tokens * predict_per_token_s(mode, alpha, gamma, rtt_s, **{**terms, "t_verify_s": residence_s})

    return cycle_s(mva_residence_s(n_clients, pass_s, cycle_s, max_batch, service_cv2)) / tokens


def crossover_rtt_s(
    name: str,
    n_clients: int,
    alpha: float,
    gamma: int,
    times: ComputeTimes,
    max_batch: int = 1,
    service_cv2: float = 0.0,
) -> float:
    """RTT*(N) of a FRONTIER_PAIRS pair: the largest RTT at which the mode is at least as fast per
    token as its reference with n_clients clients; -inf if even rtt = 0 loses. nan for the cached
    mode without a hit rate."""
    mode, reference = FRONTIER_PAIRS[name]
    if get_mode(reference).drafts == EDGE:
        raise ValueError(f"{name}: the reference must run on the server (its time does not depend on the RTT)")
    if get_mode(mode).cache and times.cache_hit_rate is None:
        return math.nan
    level_s = per_token_s(reference, n_clients, alpha, gamma, 0.0, times, max_batch, service_cv2)

    def mode_s(rtt_s: float) -> float:
        return per_token_s(mode, n_clients, alpha, gamma, rtt_s, times, max_batch, service_cv2)

    if mode_s(0.0) > level_s:
        return -math.inf
    # A cycle holds the round trip, so at rtt = 2 * level * E the mode has certainly lost.
    return lm.bisect_increasing(
        mode_s, level_s, 0.0, 2 * level_s * lm.expected_tokens_per_round(alpha, gamma), tol=1e-7
    )


def serial_bound_rtt_s(
    n_clients: int, gamma: int, t_draft_edge_s: float, t_draft_server_s: float, t_verify_s: float
) -> float:
    """The first-order bound for DSD against co-located SD on a serial server, constant times and
    the DSD client never waiting: N*(t_verify + gamma*t_draft_server) - t_verify - gamma*t_draft_edge."""
    return n_clients * (t_verify_s + gamma * t_draft_server_s) - t_verify_s - gamma * t_draft_edge_s


def predicted_frontier(
    client_counts: Iterable[int],
    alpha: float,
    gamma: int,
    times: ComputeTimes,
    max_batch: int = 1,
    service_cv2: float = 0.0,
) -> list[dict[str, Any]]:
    """Rows (clients, pair, predicted_ms, bound_ms) for every pair and client count; bound_ms is
    ``serial_bound_rtt_s`` for the pairs against co-located SD, nan for the others."""
    rows = []
    for n in sorted({int(c) for c in client_counts}):
        for name, (_, reference) in FRONTIER_PAIRS.items():
            bound_s = (
                serial_bound_rtt_s(n, gamma, times.t_draft_edge_s, times.t_draft_server_s, times.t_verify_s(gamma))
                if reference == COLOCATED
                else math.nan
            )
            rows.append(
                {
                    "clients": n,
                    "pair": name,
                    "predicted_ms": 1e3 * crossover_rtt_s(name, n, alpha, gamma, times, max_batch, service_cv2),
                    "bound_ms": 1e3 * bound_s,
                }
            )
    return rows


def _check_whole(name: str, value: float) -> None:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
