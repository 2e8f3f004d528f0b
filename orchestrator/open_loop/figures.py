"""Serving figures from per-request rows (pure): SLO attainment, goodput, latency percentiles,
the largest rate each mode sustains at the attainment level with a 95% CI, and its prediction.

Words: a request is *measured* unless it arrived during the warm-up; *served* if admitted and it
produced its answer; *good* if served and it met every bound of the SLO. Attainment is good over
measured (a refused request counts against it), throughput and goodput are served and good
requests per second over the measured span (first measured arrival to the last measured answer).
TPOT is (last token - first token) / (tokens - 1), TTFT from the request's arrival at its edge.

The prediction (docs/serving.md writes it out): a request's server work S per mode from the pass
times; utilisation rho = rate * S; each job waits W for the device, M/D/1 for sync DSD (its jobs
arrive after drafting and a round trip, a stream close to Poisson) and processor sharing for the
server's own modes (cloud AR, co-located: each session always has its next job waiting), so
W = rho t / (2 (1 - rho)) or rho t / (1 - rho) for the mean pass t; each edge's TPOT is its
round's critical path plus W per pass, over the tokens a round emits, spread by the variance of
the round count and of the waits (taken as normal) for sync DSD, and under processor sharing its
alone value times 1 + N, N the other sessions open during its life (geometric, P(N >= n) =
rho^n); its TTFT is the request's
one-off path plus two waits (the prefill's, the first pass's) whose tail is taken as M/M/1's,
P(W > x) = rho exp(-x / w) with w set so that the mean is right. The predicted attainment at a
rate is the edges' probability of meeting the SLO, weighted by their share of arrivals, and the
predicted largest rate is where it crosses the level (bisection).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dsd.analytic import latency_model as lm
from dsd.modes import AR, COLOCATED, SYNC
from dsd.costs.compute_times import ComputeTimes
from netem.distributions import normal_cdf
from orchestrator.spec.arrivals import SloConfig

PERCENTILES = (50, 90, 99)
GROWTH_BATCHES = 4  # the stationarity check: batches of a point's requests, in arrival order
MIN_PER_BATCH = 5
GROWTH_FACTOR = 1.5  # the last batch's mean of requests in the system at least this times the first's
GROWTH_FLOOR = 1.0  # ... and this many requests above it
SEARCH_TOLERANCE = 0.02  # the rate search stops at a rate this close to the attainment level
SEARCH_RESOLUTION = 0.01  # ... or once its bracket is this narrow (relative to its low end)


def add_slo(requests: pd.DataFrame, slo: SloConfig | None) -> pd.DataFrame:
    """requests with ``slo_met`` (empty without an SLO; false for a refused request)."""
    requests = requests.copy()
    if slo is None:
        requests["slo_met"] = pd.NA
        return requests
    requests["slo_met"] = [
        bool(admitted) and slo.met(ttft, tpot, e2e) and math.isfinite(e2e)
        for admitted, ttft, tpot, e2e in zip(
            requests["admitted"].astype(bool), requests["ttft_s"], requests["tpot_s"], requests["e2e_s"]
        )
    ]
    return requests


def point_figures(requests: pd.DataFrame) -> dict:
    """One point's figures from its request rows (with slo_met)."""
    measured = requests[~requests["warmup"].astype(bool)]
    served = measured[measured["admitted"].astype(bool) & measured["e2e_s"].notna()]
    good = served[served["slo_met"] == True]  # noqa: E712 - a column of True/False/NA
    out = {
        "requests_measured": len(measured),
        "requests_served": len(served),
        "requests_refused": int((~measured["admitted"].astype(bool)).sum()),
        "requests_good": len(good),
    }
    if len(served):
        start_s = float(measured["arrival_s"].min())
        end_s = float((served["arrival_s"] + served["e2e_s"]).max())
        span_s = max(end_s - start_s, 1e-9)
    else:
        span_s = math.nan
    out["span_s"] = span_s
    out["throughput_rps"] = len(served) / span_s if len(served) else 0.0
    out["goodput_rps"] = len(good) / span_s if len(served) else 0.0
    out["tokens_per_s"] = float(served["tokens"].sum()) / span_s if len(served) else 0.0
    out["attainment"] = len(good) / len(measured) if len(measured) else math.nan
    for column in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        values = served[column].dropna().to_numpy(dtype=float)
        for q in PERCENTILES:
            out[f"{column[:-2]}_p{q}_ms"] = float(np.percentile(values, q)) * 1e3 if len(values) else math.nan
    seen = in_system_at(
        requests["arrival_s"].to_numpy(dtype=float),
        (requests["arrival_s"] + requests["e2e_s"]).to_numpy(dtype=float),
        np.sort(measured["arrival_s"].to_numpy(dtype=float)),
    )
    out["in_system_growth"] = queue_growth(seen)
    out["queue_growing"] = queue_growing(seen)
    return out


def in_system_at(arrival_s: np.ndarray, end_s: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """How many requests are in the system (arrived before, not yet answered) at each time of
    ``at_s``; a request without an end (refused, failed) never entered it."""
    entered = np.isfinite(end_s)
    starts, ends = np.sort(arrival_s[entered]), np.sort(end_s[entered])
    return np.searchsorted(starts, at_s, side="left") - np.searchsorted(ends, at_s, side="right")


def batch_means(values: np.ndarray, batches: int = GROWTH_BATCHES) -> np.ndarray:
    """Means of ``batches`` consecutive, equal-count slices of ``values`` (empty if too few)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) < MIN_PER_BATCH * batches:
        return np.array([])
    return np.array([chunk.mean() for chunk in np.array_split(values, batches)])


def queue_growth(in_system: np.ndarray) -> float:
    """The last batch's mean of the requests in the system at arrivals over the first's (in order
    of arrival; nan when there are too few arrivals to batch or the first batch found it empty)."""
    means = batch_means(in_system)
    return float(means[-1] / means[0]) if len(means) and means[0] > 0 else math.nan


def queue_growing(in_system: np.ndarray, factor: float = GROWTH_FACTOR, floor: float = GROWTH_FLOOR) -> bool:
    """The stationarity check: is the queue still building at the run's end? ``in_system`` is the
    number of requests in the system each measured arrival found, in order of arrival. True when
    its means over consecutive batches rise through every batch and the last is at least
    ``factor`` times the first and ``floor`` requests above it. A stationary series whose batches
    are long enough to be independent rises through all four by chance 1/4! (4%); a queue still
    relaxing from empty towards its steady state, or past saturation, rises through all of them."""
    means = batch_means(in_system)
    if not len(means):
        return False
    return bool(np.all(np.diff(means) > 0) and means[-1] >= factor * means[0] and means[-1] - means[0] >= floor)


def wilson_interval(good: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% for z = 1.96)."""
    if n == 0:
        return 0.0, 1.0
    p = good / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def crossing_rate(rates: np.ndarray, attainment: np.ndarray, level: float) -> float:
    """The largest rate at which attainment is still at the level, interpolated between the last
    rate at or above it and the first below it after it (attainment falls with the rate); the
    largest rate if none falls below (a lower bound), nan if even the smallest misses it."""
    order = np.argsort(rates)
    r, a = np.asarray(rates, dtype=float)[order], np.asarray(attainment, dtype=float)[order]
    if not len(r) or not a[0] >= level:
        return math.nan
    for i in range(1, len(r)):
        if a[i] < level:
            return float(r[i - 1] + (r[i] - r[i - 1]) * (a[i - 1] - level) / (a[i - 1] - a[i]))
    return float(r[-1])


def max_rate(points: pd.DataFrame, level: float, n_boot: int = 400, seed: int = 0) -> dict:
    """One mode's largest sustainable rate at the attainment level, from its points (repeats
    pooled per rate), with a 95% CI by bootstrap: the repeats (independent arrival realisations,
    each shared by every rate) redrawn with replacement, then each rate's good count redrawn as
    binomial(measured, attainment), the crossing found again, the 2.5th and 97.5th percentiles
    taken (a redraw where even the smallest rate misses counts as that rate, one that never falls
    below the level as the largest). With one repeat the interval is the binomial noise of a
    finite number of requests alone, given that run's arrivals."""
    good, n, rates = _by_rate_and_repeat(points)
    pooled_good, pooled_n = good.sum(axis=1), n.sum(axis=1)
    attainment = np.where(pooled_n > 0, pooled_good / np.maximum(pooled_n, 1), 0.0)
    rate = crossing_rate(rates, attainment, level)
    rng = np.random.default_rng(seed)
    crossings = []
    for _ in range(n_boot if len(rates) else 0):
        pick = rng.integers(0, good.shape[1], good.shape[1])
        g, m = good[:, pick].sum(axis=1), np.maximum(n[:, pick].sum(axis=1), 1)
        drawn = rng.binomial(m, np.minimum(g / m, 1.0)) / m
        crossings.append(crossing_rate(rates, drawn, level))
    crossings = np.array([c if math.isfinite(c) else rates.min() for c in crossings])
    low, high = np.percentile(crossings, [2.5, 97.5]) if len(crossings) else (math.nan, math.nan)
    return {
        "max_rate_rps": rate,
        "max_rate_ci_low_rps": float(low),
        "max_rate_ci_high_rps": float(high),
        "censored": bool(len(rates) and attainment[np.argmax(rates)] >= level),
        **_attainment_near(rates, pooled_good, pooled_n, rate),
        "repeats": int(good.shape[1]),
    }


def per_repeat_max_rates(points: pd.DataFrame, level: float) -> np.ndarray:
    """Each repeat's own largest rate at the level (its arrival realisation alone, not pooled):
    how far one run's figure scatters."""
    good, n, rates = _by_rate_and_repeat(points)
    return np.array(
        [
            crossing_rate(rates[n[:, k] > 0], good[n[:, k] > 0, k] / n[n[:, k] > 0, k], level)
            for k in range(good.shape[1])
        ]
    )


def _by_rate_and_repeat(points: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(good, measured) as rates x repeats arrays (0 where a repeat did not run a rate), and the rates."""
    frame = points.assign(repeat=points["repeat"] if "repeat" in points else 0)
    table = frame.pivot_table(
        index="rate_rps", columns="repeat", values=["requests_good", "requests_measured"], aggfunc="sum", fill_value=0
    )
    return (
        table["requests_good"].to_numpy(dtype=int),
        table["requests_measured"].to_numpy(dtype=int),
        table.index.to_numpy(dtype=float),
    )


def _attainment_near(rates: np.ndarray, good: np.ndarray, measured: np.ndarray, rate: float) -> dict:
    """The attainment measured at the evaluated rate nearest the crossing (the rate search puts
    one there), that rate, the requests pooled there and their Wilson 95% interval."""
    if not len(rates) or not math.isfinite(rate):
        return {
            "attainment_at_max": math.nan,
            "attainment_rate_rps": math.nan,
            "attainment_requests": 0,
            "attainment_ci_low": math.nan,
            "attainment_ci_high": math.nan,
        }
    i = int(np.argmin(np.abs(rates - rate)))
    low, high = wilson_interval(int(good[i]), int(measured[i]))
    return {
        "attainment_at_max": float(good[i] / max(measured[i], 1)),
        "attainment_rate_rps": float(rates[i]),
        "attainment_requests": int(measured[i]),
        "attainment_ci_low": low,
        "attainment_ci_high": high,
    }


def next_search_rate(
    points: pd.DataFrame,
    level: float,
    max_rate_rps: float = 10_000.0,
    tolerance: float = SEARCH_TOLERANCE,
    resolution: float = SEARCH_RESOLUTION,
    open_step: float = 1.0,
) -> float | None:
    """The rate search on attainment (repeats pooled per rate): the next rate lies between the
    largest rate that met the level and the smallest larger rate that did not, at their
    interpolated crossing, kept a tenth of the bracket in from either end so that a lopsided
    bracket still narrows; while no bracket is open, ``1 + open_step`` times past the largest
    rate if none failed, or that much below the smallest if none met (1: double and halve, for a
    coarse grid; a few percent when the first rate is a close prediction). None once either end's
    attainment is within ``tolerance`` of the level (the rate reported has been run, and its
    attainment is the level's within the tolerance) or the bracket is narrower than
    ``resolution`` times its low end."""
    by_rate = points.groupby("rate_rps")[["requests_good", "requests_measured"]].sum()
    att = (by_rate["requests_good"] / by_rate["requests_measured"].clip(lower=1)).sort_index()
    meeting = att[att >= level]
    if meeting.empty:
        return float(att.index.min()) / (1 + open_step)
    low = float(meeting.index.max())
    failing = att[(att.index > low) & (att < level)]
    if failing.empty:
        return min((1 + open_step) * low, max_rate_rps)
    high = float(failing.index.min())
    a_low, a_high = float(att[low]), float(att[high])
    if a_low - level <= tolerance or level - a_high <= tolerance or high <= low * (1 + resolution) + 1e-12:
        return None
    crossing = low + (high - low) * (a_low - level) / (a_low - a_high)
    margin = 0.1 * (high - low)
    return min(max(crossing, low + margin), high - margin)


# ---- the prediction ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingModel:
    """What the prediction needs: the pass times, gamma, alpha, tokens per answer, the prompt,
    each edge's RTT and share of arrivals, the harness's idle gap per pass."""

    times: ComputeTimes
    gamma: int
    alpha: float
    tokens: int
    prompt_tokens: int
    rtt_ms_per_edge: tuple[float, ...]
    share_per_edge: tuple[float, ...]
    gap_s: float = 0.0

    def rounds(self, mode: str) -> float:
        """Expected rounds to emit the answer: exact for i.i.d. acceptance (the last round is cut
        at the answer's end, so slightly more than tokens / E)."""
        return self.tokens if mode == AR else expected_rounds(self.alpha, self.gamma, self.tokens)

    def passes(self, mode: str) -> tuple[float, float]:
        """(server passes per request after the prefill, mean pass time)."""
        t = self.times
        if mode == AR:
            return self.tokens, t.t_ar_s
        if mode == COLOCATED:
            return 2 * self.rounds(mode), (self.gamma * t.t_draft_server_s + t.t_verify_s(self.gamma)) / 2
        return self.rounds(mode), t.t_verify_s(self.gamma)

    def server_s(self, mode: str) -> float:
        """A request's work on the device: the prefill and its passes, each with the idle gap."""
        n, t = self.passes(mode)
        return self.times.t_prefill_s(self.prompt_tokens) + n * t + (n + 1) * self.gap_s

    def saturation_rps(self, mode: str) -> float:
        return 1.0 / self.server_s(mode)

    def wait_s(self, mode: str, rate_rps: float) -> float:
        """Mean wait of a pass for the device (inf at or past saturation)."""
        rho = rate_rps * self.server_s(mode)
        if rho >= 1:
            return math.inf
        _, t = self.passes(mode)
        return rho * t / (2 * (1 - rho)) if mode == SYNC else rho * t / (1 - rho)

    def edge_latency_s(self, mode: str, rtt_s: float, wait_s: float) -> tuple[float, float, float]:
        """(TTFT without the two first waits, TPOT, e2e) of one edge's request, mean values."""
        t, g, gamma = self.times, self.gap_s, self.gamma
        prefill_s = t.t_prefill_s(self.prompt_tokens) + g
        one_way_s = rtt_s / 2
        if mode == AR:
            round_s = t.t_ar_s + g + wait_s
            ttft_s = rtt_s + prefill_s + t.t_ar_s + g
        elif mode == COLOCATED:
            round_s = gamma * t.t_draft_server_s + t.t_verify_s(gamma) + 2 * (g + wait_s)
            ttft_s = rtt_s + prefill_s + round_s - wait_s
        else:
            drafting_s = gamma * t.t_draft_edge_s
            round_s = drafting_s + rtt_s + t.t_verify_s(gamma) + g + wait_s
            ttft_s = max(one_way_s + prefill_s, drafting_s + one_way_s) + t.t_verify_s(gamma) + g + one_way_s
        rounds = self.rounds(mode)
        tpot_s = round_s * max(rounds - 1, 0) / max(self.tokens - 1, 1)
        e2e_s = ttft_s + 2 * wait_s + tpot_s * (self.tokens - 1)
        return ttft_s, tpot_s, e2e_s

    def tpot_sd_s(self, mode: str, round_s: float, wait_s: float) -> float:
        """The spread of one request's TPOT: its round count varies (a renewal count of rounds of
        E tokens on average, variance L Var(k) / E^3) and its waits average over its rounds (each
        taken as exponential, variance W^2, passes per round of them)."""
        rounds = self.rounds(mode)
        var_rounds = (
            0.0
            if mode == AR
            else self.tokens
            * _tokens_per_round_var(self.alpha, self.gamma)
            / lm.expected_tokens_per_round(self.alpha, self.gamma) ** 3
        )
        passes_per_round = 2 if mode == COLOCATED else 1
        var_s2 = round_s**2 * var_rounds + max(rounds - 1, 1) * passes_per_round * wait_s**2
        return math.sqrt(var_s2) / max(self.tokens - 1, 1)

    def round_s(self, mode: str, rtt_s: float, wait_s: float) -> float:
        """A round's mean time (TPOT times its tokens over the rounds after the first)."""
        _, tpot_s, _ = self.edge_latency_s(mode, rtt_s, wait_s)
        return tpot_s * max(self.tokens - 1, 1) / max(self.rounds(mode) - 1, 1)

    def attainment(self, mode: str, rate_rps: float, slo: SloConfig) -> float:
        """The predicted share of requests that meet the SLO at this rate."""
        wait_s = self.wait_s(mode, rate_rps)
        if not math.isfinite(wait_s):
            return 0.0
        rho = rate_rps * self.server_s(mode)
        total = 0.0
        for rtt_ms, share in zip(self.rtt_ms_per_edge, self.share_per_edge):
            ttft_s, tpot_s, e2e_s = self.edge_latency_s(mode, rtt_ms / 1e3, wait_s)
            if slo.e2e_ms and e2e_s * 1e3 > slo.e2e_ms:
                continue
            p = 1.0
            if slo.tpot_ms and mode == SYNC:
                sd_s = self.tpot_sd_s(mode, self.round_s(mode, rtt_ms / 1e3, wait_s), wait_s)
                p = normal_cdf((slo.tpot_ms / 1e3 - tpot_s) / sd_s) if sd_s > 0 else float(tpot_s * 1e3 <= slo.tpot_ms)
            elif slo.tpot_ms:
                # processor sharing: a request's passes take turns with the N others open during
                # its life, N geometric (P(N >= n) = rho^n), so TPOT = TPOT_alone * (1 + N)
                alone_s = self.edge_latency_s(mode, rtt_ms / 1e3, 0.0)[1]
                p = 1 - rho ** (slo.tpot_ms / 1e3 / alone_s) if alone_s > 0 else 1.0
            if slo.ttft_ms:
                slack_s = slo.ttft_ms / 1e3 - ttft_s
                # two waits before the first token, their sum's tail as one M/M/1 wait of twice the mean
                scale_s = 2 * wait_s * (1 - rho) / rho if rho > 0 else 0.0
                p *= 0.0 if slack_s < 0 else (1.0 if scale_s == 0 else 1 - rho * math.exp(-slack_s / scale_s))
            total += share * p
        return total

    def max_rate_rps(self, mode: str, slo: SloConfig) -> float:
        """The largest rate whose predicted attainment is at the level (0 if none)."""
        hi = self.saturation_rps(mode)
        if self.attainment(mode, 1e-9 * hi, slo) < slo.attainment:
            return 0.0
        return lm.bisect_increasing(
            lambda r: -self.attainment(mode, r, slo), -slo.attainment, 1e-9 * hi, hi, tol=1e-6 * hi
        )


def _tokens_per_round_var(alpha: float, gamma: int) -> float:
    """Variance of the tokens a round emits (accepted + 1, accepted truncated geometric)."""
    probs = [alpha**j * (1 - alpha) for j in range(gamma)] + [alpha**gamma]
    mean = sum((j + 1) * p for j, p in enumerate(probs))
    return sum((j + 1 - mean) ** 2 * p for j, p in enumerate(probs))


def expected_rounds(alpha: float, gamma: int, tokens: int) -> float:
    """Expected rounds until a request has emitted ``tokens``, each round emitting accepted + 1
    (accepted truncated geometric): N(l) = 1 + sum_k P(k) N(l - k), N(l <= 0) = 0."""
    probs = [alpha**j * (1 - alpha) for j in range(gamma)] + [alpha**gamma]  # P(k = j + 1)
    n = [0.0] * (tokens + 1)
    for left in range(1, tokens + 1):
        n[left] = 1.0 + sum(p * n[max(left - (j + 1), 0)] for j, p in enumerate(probs))
    return n[tokens]
