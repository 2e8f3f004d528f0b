"""A suite's sweeps side by side (orchestrator/spec/suite.py): OUT/summary.json with each sweep's
pair, acceptance, compute times, crossovers and out-of-sample error, one figure of every sweep's
latency against RTT on one latency scale, and OUT/report.html, from the sweeps' own summaries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dsd.pair_manifest import MANIFEST, draft_kind
from orchestrator.common.files import write_json
from orchestrator.records.suite_folder import suite_members
from orchestrator.report import plots
from orchestrator.report.render import render_html

FIGURE = "latency_vs_rtt.png"


def write_side_by_side(out: Path) -> dict:
    out = Path(out)
    name, members = suite_members(out)
    runs, panels, launchers = [], [], set()
    for member in members:
        folder = out / member["folder"]
        if not (folder / "summary.json").exists():
            raise FileNotFoundError(
                f"{folder}: no summary.json (the suite's sweep {member['name']!r} has not "
                "finished; rerun the suite with --resume)"
            )
        sweep = json.loads((folder / "sweep.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
        run = run_entry(member, sweep, summary)
        runs.append(run)
        launchers.add(sweep["launcher"])
        panels.append(
            {
                "title": f"{member['name']}: {run['pair'] or 'synthetic'}, alpha {run['alpha_measured']:.2f}"
                f"\n{run['draft']}",
                "cells": panel_cells(summary),
                "crossovers": run["crossovers"],
            }
        )
    launcher = launchers.pop() if len(launchers) == 1 else "mixed"
    plots.plot_latency_vs_rtt_panels(panels, out / FIGURE, f"{name}: per-token latency against RTT", launcher)
    result = {
        "suite": name,
        "launcher": launcher,
        "runs": runs,
        "plots": [FIGURE],
        "what": "each sweep's own summary.json, side by side: its pair, measured alpha, fitted compute "
        "times, crossovers with their 95% intervals and out-of-sample predictions, and its "
        "out-of-sample latency error",
    }
    write_json(out / "summary.json", result)
    (out / "report.html").write_text(render_html(f"dsd-testbed suite: {name}", suite_sections(result), out))
    return result


def run_entry(member: dict, sweep: dict, summary: dict) -> dict:
    """One sweep's line of the suite summary."""
    backend = sweep["experiment"].get("backend", {})
    pair_path = backend.get("pair_path") or ""
    compute = summary.get("params_compute", {})
    t_ar_s = compute.get("t_ar_s", math.nan)
    oos = summary.get("out_of_sample", {})
    regime = sweep.get("regime") or {}
    return {
        "experiment": member["name"],
        "folder": member["folder"],
        "file": member["file"],
        "pair": Path(pair_path).name if pair_path else "",
        "draft": describe_draft(pair_path),
        "dtype": regime.get("dtype") or backend.get("dtype", ""),
        "cpu": sweep.get("cpu") or (regime.get("precision_choice") or {}).get("machine") or sweep.get("platform", ""),
        "alpha_measured": summary.get("alpha_measured", math.nan),
        "t_ar_ms": 1e3 * t_ar_s,
        "t_draft_edge_over_t_ar": compute.get("t_draft_edge_s", math.nan) / t_ar_s if t_ar_s else math.nan,
        "crossovers": summary.get("crossovers", {}),
        "latency_err_oos_p50_pct": oos.get("latency_err_p50_pct", math.nan),
        "latency_err_oos_max_pct": oos.get("latency_err_max_pct", math.nan),
        "compute_drift_max_pct": oos.get("compute_drift_max_pct", math.nan),
        # the RTT x clients map, where the sweep ran two client counts or more
        "frontier": _map_rows(summary),
        "map_plots": [
            f"{member['folder']}/{name}"
            for name in ("frontier.png", "regime_map.png")
            if name in summary.get("plots", [])
        ],
    }


def _map_rows(summary: dict) -> list[dict]:
    """The sweep's frontier rows where it ran two client counts or more (else the one-client
    crossovers, already in its crossovers, are all it has)."""
    rows = (summary.get("frontier") or {}).get("rows", [])
    return rows if len({r["clients"] for r in rows}) > 1 else []


def describe_draft(pair_path: str) -> str:
    """What drafts in a real pair, from its manifest: a feature draft or layers of the target."""
    manifest = Path(pair_path) / MANIFEST if pair_path else None
    if manifest is None or not manifest.is_file():
        return "no pair manifest"
    data = json.loads(manifest.read_text())
    draft = data.get("draft", {})
    if draft_kind(data) == "eagle":
        return f"feature draft, {draft.get('decoder_layers', '?')} layer(s) on the target's features"
    return f"layer draft, {draft.get('layers_from_target', '?')} of the target's layers"


def panel_cells(summary: dict) -> pd.DataFrame:
    """A sweep's one-client latency cells at its gamma."""
    cells = pd.DataFrame(summary["latency_cells"])
    return plots.latency_cells_at(cells[cells.clients == cells.clients.min()], int(summary["gamma"]))


def suite_sections(result: dict) -> list[tuple[str, list]]:
    header = [
        "sweep",
        "pair",
        "draft",
        "dtype",
        "CPU",
        "alpha",
        "t_ar (ms)",
        "t_draft,edge / t_ar",
        "out-of-sample error p50 / max (%)",
    ]
    rows = [
        [
            r["experiment"],
            r["pair"],
            r["draft"],
            r["dtype"],
            r["cpu"],
            _fmt(r["alpha_measured"], 3),
            _fmt(r["t_ar_ms"], 1),
            _fmt(r["t_draft_edge_over_t_ar"], 3),
            f"{_fmt(r['latency_err_oos_p50_pct'], 1)} / {_fmt(r['latency_err_oos_max_pct'], 1)}",
        ]
        for r in result["runs"]
    ]
    crossings = [
        [
            r["experiment"],
            name,
            c.get("text") or _fmt(c.get("measured_rtt_ms", math.nan), 1),
            _fmt(c.get("predicted_rtt_ms_oos", math.nan), 1),
        ]
        for r in result["runs"]
        for name, c in r["crossovers"].items()
    ]
    return [
        (
            "The sweeps",
            [
                ("table", header, rows),
                ("text", "Each sweep's own report: " + ", ".join(f"{r['folder']}/report.html" for r in result["runs"])),
            ],
        ),
        (
            "Crossovers",
            [("table", ["sweep", "crossover", "measured (95% CI)", "predicted before measuring (ms)"], crossings)],
        ),
        ("Per-token latency against RTT", [("image", FIGURE)]),
        *_map_section(result),
    ]


def _map_section(result: dict) -> list[tuple[str, list]]:
    """The RTT x clients map of the sweeps that ran more than one client count: each crossover per
    client count with its interval beside the prediction written before it ran, and the figures."""
    rows = [
        [
            r["experiment"],
            f["clients"],
            f["pair"],
            f"{_fmt(f['crossover_ms'], 1)} [{_fmt(f['ci_low_ms'], 1)} .. {_fmt(f['ci_high_ms'], 1)}]",
            _fmt(f["predicted_ms"], 1),
            f["in_or_out_of_sample"],
        ]
        for r in result["runs"]
        for f in r.get("frontier", [])
    ]
    if not rows:
        return []
    images = [("image", path) for r in result["runs"] for path in r.get("map_plots", [])]
    return [
        (
            "The RTT x clients map",
            [
                (
                    "table",
                    [
                        "sweep",
                        "clients",
                        "crossover",
                        "measured, ms (95% CI)",
                        "predicted before measuring, ms",
                        "sample",
                    ],
                    rows,
                ),
                *images,
            ],
        )
    ]


def _fmt(value, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"
