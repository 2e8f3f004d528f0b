"""The closed-form latency model of speculative decoding at a distance (docs/concepts.md).

Pure functions, seconds everywhere. Per-output-token times are steady state: a request's one-off
costs (first round trip, prefill) are not in them.

Pipelined DSD here is the protocol of ``dsd.drive.edge_decoder.EdgeDecoder`` with one block in flight:
the edge sends a block after drafting its gamma tokens, then at once drafts a guess g of the
bonus token and the next block on the assumption that the whole block and g will be accepted.
The speculation survives a verdict with probability pi = alpha^(gamma+1) (gamma accepted and
the bonus equal to g). Cycles start at sends, so with W = rtt + t_verify:

    survives: next send after max((gamma+1)*t_draft, W)      (the round trip is hidden if W is shorter)
    fails:    next send after R + gamma*t_draft              (redraft from the corrected prefix)

where R is when the edge notices the verdict: W itself if the edge was idle by then
(W >= (gamma+1)*t_draft), otherwise the end of the draft step in progress, ceil(W/t_draft)*t_draft
(a forward pass is not interrupted). Every verdict emits accepted+1 tokens, E(alpha, gamma) on
average, so

    T_pipe = (pi*max((gamma+1)*t_draft, W) + (1-pi)*(R + gamma*t_draft)) / E

This is exact for constant times and one block in flight; ``dsd.simulation.one_client`` runs the real
protocol code on virtual time for everything else (several blocks in flight, real models) and the
tests check the two against each other.

Cached pipelined DSD (``dsd.cache.speculation_cache``) keeps one block in flight and, while it is verified,
drafts next blocks for the likely verdicts (the fill, ``fill_s`` of device time: a step for the
distribution after the block, then gamma batched passes over the branches). A verdict among them
(probability h, the cache's hit rate) lets the next block go out at once, otherwise the edge
drafts it from the corrected prefix:

    hit:  next send after max(W, fill_s)
    miss: next send after R + gamma*t_draft

where R is when the edge notices the verdict: W if the fill is done by then, else the end of the
fill's pass in progress (a pass is not interrupted), taken as W plus one pass of the fill's
gamma + 1, fill_s / (gamma + 1), and never after the fill's end. So

    T_cache = (h*max(W, fill_s) + (1-h)*(R + gamma*t_draft)) / E

so with the fill inside the wait it beats co-located SD below rtt* = gamma*t_draft_server -
(1-h)*gamma*t_draft_edge: the paper's drafting window gamma*t_draft as h -> 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def _check_alpha_gamma(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    if int(gamma) != gamma or gamma < 1:
        raise ValueError(f"gamma must be a whole number >= 1, got {gamma!r}")


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha): accepted + 1, on average."""
    _check_alpha_gamma(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def tokens_per_round_by_step(alpha_by_step: list[float]) -> float:
    """Accepted + 1 on average when a round's k-th draft is accepted with probability alpha_k once
    the ones before it were (a feature draft's acceptance falls with its step):
    1 + sum_k prod_{i<=k} alpha_i, which is E(alpha, gamma) when every alpha_k is alpha."""
    total, run = 1.0, 1.0
    for alpha in alpha_by_step:
        run *= alpha
        total += run
    return total


def alpha_for_tokens_per_round(tokens_per_round: float, gamma: int) -> float:
    """The alpha whose E(alpha, gamma) is tokens_per_round (bisection): the one per-token alpha of
    a draft whose acceptance differs by step, the figure the closed form takes; 0 below one token
    a round and 1 above gamma + 1 (a measured mean a rounding off either end)."""
    _check_alpha_gamma(0.0, gamma)
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tokens_per_round(mid, gamma) < tokens_per_round else (low, mid)
    return (low + high) / 2


def expected_accepted_per_round(alpha: float, gamma: int) -> float:
    """Accepted drafts per round, on average: E(alpha, gamma) - 1."""
    return expected_tokens_per_round(alpha, gamma) - 1.0


def survival_probability(alpha: float, gamma: int) -> float:
    """Pipelined DSD: all gamma drafts accepted and the bonus guess right."""
    _check_alpha_gamma(alpha, gamma)
    return alpha ** (gamma + 1)


def per_token_colocated_s(alpha: float, gamma: int, t_draft_server_s: float, t_verify_s: float) -> float:
    return (gamma * t_draft_server_s + t_verify_s) / expected_tokens_per_round(alpha, gamma)


def per_token_sync_dsd_s(alpha: float, gamma: int, t_draft_edge_s: float, t_verify_s: float, rtt_s: float) -> float:
    return (gamma * t_draft_edge_s + rtt_s + t_verify_s) / expected_tokens_per_round(alpha, gamma)


def per_token_pipelined_dsd_s(
    alpha: float, gamma: int, t_draft_edge_s: float, t_verify_s: float, rtt_s: float
) -> float:
    pi = survival_probability(alpha, gamma)
    wait_s = rtt_s + t_verify_s
    drafting_s = (gamma + 1) * t_draft_edge_s
    survive_cycle_s = max(drafting_s, wait_s)
    if wait_s >= drafting_s or t_draft_edge_s <= 0:
        notice_s = wait_s
    else:
        notice_s = math.ceil(wait_s / t_draft_edge_s - 1e-9) * t_draft_edge_s
    fail_cycle_s = notice_s + gamma * t_draft_edge_s
    cycle_s = pi * survive_cycle_s + (1.0 - pi) * fail_cycle_s
    return cycle_s / expected_tokens_per_round(alpha, gamma)


def per_token_cached_dsd_s(
    alpha: float,
    gamma: int,
    t_draft_edge_s: float,
    t_verify_s: float,
    rtt_s: float,
    hit_rate: float,
    fill_s: float = 0.0,
) -> float:
    if not 0.0 <= hit_rate <= 1.0:
        raise ValueError(f"hit_rate must be in [0, 1], got {hit_rate!r}")
    wait_s = rtt_s + t_verify_s
    notice_s = wait_s if fill_s <= wait_s else min(fill_s, wait_s + fill_s / (gamma + 1))
    cycle_s = hit_rate * max(wait_s, fill_s) + (1.0 - hit_rate) * (notice_s + gamma * t_draft_edge_s)
    return cycle_s / expected_tokens_per_round(alpha, gamma)


def cached_beats_colocated_rtt_s(
    alpha: float,
    gamma: int,
    t_draft_edge_s: float,
    t_draft_server_s: float,
    t_verify_s: float,
    hit_rate: float,
    fill_s: float = 0.0,
) -> float:
    """The RTT below which cached pipelined DSD is at least as fast as co-located SD; -inf if
    even rtt = 0 loses (T_cache is non-decreasing in the RTT: bisection)."""
    target_s = per_token_colocated_s(alpha, gamma, t_draft_server_s, t_verify_s)

    def t_cache(rtt_s: float) -> float:
        return per_token_cached_dsd_s(alpha, gamma, t_draft_edge_s, t_verify_s, rtt_s, hit_rate, fill_s)

    if t_cache(0.0) > target_s:
        return -math.inf
    return bisect_increasing(t_cache, target_s, 0.0, target_s * expected_tokens_per_round(alpha, gamma))


def colocated_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. theorem 3.8: speedup of co-located SD over AR, c = t_draft / t_verify."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1.0)


def sync_dsd_beats_ar_rtt_s(alpha: float, gamma: int, t_draft_edge_s: float, t_verify_s: float, t_ar_s: float) -> float:
    """The RTT below which synchronous DSD is faster per token than cloud AR.

    From T_sync = t_ar: rtt* = t_ar*E - gamma*t_draft - t_verify; with t_verify = t_ar this is
    docs/concepts.md's t_ar*(E-1) - gamma*t_draft. Negative means DSD never wins.
    """
    e = expected_tokens_per_round(alpha, gamma)
    return t_ar_s * e - gamma * t_draft_edge_s - t_verify_s


def pipelined_beats_colocated_rtt_s(
    alpha: float, gamma: int, t_draft_edge_s: float, t_draft_server_s: float, t_verify_s: float
) -> float:
    """The RTT below which pipelined DSD is at least as fast as co-located SD.

    T_pipe is non-decreasing in the RTT (with steps where R rounds up to a draft step), so the
    crossing is found by bisection. Returns -inf if even rtt = 0 loses.
    """
    target_s = per_token_colocated_s(alpha, gamma, t_draft_server_s, t_verify_s)
    return pipelined_within_rtt_s(alpha, gamma, t_draft_edge_s, t_verify_s, target_s)


def pipelined_beats_ar_rtt_s(
    alpha: float, gamma: int, t_draft_edge_s: float, t_verify_s: float, t_ar_s: float
) -> float:
    """The RTT below which pipelined DSD is at least as fast as cloud AR; -inf if even rtt = 0 loses."""
    return pipelined_within_rtt_s(alpha, gamma, t_draft_edge_s, t_verify_s, t_ar_s)


def pipelined_within_rtt_s(
    alpha: float, gamma: int, t_draft_edge_s: float, t_verify_s: float, target_s: float
) -> float:
    """The largest RTT at which pipelined DSD takes at most target_s per token (by bisection:
    T_pipe is non-decreasing in the RTT); -inf if even rtt = 0 takes longer."""

    def t_pipe(rtt_s: float) -> float:
        return per_token_pipelined_dsd_s(alpha, gamma, t_draft_edge_s, t_verify_s, rtt_s)

    if t_pipe(0.0) > target_s:
        return -math.inf
    # T_pipe >= W / E, so at rtt = target * E it has certainly lost.
    return bisect_increasing(t_pipe, target_s, 0.0, target_s * expected_tokens_per_round(alpha, gamma))


def bisect_increasing(f: Callable[[float], float], level: float, lo: float, hi: float, tol: float = 1e-9) -> float:
    """The largest x in [lo, hi] with f(x) <= level, for a non-decreasing f with f(lo) <= level."""
    for _ in range(200):
        if hi - lo <= tol:
            break
        mid = (lo + hi) / 2
        if f(mid) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def capacity_factor(gamma: int, t_draft_s: float, t_verify_s: float, gap_s: float = 0.0) -> float:
    """N_dsd / N_co = 1 + (gamma*t_draft + g)/(t_verify + g): clients a saturated serial server
    sustains, DSD over co-located. g is the device's idle gap between two passes (the serving
    harness's hand-off from one pass to the next); g = 0 is docs/concepts.md claim 4,
    1 + gamma*t_draft/t_verify. The ratio of ``serial_capacity``'s two counts."""
    if t_verify_s <= 0:
        raise ValueError(f"t_verify_s must be > 0, got {t_verify_s!r}")
    if gap_s < 0:
        raise ValueError(f"gap_s must be >= 0, got {gap_s!r}")
    return 1.0 + (gamma * t_draft_s + gap_s) / (t_verify_s + gap_s)


def serial_round_s(
    n_clients: float,
    gamma: int,
    t_draft_server_s: float,
    t_verify_s: float,
    gap_s: float = 0.0,
    colocated: bool = False,
) -> float:
    """A saturated serial server's round (one sequence per pass): every client's passes one after
    another, each followed by the idle gap g: N * (t_v + g) for DSD, N * (gamma*t_d + t_v + 2g)
    co-located (a draft pass and a verification pass per client)."""
    if colocated:
        return n_clients * (gamma * t_draft_server_s + t_verify_s + 2 * gap_s)
    return n_clients * (t_verify_s + gap_s)


def serial_capacity(
    tokens_per_round: float,
    rate_tok_s: float,
    gamma: int,
    t_draft_server_s: float,
    t_verify_s: float,
    gap_s: float = 0.0,
) -> tuple[float, float]:
    """(N_dsd, N_co) of a saturated serial server at a per-client token rate: serial_round_s = E / r."""
    if rate_tok_s <= 0 or t_verify_s <= 0:
        raise ValueError(f"rate_tok_s and t_verify_s must be > 0, got {rate_tok_s!r}, {t_verify_s!r}")
    round_s = tokens_per_round / rate_tok_s
    return round_s / (t_verify_s + gap_s), round_s / (gamma * t_draft_server_s + t_verify_s + 2 * gap_s)


def batched_round_s(
    n_clients: float,
    gamma: int,
    t_draft_server_s: float,
    t_verify_s: float,
    batch_slope: float,
    draft_slope: float = 1.0,
    gap_s: float = 0.0,
    colocated: bool = False,
) -> float:
    """A saturated batching server's round for one client (``batched_capacity`` explains it): two
    alternating groups, so two verification passes, t_v * (2 + s * (N - 2)), and co-located also
    two draft passes, gamma * t_d * (2 + s_d * (N - 2)); every pass followed by the idle gap g.
    One client alone: its own passes, t_v + g (+ gamma * t_d + g co-located)."""
    if n_clients <= 1:
        return t_verify_s + gap_s + ((gamma * t_draft_server_s + gap_s) if colocated else 0.0)
    verify_s = t_verify_s * (2 + batch_slope * (n_clients - 2)) + 2 * gap_s
    if not colocated:
        return verify_s
    return verify_s + gamma * t_draft_server_s * (2 + draft_slope * (n_clients - 2)) + 2 * gap_s


def batched_capacity(
    tokens_per_round: float,
    rate_tok_s: float,
    gamma: int,
    t_draft_server_s: float,
    t_verify_s: float,
    batch_slope: float,
    draft_slope: float = 1.0,
    gap_s: float = 0.0,
) -> tuple[float, float]:
    """(N_dsd, N_co): clients a saturated batching server sustains at a per-client token rate,
    with t_v(b) = t_verify_s * (1 + s * (b - 1)) for b verifications in one pass, and a draft
    step of b co-located sessions in one pass t_d(b) = t_draft_server_s * (1 + s_d * (b - 1))
    (s_d = 1: drafting one session after another).

    The server (services.verifier.scheduler) is work-conserving: as soon as a pass ends it starts the next
    with every job of one kind waiting then. The clients a pass served are not among them (a DSD
    client drafts its next block on its edge; a co-located client's next job is submitted only
    once its answer is back, after the next pass was picked), so saturated clients fall into two
    groups whose passes alternate, and every client round holds two verification passes,
    t_v(a) + t_v(N - a) = t_v * (2 + s * (N - 2)) whatever the split a. A DSD edge drafts
    during the other group's pass (assumed to fit under it, gamma * t_d,edge <= t_v(N - a): else
    the server idles and N_dsd is overestimated, so the edge's draft time plays no part); a
    co-located round also holds each group's draft pass, gamma batched draft steps. Every pass is
    followed by the device's idle gap g (the harness's hand-off to the next pass):

        DSD:         round = t_v * (2 + s * (N - 2)) + 2g
        co-located:  round = gamma * t_d * (2 + s_d * (N - 2)) + t_v * (2 + s * (N - 2)) + 4g

    Setting E / round = r and solving for N (R = E / r):
        N_dsd = 2 + ((R - 2g) / t_v - 2) / s
        N_co  = 2 + (R - 4g - 2 * (gamma * t_d + t_v)) / (gamma * t_d * s_d + t_v * s)
    (s_d = 1, g = 0 is this model before batched drafting: N_co = (R - 2 t_v (1 - s)) / (gamma t_d + s t_v).)
    N_dsd is infinite for s = 0 (batching free: only the edge's own round bounds the rate)."""
    if rate_tok_s <= 0 or t_verify_s <= 0:
        raise ValueError(f"rate_tok_s and t_verify_s must be > 0, got {rate_tok_s!r}, {t_verify_s!r}")
    if gap_s < 0:
        raise ValueError(f"gap_s must be >= 0, got {gap_s!r}")
    round_s = tokens_per_round / rate_tok_s
    s = batch_slope
    n_dsd = 2 + ((round_s - 2 * gap_s) / t_verify_s - 2) / s if s > 0 else math.inf
    n_co = 2 + (
        (round_s - 4 * gap_s - 2 * (gamma * t_draft_server_s + t_verify_s))
        / (gamma * t_draft_server_s * draft_slope + t_verify_s * s)
    )
    return n_dsd, n_co
