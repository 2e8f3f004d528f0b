"""The compute regime a run is in, stated before its first point: what the hardware allows.

Speculation pays only where a verification pass over gamma + 1 positions costs about one decode
step and a draft step a small share of one. From the measured times (``ComputeTimes``) this
module gives, per gamma, the two ratios, the acceptance rate at which synchronous DSD breaks even
with cloud AR at RTT 0, and the RTT below which it wins at a given alpha (the closed form of
docs/concepts.md); ``no_win`` is true where neither synchronous nor pipelined DSD beats cloud AR
at any RTT, so a user knows that their hardware, not the testbed, decides. (Cached pipelined DSD
is left out: its closed form needs the cache's hit rate, which only a run measures.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dsd.analytic import latency_model as lm
from dsd.modes import PIPELINED, SYNC, predict_per_token_s
from dsd.costs.compute_times import ComputeTimes


@dataclass(frozen=True)
class GammaRegime:
    gamma: int
    verify_over_ar: float
    break_even_alpha: float  # sync DSD = cloud AR at RTT 0; inf: no alpha reaches it
    sync_wins_below_rtt_ms: float | None  # at the given alpha; None: alpha unknown; -inf: never
    best_dsd_over_ar_at_rtt0: float | None  # the fastest DSD mode's time per token over t_ar, RTT 0


@dataclass(frozen=True)
class Regime:
    dtype: str
    draft_dtype: str
    t_ar_ms: float
    draft_over_ar: float
    alpha: float | None
    alpha_source: str
    gammas: tuple[GammaRegime, ...]

    @property
    def no_win(self) -> bool:
        """No DSD mode beats cloud AR at any RTT (at the known alpha, or for any draft at all)."""
        if self.alpha is None:
            return all(math.isinf(g.break_even_alpha) for g in self.gammas)
        return all(ratio is not None and ratio >= 1.0 for ratio in (g.best_dsd_over_ar_at_rtt0 for g in self.gammas))

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "draft_dtype": self.draft_dtype,
            "t_ar_ms": round(self.t_ar_ms, 3),
            "draft_over_ar": round(self.draft_over_ar, 4),
            "alpha": self.alpha,
            "alpha_source": self.alpha_source,
            "no_win": self.no_win,
            "by_gamma": {
                str(g.gamma): {
                    "verify_over_ar": round(g.verify_over_ar, 4),
                    "break_even_alpha": _finite_or_none(g.break_even_alpha, 4),
                    "sync_wins_below_rtt_ms": _finite_or_none(g.sync_wins_below_rtt_ms, 2),
                    "best_dsd_over_ar_at_rtt0": _finite_or_none(g.best_dsd_over_ar_at_rtt0, 4),
                }
                for g in self.gammas
            },
        }

    def lines(self) -> list[str]:
        """What the run prints before its first point: one line per gamma, and the warning."""
        precision = self.dtype if self.draft_dtype == self.dtype else f"target {self.dtype}, draft {self.draft_dtype}"
        alpha = f"alpha {self.alpha:.3f} ({self.alpha_source})" if self.alpha is not None else "alpha unknown"
        out = []
        for g in self.gammas:
            parts = [
                f"regime: {precision}, t_ar {self.t_ar_ms:.1f} ms, gamma {g.gamma}: "
                f"t_verify/t_ar {g.verify_over_ar:.2f}, t_draft/t_ar {self.draft_over_ar:.2f}",
                "sync DSD breaks even with cloud AR at RTT 0 from alpha "
                + ("> 1 (never)" if math.isinf(g.break_even_alpha) else f"{g.break_even_alpha:.2f}"),
            ]
            if g.sync_wins_below_rtt_ms is not None:
                parts.append(
                    f"at {alpha} it wins below RTT "
                    + ("0 (never)" if g.sync_wins_below_rtt_ms <= 0 else f"{g.sync_wins_below_rtt_ms:.0f} ms")
                )
            out.append("; ".join(parts))
        if self.no_win:
            out.append(
                "WARNING: on this hardware no DSD mode can beat cloud AR at any RTT "
                + (f"at {alpha}" if self.alpha is not None else "with any draft")
                + ": the compute regime, not the network, decides this run"
            )
        return out


def regime(
    times: ComputeTimes,
    gammas: tuple[int, ...],
    dtype: str,
    draft_dtype: str,
    alpha: float | None = None,
    alpha_source: str = "",
) -> Regime:
    """The regime of ``times`` (the edge's draft step as the one that matters for DSD)."""
    if alpha is not None and not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0, 1), got {alpha!r}")
    per_gamma = []
    for gamma in sorted(set(gammas)):
        t_v = times.t_verify_s(gamma)
        round_s = gamma * times.t_draft_edge_s + t_v  # a sync round's compute at RTT 0
        per_gamma.append(
            GammaRegime(
                gamma,
                t_v / times.t_ar_s,
                _break_even_alpha(round_s / times.t_ar_s, gamma),
                None
                if alpha is None
                else 1e3 * lm.sync_dsd_beats_ar_rtt_s(alpha, gamma, times.t_draft_edge_s, t_v, times.t_ar_s),
                None
                if alpha is None
                else min(_per_token_s(mode, alpha, gamma, times) for mode in (SYNC, PIPELINED)) / times.t_ar_s,
            )
        )
    return Regime(
        dtype,
        draft_dtype,
        1e3 * times.t_ar_s,
        times.t_draft_edge_s / times.t_ar_s,
        alpha,
        alpha_source,
        tuple(per_gamma),
    )


def _per_token_s(mode: str, alpha: float, gamma: int, times: ComputeTimes) -> float:
    return predict_per_token_s(
        mode,
        alpha,
        gamma,
        0.0,
        t_ar_s=times.t_ar_s,
        t_draft_edge_s=times.t_draft_edge_s,
        t_draft_server_s=times.t_draft_server_s,
        t_verify_s=times.t_verify_s(gamma),
    )


def _break_even_alpha(round_over_ar: float, gamma: int) -> float:
    """The alpha where E(alpha, gamma) = round / t_ar; inf where even E = gamma + 1 falls short."""
    if round_over_ar <= 1.0:
        return 0.0
    if round_over_ar >= gamma + 1:
        return math.inf
    return lm.bisect_increasing(lambda a: lm.expected_tokens_per_round(a, gamma), round_over_ar, 0.0, 1.0)


def _finite_or_none(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)
