"""The paper's comparisons: configured alpha beside the measured one, closed forms at both, and a
cell where DSD never wins reported as such, never as a number."""

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest

from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis import paper
from orchestrator.spec.experiment import experiment_from_dict, load_experiment
from orchestrator.report.html import write_report
from orchestrator.running.run import run_experiment
from orchestrator.report.analyze import analyze_sweep

REPO = Path(__file__).resolve().parents[2]
PAPER_SYNC = ComputeTimes.from_dict(
    {"t_draft_edge_s": 0.010, "t_draft_server_s": 0.010, "t_ar_s": 0.020, "t_verify_s": {5: 0.020}}
)


def _benchmark():
    spec = importlib.util.spec_from_file_location("paper_table", REPO / "benchmarks" / "paper_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_closed_form_matches_reference_and_a_lost_cell_is_never_not_a_number():
    # RTT* = t_ar*(E - 1) - gamma*t_draft: at alpha 0.9, t_ar 20 ms: 20*(4.6856 - 1) - 50 = 23.7 ms
    assert paper.closed_form_crossover_ms("sync_vs_ar", 0.9, 5, PAPER_SYNC) == pytest.approx(23.71, abs=0.01)
    # alpha 0.5: 20*0.96875 - 50 < 0: DSD never wins
    assert paper.closed_form_crossover_ms("sync_vs_ar", 0.5, 5, PAPER_SYNC) == -math.inf
    assert paper.cell(-math.inf) == paper.NEVER
    assert paper.closed_form_crossover_ms("sync_vs_ar", math.nan, 5, PAPER_SYNC) != paper.closed_form_crossover_ms(
        "sync_vs_ar", math.nan, 5, PAPER_SYNC
    )  # nan: a real model pair has no configured alpha


def test_every_paper_experiment_loads_and_names_profiles_with_sources():
    for name in ("paper-sync-vs-ar", "paper-pipelined-window", "paper-capacity"):
        experiment = load_experiment(REPO / "experiments" / f"{name}.toml")
        assert experiment.launcher == "netns" and experiment.backend.acceptance == "stratified"
    from dsd.costs.profiles import load_profiles

    profiles = load_profiles()
    tv50 = profiles["paper-sync-tv50"]
    assert (tv50.t_draft_edge_s, tv50.t_ar_s, tv50.t_verify_s(5)) == (0.010, 0.050, 0.050)
    assert "paper's setting" in dict(tv50.sources)["t_ar_s"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """sync vs AR at two alphas on sim: 0.5 (DSD never wins at t_ar 20 ms) and 0.9 (23.7 ms)."""
    out = tmp_path_factory.mktemp("paper") / "sync-vs-ar"
    experiment = experiment_from_dict(
        {
            "name": "paper-small",
            "launcher": "sim",
            "modes": ["ar", "sync"],
            "profile": "paper-sync-tv20",
            "alpha": [0.5, 0.9],
            "rtt_ms": [0, 20, 40],
            "gamma": [5],
            "requests": 1,
            "warmup_requests": 0,
            "max_new_tokens": 200,
            "prompt_tokens": 8,
            "backend": {"kind": "synthetic", "acceptance": "stratified"},
        }
    )
    run_experiment(experiment, out, resume=False)
    return out


def test_points_carry_the_configured_alpha_beside_the_measured_one(sweep):
    analyze_sweep(sweep)
    points = pd.read_csv(sweep / "points.csv")
    columns = list(points.columns)
    assert columns.index("alpha_configured") + 1 == columns.index("alpha_measured")
    sync = points[points["mode"] == "sync"]
    assert (sync["alpha_configured"] == sync["alpha"]).all()
    assert (abs(sync["alpha_measured"] - sync["alpha_configured"]) <= 0.01).all()
    assert sync["per_token_ms_predicted_at_configured_alpha"].notna().all()


def test_summary_and_report_say_which_alpha_each_prediction_used(sweep):
    summary = analyze_sweep(sweep)
    assert "alpha_measured" in summary["prediction_alpha"] and "alpha_configured" in summary["prediction_alpha"]
    rows = {r["alpha_configured"]: r for r in summary["paper"]["crossovers"]}
    assert rows[0.5]["closed_form_at_configured_alpha_ms"] == -math.inf
    assert rows[0.5]["measured_ms"] == -math.inf
    assert rows[0.9]["closed_form_at_configured_alpha_ms"] == pytest.approx(23.71, abs=0.01)
    assert abs(rows[0.9]["alpha_measured"] - 0.9) <= 0.01
    text = write_report(sweep, "md").read_text()
    section = text[text.index("## The paper's comparisons") :]
    section = section[: section.index("\n## ", 1)]
    lost = next(line for line in section.splitlines() if "| 0.500 |" in line)
    assert lost.count(paper.NEVER) == 3  # closed form at both alphas, and measured
    assert not any(cell.strip().startswith("-") and cell.strip() != "-" for cell in lost.split("|"))
    assert "predicted at configured alpha (ms)" in text


def test_the_configured_alpha_is_the_one_that_ran():
    from orchestrator.analysis.groups import configured_alpha

    synthetic = {"kind": "synthetic", "alpha": 0.8}
    assert configured_alpha({"alpha": [0.9], "backend": synthetic}, {}) == 0.9  # one-value list
    assert configured_alpha({"alpha": [0.5, 0.9], "backend": synthetic}, {"alpha": 0.5}) == 0.5
    assert configured_alpha({"backend": synthetic}, {}) == 0.8
    assert math.isnan(configured_alpha({"backend": {"kind": "hf", "alpha": 0.8}}, {}))


def test_benchmark_cells_and_their_tolerance():
    bench = _benchmark()
    assert bench.cell_rtts_ms(-math.inf, 0.3) == [0.0, 10.0]
    assert bench.cell_rtts_ms(100.0, 0.3) == [70.0, 130.0]
    assert bench.cell_rtts_ms(8.0, 0.3) == [3.0, 13.0]  # at least 5 ms either side
    assert bench.cell_ok(-math.inf, -math.inf) and not bench.cell_ok(5.0, -math.inf)
    assert bench.cell_ok(109.0, 100.0) and not bench.cell_ok(111.0, 100.0)
    assert bench.cell_ok(10.9, 8.0) and not bench.cell_ok(11.1, 8.0)  # 3 ms beats 10% of a small one
    assert not bench.cell_ok(math.inf, 100.0)


def test_the_interval_is_the_ci_where_there_is_one_else_the_range_over_repeats():
    base = {"measured_rtt_ms": 20.0, "measured_rtt_ms_min": 18.0, "measured_rtt_ms_max": 23.0, "predicted_rtt_ms": 21.0}
    group = {"profile": "p", "alpha_configured": 0.9, "alpha_measured": 0.9}
    with_ci = paper.crossover_rows(
        [{**group, "crossovers": {"sync_vs_ar": {**base, "ci_low": 19.0, "ci_high": 21.5}}}], {"p": PAPER_SYNC}, 5
    )[0]
    assert (with_ci["measured_low_ms"], with_ci["measured_high_ms"], with_ci["interval"]) == (19.0, 21.5, "95% CI")
    no_ci = paper.crossover_rows(
        [{**group, "crossovers": {"sync_vs_ar": {**base, "ci_low": math.nan, "ci_high": math.nan}}}],
        {"p": PAPER_SYNC},
        5,
    )[0]
    assert (no_ci["measured_low_ms"], no_ci["measured_high_ms"], no_ci["interval"]) == (
        18.0,
        23.0,
        "range over repeats",
    )
