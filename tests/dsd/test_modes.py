"""The mode registry (dsd/modes.py): lookups, errors, and what a new mode touches.

The toy mode below is the whole of what a new mode needs outside its driver policy: one
``register(Mode(...))``. The tests then show it passing an experiment's validation, getting a
place in the sweep's grid, a prediction in the analysis and a labelled line in the plots.
"""

import math

import pandas as pd
import pytest

from dsd.analytic import latency_model as lm
from dsd import modes
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.controller.interface import ControllerConfig, Decision
from dsd.controller.model_based import best_decision
from dsd.drive.generation import generate_ar
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from dsd.modes import AR, CACHED, COLOCATED, EDGE, NOWHERE, PIPELINED, SERVER, SYNC, Mode, get_mode, register
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis.points import add_predictions
from orchestrator.report import plots
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.plan import plan_points
from dsd.drive.driver import DriverConfig

TIMES = {"t_ar_s": 0.010, "t_draft_edge_s": 0.004, "t_draft_server_s": 0.002, "t_verify_s": 0.012}
PARAMS = ComputeTimes.from_dict({**TIMES, "t_verify_s": {1: 0.011, 4: 0.012}})


def _toy_per_token_s(
    alpha, gamma, rtt_s, *, t_ar_s, t_draft_edge_s, t_draft_server_s, t_verify_s, cache_hit_rate=None, cache_fill_s=None
):
    """Synchronous DSD that always proposes one token."""
    return lm.per_token_sync_dsd_s(alpha, 1, t_draft_edge_s, t_verify_s, rtt_s)


class OneTokenPolicy:
    """The toy mode's driver policy: every round drafts one token, whatever gamma was configured."""

    def __init__(self, config: ControllerConfig) -> None:
        self.decision = Decision(1, "toy")

    def observe(self, observation) -> None:
        pass

    def decide(self) -> Decision:
        return self.decision


TOY = Mode(
    "toy", EDGE, False, _toy_per_token_s, "toy DSD (gamma 1)", "tab:purple", plannable=True, policy=OneTokenPolicy
)


@pytest.fixture
def toy():
    register(TOY)
    try:
        yield TOY
    finally:
        modes.unregister(TOY.name)


def test_the_four_modes_of_reference_md_and_where_they_draft():
    assert modes.names()[:4] == modes.BUILTIN == (AR, COLOCATED, SYNC, PIPELINED)
    assert [get_mode(n).drafts for n in modes.BUILTIN] == [NOWHERE, SERVER, EDGE, EDGE]
    assert modes.edge_modes() == (SYNC, PIPELINED, CACHED)
    assert modes.server_modes() == (AR, COLOCATED)
    assert modes.speculative_modes() == (COLOCATED, SYNC, PIPELINED, CACHED)
    assert modes.gammaless_modes() == (AR,)
    assert modes.plan_modes() == (AR, SYNC, PIPELINED)
    assert [n for n in modes.BUILTIN if get_mode(n).pipelined] == [PIPELINED]
    assert [n for n in modes.names() if get_mode(n).cache] == [CACHED], "the cached mode: not one of the four"


def test_each_mode_predicts_with_its_closed_form():
    alpha, gamma, rtt_s, t = 0.8, 4, 0.03, TIMES
    expected = {
        AR: t["t_ar_s"],
        COLOCATED: lm.per_token_colocated_s(alpha, gamma, t["t_draft_server_s"], t["t_verify_s"]),
        SYNC: lm.per_token_sync_dsd_s(alpha, gamma, t["t_draft_edge_s"], t["t_verify_s"], rtt_s),
        PIPELINED: lm.per_token_pipelined_dsd_s(alpha, gamma, t["t_draft_edge_s"], t["t_verify_s"], rtt_s),
    }
    for name, want in expected.items():
        assert modes.predict_per_token_s(name, alpha, gamma, rtt_s, **t) == pytest.approx(want)
        # compute times as the analysis holds them give the same terms
        assert modes.predict_per_token_s(name, alpha, gamma, rtt_s, **PARAMS.closed_form_terms(gamma)) == pytest.approx(
            want
        )


def test_a_misspelt_time_is_an_error_not_ignored():
    with pytest.raises(TypeError):
        get_mode(SYNC).per_token_s(
            0.8, 4, 0.01, t_ar_s=0.01, t_draft_edge_s=0.004, t_draft_server_s=None, t_verfy_s=0.01
        )


def test_an_unknown_mode_names_itself_and_the_known_ones():
    with pytest.raises(ValueError) as error:
        get_mode("speculative")
    assert "'speculative'" in str(error.value) and "'ar', 'colocated', 'sync', 'pipelined'" in str(error.value)
    with pytest.raises(ValueError, match="modes"):
        Experiment(name="x", modes=("ar", "asynchronous"))


def test_a_mode_is_validated_on_construction_and_registered_once():
    with pytest.raises(ValueError, match="drafts"):
        Mode("bad", "cloud", False, _toy_per_token_s, "bad", "k")
    with pytest.raises(ValueError, match="pipelined"):
        Mode("bad", SERVER, True, _toy_per_token_s, "bad", "k")  # only the edge drafts ahead
    with pytest.raises(ValueError, match="label"):
        Mode("bad", EDGE, False, _toy_per_token_s, "", "k")
    with pytest.raises(ValueError, match="registered already"):
        register(Mode(SYNC, EDGE, False, _toy_per_token_s, "again", "k"))
    with pytest.raises(ValueError, match="toy"):
        modes.unregister("toy")  # not registered outside the fixture


def test_a_registered_toy_mode_passes_validation_and_joins_the_grid(toy):
    experiment = Experiment(name="toy", modes=(AR, "toy"), gamma=(2, 4), rtt_ms=(0.0, 20.0), profile="toy-edge-cloud")
    planned = [(p.mode, p.gamma) for p in plan_points(experiment)]
    # A speculative mode runs at every gamma; AR once per RTT.
    assert sorted(set(planned)) == [(AR, 2), ("toy", 2), ("toy", 4)]
    assert "toy" in modes.edge_modes() and "toy" in modes.plan_modes()
    # The edge drafts in it, so an adaptive controller may run it too.
    Experiment(name="toy", modes=("toy",), controller="heuristic", profile="toy-edge-cloud")


def test_a_registered_toy_mode_is_predicted_in_the_analysis_and_by_the_controller(toy):
    points = pd.DataFrame(
        [{"mode": m, "rtt_ms": r, "gamma": 4, "per_token_ms_p50": 5.0} for m in (SYNC, "toy") for r in (0.0, 40.0)]
    )
    predicted = add_predictions(points, 0.8, PARAMS).set_index(["mode", "rtt_ms"])["per_token_ms_predicted"]
    for rtt_ms in (0.0, 40.0):
        toy_s = lm.per_token_sync_dsd_s(0.8, 1, PARAMS.t_draft_edge_s, PARAMS.t_verify_s(4), rtt_ms / 1e3)
        assert predicted["toy", rtt_ms] == pytest.approx(1e3 * toy_s)
        assert predicted["toy", rtt_ms] != pytest.approx(predicted[SYNC, rtt_ms])
    # At a long RTT and a good draft, sync with a long block beats one token per round trip.
    decision, _ = best_decision(0.9, 0.2, 0.004, 0.012, ("toy", SYNC), gamma_max=8)
    assert decision.mode == SYNC and decision.gamma > 1
    ControllerConfig("model", 4, "toy", 8, modes=("toy", SYNC))


def test_a_registered_toy_mode_gets_its_label_and_colour_in_the_plots(toy, tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    points = pd.DataFrame(
        [
            {"mode": m, "rtt_ms": r, "gamma": 4, "per_token_ms_p50": 5.0 + r / 10}
            for m in (AR, SYNC, "toy")
            for r in (0.0, 20.0, 40.0)
        ]
    )
    plots.plot_latency_vs_rtt(points, 4, 0.8, PARAMS, {}, {}, tmp_path / "l.png", "toy", "sim")
    assert (tmp_path / "l.png").exists()
    labels = figures[0].axes[0].get_legend_handles_labels()[1]
    assert "toy DSD (gamma 1) (simulated)" in labels
    assert {"cloud AR (simulated)", "synchronous DSD (simulated)"} <= set(labels)
    lines = [line for line in figures[0].axes[0].get_lines() if line.get_color() == "tab:purple"]
    assert lines and math.isfinite(lines[0].get_ydata()[0])


def test_a_registered_toy_mode_runs_its_policy_in_the_one_driver(toy):
    """The driver (dsd/drive/driver.py, the edge service's loop too) asks the mode for its plan: every
    round proposes one token although gamma 4 is configured, the output is the target's own, and
    the time per token is the toy's closed form."""
    config = SyntheticConfig(alpha=0.8, seed=3)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    costs = LinkCosts(t_draft_s=0.004, t_verify_s=0.010, rtt_s=0.02)
    total_s, tokens, rounds = 0.0, 0, []
    for i in range(8):
        prompt = [i + 1, 2, 3]
        run = simulate_dsd(draft, target, prompt, StopRule(200), costs, DriverConfig(4, "toy"), seq_id=str(i))
        assert run.generation.tokens == generate_ar(target, prompt, StopRule(200), seq_id=f"ar{i}").tokens
        assert {(r.proposed, r.gamma, r.mode) for r in run.generation.rounds} == {(1, 1, "toy")}
        total_s += run.total_s - run.first_token_s
        tokens += len(run.generation.tokens) - run.generation.rounds[0].emitted
        rounds += run.generation.rounds
    alpha = sum(r.accepted for r in rounds) / sum(r.proposed for r in rounds)
    predicted_s = get_mode("toy").per_token_s(
        alpha,
        4,
        costs.rtt_s,
        t_ar_s=None,
        t_draft_edge_s=costs.t_draft_s,
        t_draft_server_s=None,
        t_verify_s=costs.t_verify_s,
    )
    assert total_s / tokens == pytest.approx(predicted_s, rel=0.03)


def test_a_registered_toy_mode_runs_through_a_sim_sweep_with_its_own_policy(toy, tmp_path):
    """The whole pipeline with nothing but the registration: the sim testbed runs the toy mode's
    points through the one driver, so every round of them proposes one token."""
    from orchestrator.running.run import run_experiment

    experiment = Experiment(
        name="toy-sweep",
        launcher="sim",
        modes=(SYNC, "toy"),
        gamma=(4,),
        rtt_ms=(10.0,),
        requests=2,
        warmup_requests=0,
        max_new_tokens=24,
        prompt_tokens=8,
        profile="toy-edge-cloud",
    )
    run_experiment(experiment, tmp_path, resume=False)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    toy_rounds = rounds[rounds["mode"] == "toy"]
    assert len(toy_rounds) > 0 and set(toy_rounds["proposed"]) == {1} and set(toy_rounds["round_gamma"]) == {1}
    assert set(rounds[rounds["mode"] == SYNC]["proposed"]) == {4}
