"""The paper's comparisons as tables: per group, the configured setting, the closed form at the
configured alpha and at the measured one (both with the configured compute times: the gap
between them is alpha's alone), and what was measured.

- sync_vs_ar: the largest RTT at which synchronous DSD beats cloud AR (claim 2);
- pipelined_vs_colocated: the RTT below which pipelined DSD keeps up with co-located SD, beside
  the drafting window gamma*t_draft,edge (claim 3);
- cached_vs_colocated: the same for cached pipelined DSD (its closed form needs the measured
  cache hit rate, so the configured times alone give none);
- capacity: clients a saturated server sustains, DSD over co-located, beside
  1 + gamma*t_draft,server/t_verify (claim 4; no alpha in it).

A cell where the closed form says DSD never wins is -inf, and is shown as "never", not as a
(negative) number; +inf measured means DSD won over the whole RTT grid.
"""

from __future__ import annotations

import math

from dsd.analytic import latency_model as lm
from dsd.costs.compute_times import ComputeTimes

NEVER = "never (DSD never wins)"


def closed_form_crossover_ms(name: str, alpha: float, gamma: int, times: ComputeTimes) -> float:
    """The closed form's crossover RTT (ms) at ``alpha``; -inf where DSD never wins."""
    if math.isnan(alpha):
        return math.nan
    t_v = times.t_verify_s(gamma)
    if name == "sync_vs_ar":
        rtt_s = lm.sync_dsd_beats_ar_rtt_s(alpha, gamma, times.t_draft_edge_s, t_v, times.t_ar_s)
        return 1e3 * rtt_s if rtt_s >= 0 else -math.inf
    if name == "pipelined_vs_colocated":
        return 1e3 * lm.pipelined_beats_colocated_rtt_s(alpha, gamma, times.t_draft_edge_s, times.t_draft_server_s, t_v)
    if name == "cached_vs_colocated":  # needs a measured hit rate: none in configured times
        if times.cache_hit_rate is None:
            return math.nan
        return 1e3 * lm.cached_beats_colocated_rtt_s(
            alpha,
            gamma,
            times.t_draft_edge_s,
            times.t_draft_server_s,
            t_v,
            times.cache_hit_rate,
            times.cache_fill_s or 0.0,
        )
    raise ValueError(f"unknown comparison {name!r}")


def setting(times: ComputeTimes, gamma: int) -> dict:
    """The configured compute times of a group, in ms, and the drafting window."""
    return {
        "gamma": gamma,
        "t_draft_edge_ms": 1e3 * times.t_draft_edge_s,
        "t_draft_server_ms": 1e3 * times.t_draft_server_s,
        "t_verify_ms": 1e3 * times.t_verify_s(gamma),
        "t_ar_ms": 1e3 * times.t_ar_s,
        "drafting_window_ms": 1e3 * gamma * times.t_draft_edge_s,
    }


def crossover_rows(groups: list[dict], assumed: dict, gamma: int) -> list[dict]:
    """One row per group and crossover the sweep measured. ``groups``: summary.json's groups
    (profile, alpha_configured, alpha_measured, crossovers); ``assumed``: configured params per profile."""
    rows = []
    for group in groups:
        params = assumed[group["profile"]]
        configured, measured = group.get("alpha_configured", math.nan), group["alpha_measured"]
        for name, c in group["crossovers"].items():
            low, high, kind = _interval_of(c)
            rows.append(
                {
                    "comparison": name,
                    "profile": group["profile"],
                    **setting(params, gamma),
                    "alpha_configured": configured,
                    "alpha_measured": measured,
                    "closed_form_at_configured_alpha_ms": closed_form_crossover_ms(name, configured, gamma, params),
                    "closed_form_at_measured_alpha_ms": closed_form_crossover_ms(name, measured, gamma, params),
                    "measured_ms": c["measured_rtt_ms"],
                    "measured_low_ms": low,
                    "measured_high_ms": high,
                    "interval": kind,
                }
            )
    return rows


def _interval_of(crossover: dict) -> tuple[float, float, str]:
    """The 95% bootstrap interval where the analysis found one (ci_low/ci_high, nan
    where none), else the range over repeats."""
    low, high = crossover.get("ci_low", math.nan), crossover.get("ci_high", math.nan)
    if not (math.isnan(low) or math.isnan(high)):
        return low, high, "95% CI" + (", covers the whole grid" if crossover.get("ci_covers_grid") else "")
    return (
        crossover.get("measured_rtt_ms_min", math.nan),
        crossover.get("measured_rtt_ms_max", math.nan),
        "range over repeats",
    )


def capacity_rows(capacity: list[dict], assumed: dict, gamma_default: int, main_profile: str) -> list[dict]:
    """summary.json's capacity entries with the configured factor beside the measured ratio."""
    rows = []
    for entry in capacity:
        profile = entry.get("profile", main_profile)
        gamma = int(entry.get("gamma", gamma_default))
        params = assumed[profile]
        factor = lm.capacity_factor(gamma, params.t_draft_server_s, params.t_verify_s(gamma))
        rows.append(
            {
                "comparison": "capacity",
                "profile": profile,
                "mode": entry["mode"],
                **setting(params, gamma),
                "td_over_tv": params.t_draft_server_s / params.t_verify_s(gamma),
                "closed_form_configured": factor,
                "closed_form_fitted": entry["ratio_predicted"],
                "measured": entry["ratio_measured"],
                "measured_interval": ratio_interval(entry),
            }
        )
    return rows


def ratio_interval(entry: dict) -> str:
    """A capacity ratio's 95% interval over repeats as text, or why there is none."""
    low, high = entry.get("ratio_ci_low", math.nan), entry.get("ratio_ci_high", math.nan)
    if entry.get("ratio_repeats", 1) < 2:
        return "one repeat: no interval"
    if math.isnan(low) or math.isnan(high):
        return "interval undefined"
    return f"95% CI {low:.2f} .. {high:.2f}, {entry['ratio_repeats']} repeats"


def cell(value: float, digits: int = 1) -> str:
    """A crossover for a table: "never" where DSD never wins, never a negative number."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return NEVER if value < 0 else "wins over the whole grid"
    return f"{value:.{digits}f}"


def interval(low: float, high: float) -> str:
    if any(v is None or math.isnan(v) for v in (low, high)) or (low == high):
        return ""
    return f"{cell(low)} .. {cell(high)}"


def crossover_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, rows of text) for a report."""
    header = [
        "comparison",
        "profile",
        "setting",
        "alpha configured",
        "closed form at configured alpha (ms)",
        "alpha measured",
        "closed form at measured alpha (ms)",
        "measured (ms)",
        "interval (ms)",
    ]
    body = []
    for r in rows:
        what = (
            f"gamma {r['gamma']}, t_draft {r['t_draft_edge_ms']:g} ms, t_verify {r['t_verify_ms']:g} ms, "
            f"t_ar {r['t_ar_ms']:g} ms"
            + (
                f", window gamma*t_draft {r['drafting_window_ms']:g} ms"
                if r["comparison"] == "pipelined_vs_colocated"
                else ""
            )
        )
        body.append(
            [
                r["comparison"].replace("_", " "),
                r["profile"],
                what,
                cell(r["alpha_configured"], 3),
                cell(r["closed_form_at_configured_alpha_ms"]),
                cell(r["alpha_measured"], 3),
                cell(r["closed_form_at_measured_alpha_ms"]),
                cell(r["measured_ms"]),
                (interval(r["measured_low_ms"], r["measured_high_ms"]) + f" ({r['interval']})")
                if interval(r["measured_low_ms"], r["measured_high_ms"])
                else "",
            ]
        )
    return header, body


def capacity_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = [
        "profile",
        "DSD mode",
        "t_draft/t_verify",
        "closed form 1 + gamma*t_d/t_v (configured)",
        "closed form (fitted compute)",
        "measured",
        "interval over repeats",
    ]
    return header, [
        [
            r["profile"],
            r["mode"],
            f"{r['td_over_tv']:.3g}",
            f"{r['closed_form_configured']:.2f}",
            f"{r['closed_form_fitted']:.2f}",
            f"{r['measured']:.2f}",
            r.get("measured_interval", ""),
        ]
        for r in rows
    ]
