"""The benchmarks run end to end and print their figures: each in its smallest configuration, as
a user would start it (a subprocess, the repository on the path). Benchmarks check the issues'
goals; one that stopped running after a refactor (repeatability.py did, for a removed keyword)
would otherwise go unnoticed until someone needs its figure. Where the smallest configuration is
deterministic (the sim launcher), its figures are checked too."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checks import every

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def _run(args: list[str], tmp_path: Path) -> dict:
    """Runs a benchmark; returns its last line's key=value figures (floats where they parse)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    figures = {}
    for pair in last.split():
        key, _, value = pair.partition("=")
        try:
            figures[key] = float(value)
        except ValueError:
            figures[key] = value
    return figures


@pytest.mark.slow
def test_theory_agreement_on_sim_meets_the_out_of_sample_goals(tmp_path):
    figures = _run(
        ["benchmarks/theory_agreement.py", "--launcher", "sim", "--repeats", "2", "--out", str(tmp_path / "sweep")],
        tmp_path,
    )
    assert figures["launcher"] == "sim"
    # Virtual time: what is left is the closed form against the protocol (no harness, no load).
    assert figures["oos_latency_err_p50_pct"] <= 3 and figures["oos_latency_err_max_pct"] <= 8, figures
    assert figures["oos_crossover_err_pct"] <= 10, figures
    assert math.isfinite(figures["crossover_ci_width_ms"])


@pytest.mark.slow
@pytest.mark.model
def test_repeatability_prints_both_spreads(tmp_path):
    figures = _run(["benchmarks/repeatability.py", "--runs", "2", "--requests", "1", "--max-new-tokens", "8"], tmp_path)
    assert figures["spread_pinned_pct"] >= 0 and figures["spread_unpinned_pct"] >= 0
    assert figures["median_pinned_ms"] > 0 and figures["runs"] == 2


@pytest.mark.slow
def test_paper_table_on_sim_measures_every_cell(tmp_path):
    figures = _run(["benchmarks/paper_table.py", "--launcher", "sim", "--out", str(tmp_path / "cells")], tmp_path)
    assert figures["cells"] == 12 and figures["cells_ok"] == 12, figures


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_link_schedule_follows_its_schedule(tmp_path):
    figures = _run(["benchmarks/link_schedule.py", "--probes", "50"], tmp_path)
    assert figures["backend"] in ("nfqueue", "kernel-netem") and "goals_met" in figures


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_step_reorder_measures_the_link_on_both_sides_of_its_step_and_a_queue_step_never_stalls(tmp_path):
    """Both orders run; with the order kept (a queue draining) no message waits longer than the
    old RTT and TCP times nothing out. (The path order's stall is TCP's answer to reordering,
    which depends on the kernel's TCP: printed, not asserted.)"""
    for order in ("path", "queue"):
        figures = _run(
            ["benchmarks/step_reorder.py", "--step-after-s", "1.5", "--duration-s", "3", "--order", order], tmp_path
        )
        assert 148 < figures["before_ms"] < 160 and 9 < figures["after_ms"] < 20, figures
    assert figures["worst_after_step_ms"] < figures["before_ms"] + 15 and figures["tcp_timeouts"] == 0, figures


@pytest.mark.parametrize("script", ["benchmarks/shaper_fidelity.py", "benchmarks/compose_scale.py"])
def test_dry_runs_print_their_plan(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, script, "--dry-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.model
def test_batched_verify_prints_the_capacity_figures_and_their_predictions(tmp_path):
    """Default pair, the smallest capacity run (two client counts): every figure the issue is judged
    by is printed, batched greedy output equals unbatched, and the predictions are finite."""
    figures = _run(["benchmarks/batched_verify.py", "--tokens", "16", "--counts", "1,2", "--repeats", "3"], tmp_path)
    assert figures["batched_equal"] == 1 and figures["batch8_speedup"] > 1, figures
    for key in (
        "capacity_ratio_batched",
        "capacity_ratio_serial",
        "predicted",
        "predicted_batched",
        "predicted_claim4",
        "predicted_closed_serial",
        "gap_ms",
    ):
        assert math.isfinite(figures[key]), (key, figures)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize(
    "transport, sampling", [("ws", []), ("tcp", []), ("ws", ["--gamma", "2", "--temperature", "0.7", "--top-p", "0.9"])]
)
def test_hf_overhead_prints_every_part_and_the_echo_floor_measured_beside_it(tmp_path, transport, sampling):
    figures = _run(
        [
            "benchmarks/hf_overhead.py",
            "--requests",
            "1",
            "--tokens",
            "16",
            "--echo-messages",
            "20",
            "--transport",
            transport,
            *sampling,
        ],
        tmp_path,
    )
    assert figures["transport"] == transport
    assert figures["temperature"] == (0.7 if sampling else 0.0) and figures["gamma"] == (2 if sampling else 4)
    for key in (
        "hf_overhead_server_p50_ms",
        "hf_overhead_edge_p50_ms",
        "hf_overhead_colocated_p50_ms",
        "hf_overhead_ar_p50_ms",
        "echo_floor_p50_ms",
    ):
        assert math.isfinite(figures[key]), (key, figures)
    assert figures["echo_floor_p50_ms"] > 0 and figures["spin_us"] == 0
    assert figures["server_over_floor_p50_ms"] == pytest.approx(
        figures["hf_overhead_server_p50_ms"] - figures["echo_floor_p50_ms"], abs=2e-3
    )


@pytest.mark.slow
@pytest.mark.model
def test_spin_clients_runs_both_settings_with_the_same_tokens(tmp_path):
    figures = _run(
        ["benchmarks/spin_clients.py", "--tokens", "8", "--spin-us", "1000", "--spin-lead-us", "500"], tmp_path
    )
    assert figures["same_tokens"] == 1 and figures["clients"] == 2
    assert figures["tok_s_off"] > 0 and figures["tok_s_on"] > 0
    assert figures["spun_ms_on"] <= figures["windows_on"] * 1.0 + 1e-6  # bounded: spin_us a window


def test_adaptive_on_sim_prints_every_policy_against_the_oracle(tmp_path):
    """benchmarks/adaptive.py in a small sim scenario (two seeds from seed 3, a short schedule):
    the issue's keys last, every figure finite, and the oracle at least as fast as any policy
    (virtual time, so deterministic; the informed bandit and the model beat the heuristic here)."""
    saved = tmp_path / "runs.pkl"
    figures = _run(
        [
            "benchmarks/adaptive.py",
            "--launcher",
            "sim",
            "--seeds",
            "1",
            "--first-seed",
            "3",
            "--requests",
            "8",
            "--alpha-requests",
            "4",
            "--tokens",
            "16",
            "--segment-s",
            "1",
            "--save",
            str(saved),
        ],
        tmp_path,
    )
    keys = (
        "model_vs_oracle_pct",
        "bandit_vs_oracle_pct",
        "heuristic_vs_oracle_pct",
        "best_static_vs_oracle_pct",
        "switches_per_100_rounds",
    )
    assert every(math.isfinite(figures[k]) for k in keys), figures
    assert figures["launcher"] == "sim" and figures["goals_met"] in ("True", "False")
    assert figures["model_vs_oracle_pct"] < figures["heuristic_vs_oracle_pct"], figures
    assert figures["bandit_vs_oracle_pct"] < figures["heuristic_vs_oracle_pct"], figures
    # and benchmarks/adaptive_regret.py reads the saved runs back: a line per request, summing to the run's
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "benchmarks/adaptive_regret.py", str(saved), "model"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    header, *lines = done.stdout.strip().splitlines()
    assert header.startswith("seed 3 model: lost ") and len(lines) == 8, done.stdout
    losses = [float(line.split("lost=")[1].split("s ")[0]) for line in lines]
    assert sum(losses) == pytest.approx(float(header.split("lost ")[1].split(" s")[0]), abs=0.01)
    assert (sum(losses) > 0) == (figures["model_vs_oracle_pct"] > 0), (done.stdout, figures)


def _real_pair_target() -> None:
    from pairs import smollm2

    try:
        smollm2.materialize_target(REPO / "models" / "smollm2-chat")
    except FileNotFoundError as exc:
        pytest.skip(f"the real pair's target cannot be made here: {exc}")


@pytest.mark.slow
@pytest.mark.model
def test_common_draws_alpha_prints_both_rates_on_the_same_requests(tmp_path):
    _real_pair_target()
    figures = _run(["benchmarks/common_draws_alpha.py", "--prompts", "1", "--seeds", "2"], tmp_path)
    assert figures["requests"] == 2
    for key in ("keyed_accept_rate", "sequential_accept_rate"):
        assert 0.0 < figures[key] < 1.0, figures
    assert figures["diff"] == pytest.approx(figures["keyed_accept_rate"] - figures["sequential_accept_rate"], abs=2e-4)


@pytest.mark.slow
@pytest.mark.model
def test_draft_step_gap_prints_a_ratio_per_gap_against_back_to_back_steps(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "benchmarks/draft_step_gap.py", "--gaps-ms", "0,20"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("gap_ms=")]
    assert [line.split()[0] for line in lines] == ["gap_ms=0", "gap_ms=20"]
    assert lines[0].endswith("ratio=1.000")
