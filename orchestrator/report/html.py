"""`dsdbed report`: one self-contained file per sweep folder, for a reader who was not there.

HTML embeds the plots as base64 PNGs (the file can be mailed alone); Markdown links the PNGs
beside it. Both are built from the same sections: what ran and where, fitted against assumed
parameters, crossovers measured against predicted, the gain window and capacity where the
sweep has them, the points table and the plots. The numbers come from summary.json and
points.csv (written by `dsdbed analyze`, run here first if they are missing).
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import pandas as pd

from orchestrator.analysis import paper

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
    sections += _paper_sections(summary)
    sections += _gain_window_sections(summary)
    sections += _capacity_sections(summary)
    sections += _frontier_sections(summary)
    sections += _gamma_opt_sections(summary)
    if summary.get("acceptance"):
        sections.append(
            ("Workload: acceptance and repetition", [("table", ["", ""], _acceptance_rows(sweep, summary))])
        )
    sections += _category_sections(summary)
    shown = set(FRONTIER_PLOTS) if _frontier_sections(summary) else set()
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


def _gain_window_sections(summary: dict) -> list:
    if not summary.get("gain_window"):
        return []
    return [
        (
            "Gain window: the alpha at which DSD ties cloud AR",
            [
                (
                    "text",
                    "Per RTT: below this alpha cloud AR is faster, above it DSD. Measured: interpolated "
                    "between the swept alphas (fitted values); predicted: the closed form.",
                ),
                (
                    "table",
                    ["profile", "mode", "RTT (ms)", "alpha measured", "alpha predicted"],
                    [
                        [
                            r["profile"],
                            r["mode"],
                            _num(r["rtt_ms"]),
                            _num(r["alpha_boundary_measured"], 3),
                            _num(r["alpha_boundary_predicted"], 3),
                        ]
                        for r in summary["gain_window"]
                    ],
                ),
            ],
        )
    ]


def _capacity_sections(summary: dict) -> list:
    if not summary.get("capacity"):
        return []
    return [
        (
            "Capacity: clients a saturated server sustains",
            [
                (
                    "text",
                    "At one per-client token rate (what DSD gives each client at the largest count), "
                    "the client count each mode sustains, interpolated; their ratio beside "
                    "1 + gamma*t_draft,server/t_verify.",
                ),
                (
                    "table",
                    [
                        "DSD mode",
                        "rate (tok/s per client)",
                        "clients DSD",
                        "clients co-located",
                        "ratio measured",
                        "interval over repeats",
                        "ratio predicted",
                    ],
                    [
                        [
                            r["mode"],
                            _num(r["rate_tok_s_per_client"]),
                            _num(r["clients_dsd"]),
                            _num(r["clients_reference"]),
                            _num(r["ratio_measured"]),
                            paper.ratio_interval(r),
                            _num(r["ratio_predicted"]),
                        ]
                        for r in summary["capacity"]
                    ],
                ),
            ],
        )
    ]


FRONTIER_PLOTS = ("regime_map.png", "frontier.png")


def _frontier_sections(summary: dict) -> list:
    """The RTT x clients map: its figures and the crossovers per client count (a sweep over two
    client counts or more)."""
    frontier = summary.get("frontier") or {}
    rows = frontier.get("rows", [])
    if len({r["clients"] for r in rows}) < 2:
        return []
    made = [("image", name) for name in FRONTIER_PLOTS if name in summary.get("plots", [])]
    return [
        (
            "The map: where each mode wins over RTT and clients",
            [
                (
                    "text",
                    frontier["what"] + f". Out-of-sample error over {frontier['err_rows']} crossovers predicted at "
                    f"{frontier['err_floor_ms']:g} ms or more: p50 {_num(frontier['err_p50_pct'], 1)}%, "
                    f"max {_num(frontier['err_max_pct'], 1)}% (server max_batch {frontier['max_batch']}).",
                ),
                *made,
                (
                    "table",
                    ["clients", "pair", "measured (ms)", "95% CI (ms)", "predicted (ms)", "prediction", "error (%)"],
                    [
                        [
                            str(r["clients"]),
                            r["pair"].replace("_", " "),
                            _num(r["crossover_ms"]),
                            "none (no resampled value differs)"
                            if r.get("ci_degenerate")
                            else f"{_num(r['ci_low_ms'])} .. {_num(r['ci_high_ms'])}",
                            _num(r["predicted_ms"]),
                            r["in_or_out_of_sample"].replace("_", " "),
                            _num(r["err_pct"], 1),
                        ]
                        for r in rows
                    ],
                ),
            ],
        )
    ]


def _gamma_opt_sections(summary: dict) -> list:
    if not summary.get("gamma_opt"):
        return []
    return [
        (
            "Optimal gamma vs RTT: measured against the closed form",
            [
                ("text", summary["gamma_opt"]["what"] + "; every column is in gamma_opt.csv."),
                (
                    "table",
                    [
                        "mode",
                        "RTT (ms)",
                        "measured best",
                        "bootstrap set",
                        "closed form, swept (oos)",
                        "penalty (ms, %)",
                        "closed form 1..64 (oos)",
                        "closed form 1..64 (in sample)",
                    ],
                    [
                        [
                            r["mode"],
                            _num(r["rtt_ms"]),
                            str(r["gamma_best"]),
                            str(r["gamma_set"]),
                            _num(r["gamma_best_predicted_grid_oos"], 0)
                            + (" (calibration)" if r.get("predicted_from_calibration_points") else ""),
                            f"{_num(r['penalty_ms'])}, {_num(r['penalty_pct'], 1)}%",
                            _num(r["gamma_model_oos"], 0),
                            _num(r["gamma_model_insample"], 0),
                        ]
                        for r in summary["gamma_opt"]["rows"]
                    ],
                ),
            ],
        )
    ]


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
                    [_num(v) if isinstance(v, float) else str(v) for v in row]
                    for row in points[columns].itertuples(index=False)
                ],
            ),
        ],
    )


def _category_sections(summary: dict) -> list:
    rows = summary.get("by_category")
    if not rows:
        return []
    modes = sorted({mode for row in rows.values() for mode in row["steady_per_token_ms_mean"]})
    return [
        (
            "Acceptance and latency by category",
            [
                (
                    "text",
                    "The workload's prompts by their category: requests, alpha measured over the category's "
                    "speculative rounds, and the mean steady time per token per mode (summary.json by_category).",
                ),
                (
                    "table",
                    ["category", "requests", "alpha measured", *(f"{m}: ms/token" for m in modes)],
                    [
                        [
                            name,
                            str(row["requests"]),
                            _num(row["alpha_measured"], 3),
                            *(_num(row["steady_per_token_ms_mean"].get(m, math.nan)) for m in modes),
                        ]
                        for name, row in rows.items()
                    ],
                ),
            ],
        )
    ]


def _acceptance_rows(sweep: dict, summary: dict) -> list[list[str]]:
    acc, workload = summary["acceptance"], sweep.get("workload", {})
    shares = ", ".join(
        f"{k}: {_num(m, 3)} ({_num(g, 3)})"
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
        ["alpha over requests p10 / p50 / p90", " / ".join(_num(acc[f"request_alpha_p{q}"], 3) for q in (10, 50, 90))],
        ["distinct 4-grams of an output, p50", _num(acc.get("distinct_4gram_p50", math.nan), 3)],
        ["accepted per round: share measured (i.i.d. alpha)", shares],
    ]


def _paper_sections(summary: dict) -> list:
    """The paper's comparisons (orchestrator/analysis/paper.py): configured setting, closed form at the
    configured and at the measured alpha (configured compute times), measured."""
    tables = summary.get("paper", {})
    blocks = []
    if tables.get("crossovers"):
        blocks += [
            (
                "text",
                "Per group: the closed form with the configured compute times (the paper's "
                "setting) at the configured alpha and at the measured alpha, beside the "
                f'measured crossover. "{paper.NEVER}": the closed form has DSD lose at every RTT.',
            ),
            ("table", *paper.crossover_table(tables["crossovers"])),
        ]
    if tables.get("capacity"):
        blocks += [
            ("text", "Capacity factor: clients sustained, DSD over co-located, at one per-client rate."),
            ("table", *paper.capacity_table(tables["capacity"])),
        ]
    return [("The paper's comparisons", blocks)] if blocks else []


def evidence_sections(summary: dict) -> list[tuple[str, list]]:
    """The out-of-sample headline, crossovers with their 95% intervals, and what the
    intervals are (orchestrator/analysis/predictions.py, orchestrator/analysis/bootstrap.py)."""
    oos, insample = summary.get("out_of_sample"), summary.get("in_sample", {})
    if not oos:
        return []
    sections = []
    if oos.get("available"):
        head = (
            f"Out of sample: per-token latency error p50 {_num(oos['latency_err_p50_pct'])}%, max "
            f"{_num(oos['latency_err_max_pct'])}% over {oos['cells']} cells; worst located crossover "
            f"{_num(oos['crossover_err_max_pct'])}% off. In sample (labelled as such: fitted from the "
            f"rounds it is compared with): p50 {_num(insample.get('latency_err_p50_pct'))}%, max "
            f"{_num(insample.get('latency_err_max_pct'))}%."
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
    rows = []
    for group in summary["groups"]:
        label = ", ".join(f"{k}={group[k]}" for k in summary.get("group_keys", [])) or "all points"
        for name, c in group["crossovers"].items():
            rows.append(
                [
                    label,
                    name.replace("_", " "),
                    c.get("text", _num(c["measured_rtt_ms"])),
                    _num(c.get("predicted_rtt_ms_oos", math.nan)),
                    _num(c.get("oos_err_pct", math.nan)),
                ]
            )
    blocks = [("text", head)] + ([("text", method)] if method else [])
    blocks.append(
        ("table", ["group", "crossover", "measured [95% CI] ", "predicted before measuring (ms)", "error (%)"], rows)
    )
    sections.append(("Headline: predicted before measuring, out of sample", blocks))
    boot = summary.get("bootstrap", {})
    cells = summary.get("latency_cells", [])
    sections.append(
        (
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
                            _num(c["rtt_ms"]),
                            str(c["gamma"]),
                            str(c["clients"]),
                            _num(c["per_token_ms"], 3),
                            f"{_num(c['ci_low'], 3)} .. {_num(c['ci_high'], 3)}",
                            _num(c.get("per_token_ms_predicted_oos"), 3),
                            _num(c.get("err_oos_pct")),
                        ]
                        for c in cells
                    ],
                ),
            ],
        )
    )
    return sections


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
                *(_num(1e3 * v, 3) for v in values),
                summary["params_source"][name],
            ]
        )
    rows.append(
        [
            "alpha",
            _configured_alphas(summary),
            "",
            _num(summary["alpha_measured"], 3)
            if len(summary["groups"]) == 1
            else "per group: " + ", ".join(_num(g["alpha_measured"], 3) for g in summary["groups"]),
            "measured: pooled maximum likelihood over live rounds (the predictions use it; assumed: configured)",
        ]
    )
    for kind, value in summary.get("harness_overhead_ms", {}).items():
        rows.append(
            [
                f"harness overhead: {kind.replace('_', ' ')} (ms)",
                "",
                "",
                _num(value, 3),
                "client view minus compute, mean",
            ]
        )
    return rows


def _configured_alphas(summary: dict) -> str:
    values = [g.get("alpha_configured") for g in summary["groups"]]
    if all(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return ""
    return _num(values[0], 3) if len(values) == 1 else "per group: " + ", ".join(_num(v, 3) for v in values)


def _group_crossover_cells(summary: dict) -> list[list[str]]:
    rows = []
    for group in summary["groups"]:
        label = ", ".join(f"{k}={group[k]}" for k in summary.get("group_keys", [])) or "all points"
        for name, c in group["crossovers"].items():
            rows.append(
                [
                    label,
                    name.replace("_", " "),
                    _num(c["measured_rtt_ms"]),
                    f"{_num(c['measured_rtt_ms_min'])} .. {_num(c['measured_rtt_ms_max'])}",
                    _num(c["predicted_rtt_ms"]),
                    _num(c.get("predicted_rtt_ms_at_configured_alpha")),
                ]
            )
    return rows


def _num(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, str) and not value):
        return ""
    value = float(value)
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "never" if value < 0 else "whole grid"
    return f"{value:.{digits}f}"


def render_html(title: str, sections: list, out: Path) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:12px;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for heading, blocks in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        for block in blocks:
            if block[0] == "text":
                parts.append(f"<p>{html.escape(block[1])}</p>")
            elif block[0] == "table":
                head = "".join(f"<th>{html.escape(str(h))}</th>" for h in block[1])
                body = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in block[2]
                )
                parts.append(f"<table><tr>{head}</tr>{body}</table>")
            else:
                data = base64.b64encode((out / block[1]).read_bytes()).decode("ascii")
                parts.append(f"<p><img alt='{html.escape(block[1])}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render_markdown(title: str, sections: list, out: Path, report_dir: Path) -> str:
    lines = [f"# {title}", ""]
    for heading, blocks in sections:
        lines += [f"## {heading}", ""]
        for block in blocks:
            if block[0] == "text":
                lines += [block[1], ""]
            elif block[0] == "table":
                lines.append("| " + " | ".join(_md_cell(h) for h in block[1]) + " |")
                lines.append("|" + "---|" * len(block[1]))
                lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block[2]]
                lines.append("")
            else:
                image = Path(out / block[1]).resolve()
                try:
                    link = image.relative_to(report_dir.resolve())
                except ValueError:
                    link = image
                lines += [f"![{block[1]}]({link})", ""]
    return "\n".join(lines)


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
