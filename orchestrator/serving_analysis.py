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

from dsd import latency_model as lm
from dsd.modes import AR, COLOCATED, SYNC
from dsd.times import ComputeTimes
from orchestrator.load import SloConfig

PERCENTILES = (50, 90, 99)


def add_slo(requests: pd.DataFrame, slo: SloConfig | None) -> pd.DataFrame:
    """requests with ``slo_met`` (empty without an SLO; false for a refused request)."""
    requests = requests.copy()
    if slo is None:
        requests["slo_met"] = pd.NA
        return requests
    requests["slo_met"] = [bool(admitted) and slo.met(ttft, tpot, e2e) and math.isfinite(e2e)
                           for admitted, ttft, tpot, e2e in zip(requests["admitted"].astype(bool), requests["ttft_s"],
                                                                requests["tpot_s"], requests["e2e_s"])]
    return requests


def point_figures(requests: pd.DataFrame) -> dict:
    """One point's figures from its request rows (with slo_met)."""
    measured = requests[~requests["warmup"].astype(bool)]
    served = measured[measured["admitted"].astype(bool) & measured["e2e_s"].notna()]
    good = served[served["slo_met"] == True]  # noqa: E712 - a column of True/False/NA
    out = {"requests_measured": len(measured), "requests_served": len(served),
           "requests_refused": int((~measured["admitted"].astype(bool)).sum()), "requests_good": len(good)}
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
    return out


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
    pooled per rate), with a 95% CI by parametric bootstrap: each rate's good count redrawn as
    binomial(measured, attainment), the crossing found again, the 2.5th and 97.5th percentiles
    taken (a redraw where even the smallest rate misses counts as that rate, one that never
    falls below the level as the largest)."""
    by_rate = points.groupby("rate_rps")[["requests_good", "requests_measured"]].sum().reset_index()
    rates = by_rate["rate_rps"].to_numpy(dtype=float)
    good, n = by_rate["requests_good"].to_numpy(), by_rate["requests_measured"].to_numpy()
    attainment = np.where(n > 0, good / np.maximum(n, 1), 0.0)
    rate = crossing_rate(rates, attainment, level)
    rng = np.random.default_rng(seed)
    draws = rng.binomial(np.maximum(n, 1), attainment, size=(n_boot, len(n))) / np.maximum(n, 1)
    crossings = [crossing_rate(rates, row, level) for row in draws] if len(rates) else []
    crossings = np.array([c if math.isfinite(c) else rates.min() for c in crossings])
    low, high = np.percentile(crossings, [2.5, 97.5]) if len(crossings) else (math.nan, math.nan)
    return {"max_rate_rps": rate, "max_rate_ci_low_rps": float(low), "max_rate_ci_high_rps": float(high),
            "censored": bool(len(rates) and attainment[np.argmax(rates)] >= level),
            "attainment_at_max": _attainment_near(rates, attainment, rate)}


def _attainment_near(rates: np.ndarray, attainment: np.ndarray, rate: float) -> float:
    """The measured attainment at the evaluated rate nearest the crossing (the rate search puts
    one there)."""
    if not len(rates) or not math.isfinite(rate):
        return math.nan
    return float(attainment[int(np.argmin(np.abs(rates - rate)))])


def next_search_rate(points: pd.DataFrame, level: float, max_rate_rps: float = 10_000.0) -> float | None:
    """Bisection on attainment: the midpoint between the largest rate that met the level and the
    smallest larger rate that did not; double past the largest if none failed, halve below the
    smallest if none met. None once both sides are within 2% of each other."""
    by_rate = points.groupby("rate_rps")[["requests_good", "requests_measured"]].sum()
    att = (by_rate["requests_good"] / by_rate["requests_measured"].clip(lower=1)).sort_index()
    meeting = att[att >= level]
    if meeting.empty:
        return float(att.index.min()) / 2
    low = float(meeting.index.max())
    failing = att[(att.index > low) & (att < level)]
    if failing.empty:
        return min(2 * low, max_rate_rps)
    high = float(failing.index.min())
    return None if (high - low) <= 0.02 * low else (low + high) / 2


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
            round_s, emitted = t.t_ar_s + g + wait_s, 1.0
            ttft_s = rtt_s + prefill_s + t.t_ar_s + g
        elif mode == COLOCATED:
            round_s = gamma * t.t_draft_server_s + t.t_verify_s(gamma) + 2 * (g + wait_s)
            emitted = lm.expected_tokens_per_round(self.alpha, gamma)
            ttft_s = rtt_s + prefill_s + round_s - wait_s
        else:
            drafting_s = gamma * t.t_draft_edge_s
            round_s = drafting_s + rtt_s + t.t_verify_s(gamma) + g + wait_s
            emitted = lm.expected_tokens_per_round(self.alpha, gamma)
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
        var_rounds = 0.0 if mode == AR else self.tokens * _tokens_per_round_var(self.alpha, self.gamma) / \
            lm.expected_tokens_per_round(self.alpha, self.gamma) ** 3
        passes_per_round = 2 if mode == COLOCATED else 1
        var_s2 = round_s ** 2 * var_rounds + max(rounds - 1, 1) * passes_per_round * wait_s ** 2
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
                p = _normal_cdf((slo.tpot_ms / 1e3 - tpot_s) / sd_s) if sd_s > 0 else float(tpot_s * 1e3 <= slo.tpot_ms)
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
        return lm.bisect_increasing(lambda r: -self.attainment(mode, r, slo), -slo.attainment, 1e-9 * hi, hi,
                                    tol=1e-6 * hi)


def _tokens_per_round_var(alpha: float, gamma: int) -> float:
    """Variance of the tokens a round emits (accepted + 1, accepted truncated geometric)."""
    probs = [alpha ** j * (1 - alpha) for j in range(gamma)] + [alpha ** gamma]
    mean = sum((j + 1) * p for j, p in enumerate(probs))
    return sum((j + 1 - mean) ** 2 * p for j, p in enumerate(probs))


def _normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def expected_rounds(alpha: float, gamma: int, tokens: int) -> float:
    """Expected rounds until a request has emitted ``tokens``, each round emitting accepted + 1
    (accepted truncated geometric): N(l) = 1 + sum_k P(k) N(l - k), N(l <= 0) = 0."""
    probs = [alpha ** j * (1 - alpha) for j in range(gamma)] + [alpha ** gamma]   # P(k = j + 1)
    n = [0.0] * (tokens + 1)
    for left in range(1, tokens + 1):
        n[left] = 1.0 + sum(p * n[max(left - (j + 1), 0)] for j, p in enumerate(probs))
    return n[tokens]
