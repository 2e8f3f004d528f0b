"""`dsdbed report`: one self-contained file per sweep folder, for a reader who was not there.

HTML embeds the plots as base64 PNGs (the file can be mailed alone); Markdown links the PNGs
beside it. Both are built from the same sections: what ran and where, fitted against assumed
parameters, crossovers measured against predicted, the gain window and capacity where the
sweep has them, the points table and the plots. The numbers come from summary.json and
points.csv (written by `dsdbed analyze`, run here first if they are missing).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from orchestrator.report.evidence import cpu_sections, evidence_sections, group_crossovers
from orchestrator.report.findings import (
    FRONTIER_PLOTS,
    capacity_sections,
    category_sections,
    frontier_sections,
    gain_window_sections,
    gamma_opt_sections,
    paper_sections,
)
from orchestrator.report.render import number_cell, render_html, render_markdown

FORMATS = ("html", "md")
POINT_COLUMNS = [
    "profile",
    "alpha",
    "mode",
    "rtt_configured_ms",
    "rtt_measured_ms",
    "rtt_link_measured_ms",
    "gamma",
    "clients",
    "repeat",
    "alpha_configured",
    "alpha_measured",
    "t_draft_ms_measured",
    "t_verify_ms_measured",
    "server_compute_ms_p50",
    "per_token_ms_mean",
    "per_token_ms_p50",
    "per_token_ms_ci_low",
    "per_token_ms_ci_high",
    "per_token_ms_p99",
    "calibration",
    "per_token_ms_predicted_oos",
    "latency_err_oos_pct",
    "per_token_ms_predicted",
    "per_token_ms_predicted_compute_only",
    "per_token_ms_predicted_at_configured_alpha",
    "latency_err_pct",
    "contended",
    "load_avg_1m",
    "cpu_steal_pct",
    "speedup_vs_ar",
    "throughput_tok_s",
    "tok_s_per_client",
    "tok_s_per_client_overlap",
]
HOST_FACTS = ["git_commit", "git_dirty", "started_utc", "cpu", "platform", "cpus", "python", "torch", "transformers"]


def write_report(out: Path, fmt: str = "html", path: Path | None = None) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"report format must be one of {FORMATS}, got {fmt!r}")
    out = Path(out)
    if not (out / "sweep.json").exists():
        raise FileNotFoundError(f"{out} is not a sweep folder (no sweep.json)")
    if not (out / "summary.json").exists() or not (out / "points.csv").exists():
        from orchestrator.report.analyze import analyze_sweep

        analyze_sweep(out)
    sweep = json.loads((out / "sweep.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    points = pd.read_csv(out / "points.csv")
    sections = report_sections(sweep, summary, points)
    path = Path(path) if path else out / f"report.{fmt}"
    title = f"dsd-testbed report: {sweep['experiment']['name']}"
    text = render_html(title, sections, out) if fmt == "html" else render_markdown(title, sections, out, path.parent)
    path.write_text(text)
    return path


# A section is (heading, [blocks]); a block is ("text", str), ("table", header, rows) or ("image", file name).


def report_sections(sweep: dict, summary: dict, points: pd.DataFrame) -> list[tuple[str, list]]:
    sections = [_what_ran_section(sweep)]
    sections += evidence_sections(summary)
    sections += cpu_sections(summary, points)
    sections.append(_parameters_section(summary))
    sections.append(_crossovers_section(summary))
    sections += paper_sections(summary)
    sections += gain_window_sections(summary)
    sections += capacity_sections(summary)
    sections += frontier_sections(summary)
    sections += gamma_opt_sections(summary)
    if summary.get("acceptance"):
        sections.append(
            ("Workload: acceptance and repetition", [("table", ["", ""], _acceptance_rows(sweep, summary))])
        )
    sections += category_sections(summary)
    shown = set(FRONTIER_PLOTS) if frontier_sections(summary) else set()
    sections.append(
        (
            "Plots",
            [("image", name) for name in summary.get("plots", []) if name not in shown]
            or [("text", "none: the sweep's data supports no plot")],
        )
    )
    sections.append(_points_section(points))
    return sections


def _what_ran_section(sweep: dict) -> tuple[str, list]:
    experiment = sweep["experiment"]
    return (
        "What ran",
        [
            (
                "table",
                ["", ""],
                [
                    ["experiment", experiment["name"]],
                    ["launcher", sweep.get("launcher", "")],
                    [
                        "shaper backend",
                        sweep.get("shaper_backend", "")
                        + (f" ({sweep['shaper_reason']})" if sweep.get("shaper_reason") else ""),
                    ],
                    ["backend", _backend_text(experiment)],
                    ["grid", _grid_text(experiment)],
                    ["compute costs", sweep.get("costs_source", "")],
                    *([["compute regime", _regime_text(sweep["regime"])]] if sweep.get("regime") else []),
                    *[
                        [key, "unknown" if sweep[key] is None else str(sweep[key])]
                        for key in HOST_FACTS
                        if key in sweep
                    ],
                ],
            ),
        ],
    )


def _regime_text(regime: dict) -> str:
    """sweep.json's regime (orchestrator/running/regime.py) in one line."""
    per_gamma = "; ".join(
        f"gamma {g}: t_verify/t_ar {r['verify_over_ar']:.2f}, sync DSD breaks even from alpha "
        + ("> 1" if r["break_even_alpha"] is None else f"{r['break_even_alpha']:.2f}")
        for g, r in regime["by_gamma"].items()
    )
    chosen = regime.get("precision_choice")
    auto = f" (dtype auto here: {chosen['target_dtype']}, CPU-flag guess {chosen['first_guess']})" if chosen else ""
    warning = "; no DSD mode can beat cloud AR at any RTT on this hardware" if regime["no_win"] else ""
    return (
        f"{regime['dtype']}{auto}, t_ar {regime['t_ar_ms']:.1f} ms, t_draft/t_ar {regime['draft_over_ar']:.2f}; "
        f"{per_gamma}{warning}"
    )


def _parameters_section(summary: dict) -> tuple[str, list]:
    return (
        "Parameters: fitted against assumed",
        [
            (
                "text",
                "Assumed: what the sweep ran with (hardware profile, or measured in-process before "
                "it). Compute: the server's and edge's compute alone, fitted from the rounds (what a "
                "saturated server's capacity depends on). Client view: compute plus the harness's "
                "per-round overhead as the edge sees it, fitted from the receipt times; the "
                "predictions use these (on the sim launcher they equal compute).",
            ),
            (
                "table",
                ["parameter", "assumed", "compute", "client view (predictions)", "source of the last"],
                _param_rows(summary),
            ),
        ],
    )


def _crossovers_section(summary: dict) -> tuple[str, list]:
    return (
        "Crossovers: measured against the in-sample fit",
        [
            (
                "text",
                "The RTT below which the first mode is faster per token than the second; measured as "
                "the crossing of the median-of-repeats curves (range over repeats), predicted by the "
                "closed form at the alpha and parameters fitted from ALL rounds (in sample: the "
                "out-of-sample comparison is above), at the measured alpha (alpha_measured) and, "
                "on the synthetic backend, at the configured alpha.",
            ),
            (
                "table",
                [
                    "group",
                    "crossover",
                    "measured (ms)",
                    "repeats range (ms)",
                    "predicted in sample, at measured alpha (ms)",
                    "predicted at configured alpha (ms)",
                ],
                _group_crossover_cells(summary),
            ),
        ],
    )


def _points_section(points: pd.DataFrame) -> tuple[str, list]:
    columns = [c for c in POINT_COLUMNS if c in points.columns]
    return (
        "Points",
        [
            ("text", f"{len(points)} points; every column is in points.csv beside this report."),
            (
                "table",
                columns,
                [
                    [number_cell(v) if isinstance(v, float) else str(v) for v in row]
                    for row in points[columns].itertuples(index=False)
                ],
            ),
        ],
    )


def _acceptance_rows(sweep: dict, summary: dict) -> list[list[str]]:
    acc, workload = summary["acceptance"], sweep.get("workload", {})
    shares = ", ".join(
        f"{k}: {number_cell(m, 3)} ({number_cell(g, 3)})"
        for k, (m, g) in enumerate(zip(acc["accepted_share"], acc["accepted_share_iid"]))
    )
    return [
        ["prompts (distinct)", f"{workload.get('prompts', '')} ({workload.get('distinct_prompts', '')})"],
        [
            "sampling",
            ", ".join(
                f"{k}={sweep['experiment'].get('sampling', {}).get(k, d)}"
                for k, d in (("temperature", [0.0]), ("top_k", [0]), ("top_p", [1.0]))
            ),
        ],
        [
            "alpha over requests p10 / p50 / p90",
            " / ".join(number_cell(acc[f"request_alpha_p{q}"], 3) for q in (10, 50, 90)),
        ],
        ["distinct 4-grams of an output, p50", number_cell(acc.get("distinct_4gram_p50", math.nan), 3)],
        ["accepted per round: share measured (i.i.d. alpha)", shares],
    ]


def _backend_text(experiment: dict) -> str:
    backend = experiment["backend"]
    if backend["kind"] == "synthetic" and (backend.get("acceptance_trace") or backend.get("acceptance_rounds")):
        source = backend.get("acceptance_trace") or "inline rounds"
        return f"synthetic, acceptance replayed from the trace {source}, profile {experiment['profile']}"
    if backend["kind"] == "synthetic":
        alphas = experiment.get("alpha") or [backend["alpha"]]
        return f"synthetic, alpha {', '.join(map(str, alphas))}, profile {experiment['profile']}"
    if backend["kind"] == "hf":
        return f"hf, {backend['target_path'] or backend['pair_path']}"
    return ", ".join([backend["kind"]] + [f"{k} {v}" for k, v in backend.items() if k != "kind"])


def _grid_text(experiment: dict) -> str:
    return (
        f"modes {', '.join(experiment['modes'])}; RTT {experiment['rtt_ms']} ms; gamma {experiment['gamma']}; "
        f"clients {experiment['clients']}; {experiment['requests']} requests per point and client "
        f"(+{experiment['warmup_requests']} warm-up), {experiment['max_new_tokens']} new tokens; "
        f"{experiment['repeats']} repeat(s)"
    )


def _param_rows(summary: dict) -> list[list[str]]:
    gamma = str(summary["gamma"])
    compute = summary.get("params_compute", summary["params"])
    rows = []
    for name in ("t_draft_edge_s", "t_draft_server_s", "t_verify_s", "t_ar_s"):
        values = [summary["params_assumed"][name], compute[name], summary["params"][name]]
        values = [v.get(gamma, v.get(int(gamma))) if isinstance(v, dict) else v for v in values]
        rows.append(
            [
                name[: -len("_s")] + "_ms" + (f" (gamma={gamma})" if name == "t_verify_s" else ""),
                *(number_cell(1e3 * v, 3) for v in values),
                summary["params_source"][name],
            ]
        )
    rows.append(
        [
            "alpha",
            _configured_alphas(summary),
            "",
            number_cell(summary["alpha_measured"], 3)
            if len(summary["groups"]) == 1
            else "per group: " + ", ".join(number_cell(g["alpha_measured"], 3) for g in summary["groups"]),
            "measured: pooled maximum likelihood over live rounds (the predictions use it; assumed: configured)",
        ]
    )
    for kind, value in summary.get("harness_overhead_ms", {}).items():
        rows.append(
            [
                f"harness overhead: {kind.replace('_', ' ')} (ms)",
                "",
                "",
                number_cell(value, 3),
                "client view minus compute, mean",
            ]
        )
    return rows


def _configured_alphas(summary: dict) -> str:
    values = [g.get("alpha_configured") for g in summary["groups"]]
    if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return ""
    return (
        number_cell(values[0], 3) if len(values) == 1 else "per group: " + ", ".join(number_cell(v, 3) for v in values)
    )


def _group_crossover_cells(summary: dict) -> list[list[str]]:
    return [
        [
            label,
            name.replace("_", " "),
            number_cell(c["measured_rtt_ms"]),
            f"{number_cell(c['measured_rtt_ms_min'])} .. {number_cell(c['measured_rtt_ms_max'])}",
            number_cell(c["predicted_rtt_ms"]),
            number_cell(c.get("predicted_rtt_ms_at_configured_alpha")),
        ]
        for label, name, c in group_crossovers(summary)
    ]
