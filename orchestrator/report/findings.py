"""The report's sections on what the sweep found, where it has them: the gain window, capacity,
the map over RTT and clients, the optimal gamma, acceptance by category and the paper's
comparisons (each from summary.json, written by `dsdbed analyze`)."""

from __future__ import annotations

import math

from orchestrator.analysis import paper
from orchestrator.report.render import number_cell


def gain_window_sections(summary: dict) -> list:
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
                            number_cell(r["rtt_ms"]),
                            number_cell(r["alpha_boundary_measured"], 3),
                            number_cell(r["alpha_boundary_predicted"], 3),
                        ]
                        for r in summary["gain_window"]
                    ],
                ),
            ],
        )
    ]


def capacity_sections(summary: dict) -> list:
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
                            number_cell(r["rate_tok_s_per_client"]),
                            number_cell(r["clients_dsd"]),
                            number_cell(r["clients_reference"]),
                            number_cell(r["ratio_measured"]),
                            paper.ratio_interval(r),
                            number_cell(r["ratio_predicted"]),
                        ]
                        for r in summary["capacity"]
                    ],
                ),
            ],
        )
    ]


FRONTIER_PLOTS = ("regime_map.png", "frontier.png")


def frontier_sections(summary: dict) -> list:
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
                    f"{frontier['err_floor_ms']:g} ms or more: p50 {number_cell(frontier['err_p50_pct'], 1)}%, "
                    f"max {number_cell(frontier['err_max_pct'], 1)}% (server max_batch {frontier['max_batch']}).",
                ),
                *made,
                (
                    "table",
                    [
                        "clients",
                        "pair",
                        "measured (ms)",
                        "95% CI (ms)",
                        "predicted (ms)",
                        "prediction",
                        "error (%)",
                        "edge draft step vs fewest clients",
                    ],
                    [
                        [
                            str(r["clients"]),
                            r["pair"].replace("_", " "),
                            number_cell(r["crossover_ms"]),
                            "none (no resampled value differs)"
                            if r.get("ci_degenerate")
                            else f"{number_cell(r['ci_low_ms'])} .. {number_cell(r['ci_high_ms'])}",
                            number_cell(r["predicted_ms"]),
                            r["in_or_out_of_sample"].replace("_", " "),
                            number_cell(r["err_pct"], 1),
                            _edge_draft_cell(r),
                        ]
                        for r in rows
                    ],
                ),
            ],
        )
    ]


def _edge_draft_cell(row: dict) -> str:
    ratio = row.get("edge_draft_step_ratio", math.nan)
    if not math.isfinite(ratio):
        return ""
    return f"x{ratio:.2f}" + (" (the edges slowed each other)" if row.get("edge_draft_inflated") else "")


def gamma_opt_sections(summary: dict) -> list:
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
                            number_cell(r["rtt_ms"]),
                            str(r["gamma_best"]),
                            str(r["gamma_set"]),
                            number_cell(r["gamma_best_predicted_grid_oos"], 0)
                            + (" (calibration)" if r.get("predicted_from_calibration_points") else ""),
                            f"{number_cell(r['penalty_ms'])}, {number_cell(r['penalty_pct'], 1)}%",
                            number_cell(r["gamma_model_oos"], 0),
                            number_cell(r["gamma_model_insample"], 0),
                        ]
                        for r in summary["gamma_opt"]["rows"]
                    ],
                ),
            ],
        )
    ]


def category_sections(summary: dict) -> list:
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
                            number_cell(row["alpha_measured"], 3),
                            *(number_cell(row["steady_per_token_ms_mean"].get(m, math.nan)) for m in modes),
                        ]
                        for name, row in rows.items()
                    ],
                ),
            ],
        )
    ]


def paper_sections(summary: dict) -> list:
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
