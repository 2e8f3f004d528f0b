"""Open-loop load: arrival processes at their configured rate and burstiness, and [load]/[slo]
keys checked with one line naming the bad one."""

import numpy as np
import pytest
from scipy import stats

from orchestrator.spec.experiment import experiment_from_dict, load_experiment
from orchestrator.spec.arrivals import LoadConfig, SloConfig, arrival_times_s, assign_edges, gamma_gaps_s, schedule
from tests.checks import every

BASE = {
    "name": "serve",
    "launcher": "sim",
    "modes": ["sync"],
    "profile": "toy-edge-cloud",
    "backend": {"kind": "synthetic", "alpha": 0.8},
}


def test_poisson_gaps_pass_a_ks_test_against_the_exponential_at_the_rate():
    config = LoadConfig(arrival_process="poisson", rate_rps=(4.0,), requests=2000)
    gaps = np.diff(arrival_times_s(config, 4.0, seed=3), prepend=0.0)
    result = stats.kstest(gaps, "expon", args=(0, 1 / 4.0))
    assert result.pvalue > 0.01
    assert abs(gaps.mean() - 0.25) < 0.02
    # the same test rejects a rate 20% off: the test has the power to see a wrong rate
    assert stats.kstest(gaps, "expon", args=(0, 1 / 5.0)).pvalue < 0.01


def test_gamma_gaps_have_the_configured_cv_and_mean():
    for cv in (0.5, 2.0, 4.0):
        gaps = gamma_gaps_s(2.0, cv, 40_000, np.random.default_rng(7))
        assert gaps.mean() == pytest.approx(0.5, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)


def test_arrivals_are_seeded_and_a_duration_bounds_them():
    config = LoadConfig(arrival_process="gamma_gaps", rate_rps=(3.0,), cv=2.0, duration_s=20.0, warmup_s=2.0)
    a, b = schedule(config, 3.0, 4, 32, seed=1), schedule(config, 3.0, 4, 32, seed=1)
    assert a == b and a != schedule(config, 3.0, 4, 32, seed=2)
    assert every(r.arrival_s < 20.0 for r in a) and 30 < len(a) < 90
    assert [r.warmup for r in a] == [r.arrival_s < 2.0 for r in a]
    assert [r.edge for r in a[:6]] == [0, 1, 2, 3, 0, 1]


def test_weighted_assignment_follows_the_weights():
    config = LoadConfig(rate_rps=(1.0,), requests=10, assignment="weighted", weights=(3.0, 1.0, 0.0))
    edges = assign_edges(8000, 3, config, seed=0)
    assert np.bincount(edges, minlength=3)[2] == 0
    assert (edges == 0).mean() == pytest.approx(0.75, abs=0.02)


def test_a_trace_gives_its_own_times(tmp_path):
    (tmp_path / "arrivals.csv").write_text("arrival_s\n0.5\n0.1\n2.0\n")
    (tmp_path / "serve.toml").write_text(
        'name = "serve"\nprofile = "toy-edge-cloud"\nmodes = ["sync"]\n'
        '[load]\narrival_process = "trace"\ntrace = "arrivals.csv"\n'
    )  # beside the file
    experiment = load_experiment(tmp_path / "serve.toml")
    assert list(arrival_times_s(experiment.load, None, 0)) == [0.1, 0.5, 2.0]


@pytest.mark.parametrize(
    "table,body,names",
    [
        ("load", {"rat_rps": [1.0], "duration_s": 10}, "rat_rps"),
        ("load", {"rate_rps": [1.0], "duration_s": 10, "cv": 2.0}, "load.cv"),
        ("load", {"rate_rps": [-1.0], "duration_s": 10}, "load.rate_rps"),
        ("load", {"rate_rps": [1.0]}, "load.duration_s"),
        ("load", {"rate_rps": [1.0], "duration_s": 10, "assignment": "nearest"}, "load.assignment"),
        ("slo", {"ttft_ms": 500, "atainment": 0.9}, "atainment"),
        ("slo", {"ttft_ms": 500, "attainment": 90}, "slo.attainment"),
        ("slo", {}, "slo.ttft_ms"),
    ],
)
def test_a_bad_load_or_slo_key_gets_one_line_naming_it(table, body, names):
    data = {**BASE, "load": {"rate_rps": [1.0], "duration_s": 10}, table: body}
    with pytest.raises(ValueError) as error:
        experiment_from_dict(data, source="serve.toml")
    message = str(error.value)
    assert "\n" not in message and names in message and message.startswith("serve.toml")


@pytest.mark.parametrize(
    "body,new", [({"arrival": "poisson"}, "arrival_process"), ({"arrival_process": "gamma", "cv": 2.0}, "'gamma_gaps'")]
)
def test_the_renamed_arrival_key_and_gamma_value_are_refused_naming_the_new_name(body, new):
    data = {**BASE, "load": {"rate_rps": [1.0], "duration_s": 10, **body}}
    with pytest.raises(ValueError) as error:
        experiment_from_dict(data, source="serve.toml")
    message = str(error.value)
    assert "\n" not in message and new in message and message.startswith("serve.toml"), message


def test_a_sweep_recorded_before_the_rename_reads_as_the_same_arrival_process():
    from orchestrator.open_loop.commands import recorded_load

    old = {"arrival": "gamma", "cv": 2.0, "rate_rps": [1.0], "duration_s": 10}
    assert recorded_load(old) == {"arrival_process": "gamma_gaps", "cv": 2.0, "rate_rps": [1.0], "duration_s": 10}
    assert experiment_from_dict({**BASE, "load": recorded_load(old)}).load.arrival_process == "gamma_gaps"


def test_without_load_the_experiment_stays_closed_loop():
    experiment = experiment_from_dict(dict(BASE))
    assert experiment.load is None and experiment.slo is None


def test_slo_met_checks_every_bound_given():
    slo = SloConfig(ttft_ms=500, tpot_ms=60)
    assert slo.met(0.4, 0.05, 10.0) and not slo.met(0.6, 0.05, 1.0) and not slo.met(0.4, 0.07, 1.0)
    assert slo.met(0.4, float("nan"), 1.0)


def test_output_lengths_are_drawn_from_an_earlier_runs_answers(tmp_path):
    (tmp_path / "requests.csv").write_text("request_index,tokens\n0,10\n1,40\n2,200\n")
    config = LoadConfig(rate_rps=(1.0,), requests=3000, output="lengths", lengths_csv=str(tmp_path / "requests.csv"))
    lengths = [a.max_tokens for a in schedule(config, 1.0, 2, 64, seed=0)]
    assert set(lengths) == {10, 40, 64}  # drawn from the file, capped at max_new_tokens
    assert lengths.count(64) == pytest.approx(1000, rel=0.1)
    with pytest.raises(ValueError, match="load.lengths_csv"):
        LoadConfig(rate_rps=(1.0,), requests=3, output="lengths", lengths_csv=str(tmp_path / "missing.csv"))
