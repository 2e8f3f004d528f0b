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
service), is the closed form of dsd.latency_model with t_verify replaced by R:

    sync DSD         cycle(R) = gamma*t_draft_edge + rtt + R
    pipelined DSD    cycle(R) = the pipelined closed form with W = rtt + R: while the edge's drafting
                     window (gamma + 1)*t_draft_edge is longer than W it hides the queue too
    cached DSD       cycle(R) likewise from its closed form
    co-located, AR   cycle(R) = R

so at one client (R = the service) every mode is today's closed form. Per output token: cycle / E
(E(alpha, gamma) tokens a round; 1 for AR).

The recursion over the number of clients n = 1..N is MVA for a load-dependent station (Reiser and
Lavenberg 1980), with p(j | n) the probability that j jobs are at the verifier:

    R(n)     = sum_{j=1..n} j / mu(j) * p(j-1 | n-1)
    X(n)     = n / cycle(R(n))                         (clients' rounds per second, together)
    p(j | n) = X(n) / mu(j) * p(j-1 | n-1),  p(0 | n) = 1 - sum_{j>=1} p(j | n)

with the verifier's completion rate mu(j) = b / t_pass(b), b = min(j, max_batch): a serial server
(mu = 1 / service) gives the textbook R(n) = S * (1 + Q(n-1)); a batching one serves the b
waiting jobs in one pass of t_pass(b) (the batch curve, ``ComputeTimes.t_verify_s(gamma, b)``).

That recursion is exact for exponential service; the testbed's passes are nearly constant. With
``service_cv2`` (the passes' squared coefficient of variation, 0 constant, 1 exponential) the
pass in progress that an arrival waits for is charged its mean residual E[S^2] / (2 E[S]) =
S * (1 + cv2) / 2 instead of a whole S (Reiser's approximation for FCFS with general service):

    serial    R(n) = S * (1 + Q(n-1)) - U(n-1) * S * (1 - cv2) / 2,   Q = X * R,  U = X * S
    batched   the recursion above less (1 - cv2) / 2 * sum_{i >= max_batch} p(i | n-1) / mu(i):
              only an arrival that finds the pass full waits for it

and X(n) is held to the verifier's fastest rate (the cycle at least N / max mu): an arrival
just behind another's completion waits a whole pass, which the residual undercounts (without
a think time the cycle is N * S exactly). cv2 = 1 is the exact recursion.

Approximations, each what it breaks:
- Reiser's residual assumes an arrival sees the pass in progress at a random moment. With
  constant times a closed network runs at the asymptote max(Z + S, N*S) (no waiting until it
  saturates); at two clients the residence is too long by rho^2 / 2 of the cycle (rho =
  S / (S + Z)), at most 1/8 at the knee Z = S (exponential MVA: rho^2, 1/4), so the crossovers
  still come out short of the constant-time asymptote; ``serial_bound_rtt_s`` is that end (the
  issue's first-order bound).
- A pipelined or cached client's cycle is its closed form at the mean residence, not the mean
  over the residence's distribution.
- Batching as a rate b / t_pass(b): an arrival that finds the pass not full joins it rather than
  waiting for it, a pass that starts with fewer jobs than arrive during it is not modelled (the
  scheduler's windows), and co-located drafting batches with the same slope as verification.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from dsd import latency_model as lm
from dsd.modes import AR, CACHED, COLOCATED, CROSSOVERS, EDGE, NOWHERE, PIPELINED, SYNC, get_mode, predict_per_token_s
from dsd.times import ComputeTimes

# The pairs of the RTT x clients map: name -> (mode that wins at low RTT, reference). The references
# run on the server alone, so their per-token time does not depend on the RTT.
FRONTIER_PAIRS: dict[str, tuple[str, str]] = {
    **CROSSOVERS,
    "sync_vs_colocated": (SYNC, COLOCATED),
    "pipelined_vs_ar": (PIPELINED, AR),
    "cached_vs_ar": (CACHED, AR),
}


def mva_residence_s(n_clients: int, pass_s: Callable[[int], float], cycle_s: Callable[[float], float],
                    max_batch: int = 1, service_cv2: float = 0.0) -> float:
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


def _serial_residence_s(n_clients: int, service_s: float, cycle_s: Callable[[float], float],
                        service_cv2: float) -> float:
    """Reiser's recursion: R(n) = S*(1 + Q(n-1)) - U(n-1)*S*(1 - cv2)/2, Q = X*R, U = X*S."""
    queue, busy = 0.0, 0.0                              # Q(0), U(0)
    residence_s = service_s
    for n in range(1, n_clients + 1):
        residence_s = service_s * (1 + queue) - busy * service_s * (1 - service_cv2) / 2
        residence_s = _within_the_servers_rate(residence_s, n, 1 / service_s, cycle_s)
        throughput = n / cycle_s(residence_s)
        queue, busy = throughput * residence_s, throughput * service_s
    return residence_s


def _batched_residence_s(n_clients: int, pass_s: Callable[[int], float], cycle_s: Callable[[float], float],
                         max_batch: int, service_cv2: float) -> float:
    """The load-dependent recursion, p(j | n) the chance that j jobs are at the verifier. An
    arrival that finds i >= max_batch jobs there waits, and the completion in progress (1/mu(i))
    is charged its residual (1 + cv2)/2 of it instead of all of it; one that finds fewer joins
    the pass as the rate b / t_pass(b) has it, and waits for nothing."""
    mu = [math.nan] + [min(j, max_batch) / pass_s(min(j, max_batch)) for j in range(1, n_clients + 1)]
    p_prev = [1.0]                                      # p(j | 0): nobody at the verifier
    residence_s = pass_s(1)
    for n in range(1, n_clients + 1):
        residence_s = (sum(j / mu[j] * p_prev[j - 1] for j in range(1, n + 1))
                       - (1 - service_cv2) / 2 * sum(p_prev[i] / mu[i] for i in range(max_batch, n)))
        residence_s = _within_the_servers_rate(residence_s, n, max(mu[1:n + 1]), cycle_s)
        throughput = n / cycle_s(residence_s)
        busy = [throughput / mu[j] * p_prev[j - 1] for j in range(1, n + 1)]
        # 1 - sum loses digits near saturation, and the residual correction can take the sum past
        # 1; a probability is never below 0.
        scale = max(1.0, sum(busy))
        p_prev = [max(1.0 - sum(busy), 0.0)] + [b / scale for b in busy]
    return residence_s


def _within_the_servers_rate(residence_s: float, n_clients: int, max_rate: float,
                             cycle_s: Callable[[float], float]) -> float:
    """The residence raised, if need be, until the clients' rounds (n / cycle) are no faster than
    the verifier's fastest rate: with constant times the residual correction underestimates the
    wait of a client that arrives as another's pass starts (no think time: cycle = N*S exactly)."""
    floor_s = n_clients / max_rate
    if cycle_s(residence_s) >= floor_s:
        return residence_s
    return lm.bisect_increasing(cycle_s, floor_s, residence_s, max(floor_s, residence_s), tol=1e-12)


def per_token_s(mode: str, n_clients: int, alpha: float, gamma: int, rtt_s: float, times: ComputeTimes,
                max_batch: int = 1, service_cv2: float = 0.0) -> float:
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
        return gamma * times.t_draft_server_s * (verify_s / terms["t_verify_s"]) + verify_s

    def cycle_s(residence_s: float) -> float:
        if m.drafts != EDGE:
            return residence_s
        return tokens * predict_per_token_s(mode, alpha, gamma, rtt_s, **{**terms, "t_verify_s": residence_s})

    return cycle_s(mva_residence_s(n_clients, pass_s, cycle_s, max_batch, service_cv2)) / tokens


def crossover_rtt_s(name: str, n_clients: int, alpha: float, gamma: int, times: ComputeTimes,
                    max_batch: int = 1, service_cv2: float = 0.0) -> float:
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
    return lm.bisect_increasing(mode_s, level_s, 0.0, 2 * level_s * lm.expected_tokens_per_round(alpha, gamma),
                                tol=1e-7)


def serial_bound_rtt_s(n_clients: int, gamma: int, t_draft_edge_s: float, t_draft_server_s: float,
                       t_verify_s: float) -> float:
    """The first-order bound for DSD against co-located SD on a serial server, constant times and
    the DSD client never waiting: N*(t_verify + gamma*t_draft_server) - t_verify - gamma*t_draft_edge."""
    return n_clients * (t_verify_s + gamma * t_draft_server_s) - t_verify_s - gamma * t_draft_edge_s


def predicted_frontier(client_counts, alpha: float, gamma: int, times: ComputeTimes,
                       max_batch: int = 1, service_cv2: float = 0.0) -> list[dict]:
    """Rows (clients, pair, predicted_ms, bound_ms) for every pair and client count; bound_ms is
    ``serial_bound_rtt_s`` for the pairs against co-located SD, nan for the others."""
    rows = []
    for n in sorted({int(c) for c in client_counts}):
        for name, (_, reference) in FRONTIER_PAIRS.items():
            bound_s = (serial_bound_rtt_s(n, gamma, times.t_draft_edge_s, times.t_draft_server_s,
                                          times.t_verify_s(gamma)) if reference == COLOCATED else math.nan)
            rows.append({"clients": n, "pair": name,
                         "predicted_ms": 1e3 * crossover_rtt_s(name, n, alpha, gamma, times, max_batch,
                                                               service_cv2),
                         "bound_ms": 1e3 * bound_s})
    return rows


def _check_whole(name: str, value) -> None:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
