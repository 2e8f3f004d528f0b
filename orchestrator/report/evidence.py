"""The report's sections on how far to trust its numbers: the out-of-sample headline, the 95%
intervals, and the points that ran under CPU contention."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pandas as pd

from orchestrator.report.render import number_cell


def evidence_sections(summary: dict) -> list[tuple[str, list]]:
    """The out-of-sample headline, crossovers with their 95% intervals, and what the
    intervals are (orchestrator/analysis/predictions.py, orchestrator/analysis/bootstrap.py)."""
    oos = summary.get("out_of_sample")
    if not oos:
        return []
    return [_headline_section(summary, oos), _intervals_section(summary)]


def _headline_section(summary: dict, oos: dict) -> tuple[str, list]:
    insample = summary.get("in_sample", {})
    if oos.get("available"):
        head = (
            f"Out of sample: per-token latency error p50 {number_cell(oos['latency_err_p50_pct'])}%, max "
            f"{number_cell(oos['latency_err_max_pct'])}% over {oos['cells']} cells; worst located crossover "
            f"{number_cell(oos['crossover_err_max_pct'])}% off. In sample (labelled as such: fitted from the "
            f"rounds it is compared with): p50 {number_cell(insample.get('latency_err_p50_pct'))}%, max "
            f"{number_cell(insample.get('latency_err_max_pct'))}%."
        )
        method = (
            "Calibrate, then predict, then measure: the first repeat of AR, co-located SD and synchronous "
            f"DSD at the smallest RTT ({', '.join(oos['calibration_points'])}) ran first on this testbed and "
            "link backend; t_ar, t_verify, t_draft (edge and server), the harness's per-round overhead and "
            "alpha were fitted from those rounds alone, and every other point's per-token latency and the "
            "crossovers were written to predictions.csv (with the time) before any of them ran. The error "
            "below compares each cell's median over its non-calibration repeats with that prediction; "
            "calibration points are excluded."
        )
    else:
        head = (
            "No out-of-sample figure: this sweep has no predictions.csv (a sweep writes it "
            "before the first non-calibration point). Only the in-sample fit below is available."
        )
        method = ""
    rows = [
        [
            label,
            name.replace("_", " "),
            c.get("text", number_cell(c["measured_rtt_ms"])),
            number_cell(c.get("predicted_rtt_ms_oos", math.nan)),
            number_cell(c.get("oos_err_pct", math.nan)),
        ]
        for label, name, c in group_crossovers(summary)
    ]
    blocks = [("text", head)] + ([("text", method)] if method else [])
    blocks.append(
        ("table", ["group", "crossover", "measured [95% CI] ", "predicted before measuring (ms)", "error (%)"], rows)
    )
    return ("Headline: predicted before measuring, out of sample", blocks)


def _intervals_section(summary: dict) -> tuple[str, list]:
    boot = summary.get("bootstrap", {})
    cells = summary.get("latency_cells", [])
    return (
        "Confidence intervals",
        [
            (
                "text",
                f"95% percentile bootstrap, {boot.get('replicates')} replicates, fixed seed {boot.get('seed')}. "
                "Each replicate draws the repeats with replacement (one draw for every mode, since repeat r "
                "of every mode ran together and a slow phase of the shared machine touches them alike) and the "
                "request indices with replacement (one draw for every point: request i is the same prompt in "
                "every mode, RTT and repeat, so its own speed is shared), and recomputes the per-point medians, "
                "the median over repeats and the crossings. Repeat-to-repeat drift is the larger noise on a "
                "shared machine, which a bootstrap over requests alone would hide; with one repeat the interval "
                "is over requests only and says nothing about drift. A crossover whose interval reaches both "
                "ends of the RTT grid is reported as undetermined, not as a number.",
            ),
            (
                "table",
                [
                    "mode",
                    "RTT (ms)",
                    "gamma",
                    "clients",
                    "per-token (ms)",
                    "95% CI (ms)",
                    "predicted oos (ms)",
                    "error oos (%)",
                ],
                [
                    [
                        c["mode"],
                        number_cell(c["rtt_ms"]),
                        str(c["gamma"]),
                        str(c["clients"]),
                        number_cell(c["per_token_ms"], 3),
                        f"{number_cell(c['ci_low'], 3)} .. {number_cell(c['ci_high'], 3)}",
                        number_cell(c.get("per_token_ms_predicted_oos"), 3),
                        number_cell(c.get("err_oos_pct")),
                    ]
                    for c in cells
                ],
            ),
        ],
    )


def cpu_sections(summary: dict, points: pd.DataFrame) -> list[tuple[str, list]]:
    """How the processes were placed on the CPUs, and which points ran under contention."""
    cpu = summary.get("cpu")
    if not cpu:
        return []
    pinning = cpu["pinning"]
    sets = pinning.get("sets", {})
    text = (
        f"CPU pinning: {'on' if pinning.get('pinned') else 'off'}"
        f"{' (disjoint sets)' if pinning.get('disjoint') else ''}: {pinning.get('reason', '')}. "
        f"{cpu['points_contended']} of {cpu['points_recorded']} points ran under contention "
        f"({cpu['contended_when']}); they are flagged in the points table (column contended) and their "
        "numbers deserve less trust: on a shared machine other work can stretch any round."
    )
    blocks = [("text", text)]
    if sets:
        blocks.append(("table", ["process", "CPUs"], [[role, ", ".join(map(str, c))] for role, c in sets.items()]))
    return [("CPU isolation and contention", blocks)]


def group_crossovers(summary: dict) -> Iterator[tuple[str, str, dict]]:
    """(the group's label, the crossover's name, its summary entry) for every group's crossovers."""
    for group in summary["groups"]:
        label = ", ".join(f"{k}={group[k]}" for k in summary.get("group_keys", [])) or "all points"
        for name, crossover in group["crossovers"].items():
            yield label, name, crossover
