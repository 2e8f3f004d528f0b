"""The experiment keys of adaptive DSD: controller and gamma_max are validated, reach the sim
launcher, and leave a static sweep's records as they were."""

import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.running.run import run_experiment
from orchestrator.records.sweep_folder import experiment_record

BASE = {
    "name": "adaptive",
    "profile": "toy-edge-cloud",
    "rtt_ms": [20],
    "gamma": [2],
    "modes": ["sync", "pipelined"],
    "requests": 2,
    "max_new_tokens": 40,
    "prompt_tokens": 8,
    "backend": {"kind": "synthetic", "alpha": 0.8},
}


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"controller": "bandito"}, "controller"),
        ({"controller": "model", "gamma_max": 0}, "gamma_max"),
        ({"controller": "heuristic", "gamma": [8], "gamma_max": 4}, "gamma"),
        ({"controller": "model", "modes": ["ar", "sync"]}, "modes"),
    ],
)
def test_bad_controller_keys_are_refused_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=field):
        experiment_from_dict({**BASE, **extra})


def test_a_static_sweep_records_no_controller_keys():
    record = experiment_record(experiment_from_dict(BASE))
    assert "controller" not in record and "gamma_max" not in record
    assert experiment_record(experiment_from_dict({**BASE, "controller": "heuristic"}))["controller"] == "heuristic"


def test_the_heuristic_controller_changes_gamma_per_round_on_the_sim_launcher(tmp_path):
    run_experiment(
        experiment_from_dict({**BASE, "controller": "heuristic", "gamma_max": 6}), tmp_path / "h", resume=False
    )
    rounds = pd.read_csv(tmp_path / "h" / "rounds.csv")
    live = rounds[~rounds["stale"].astype(bool)]
    assert (live["proposed"] == live["round_gamma"]).all()
    assert live["round_gamma"].nunique() >= 3 and set(live["round_mode"]) == {"sync", "pipelined"}
    run_experiment(experiment_from_dict(BASE), tmp_path / "s", resume=False)
    static = pd.read_csv(tmp_path / "s" / "rounds.csv")
    assert set(static.loc[~static["stale"].astype(bool), "round_gamma"]) == {2}


def test_the_controller_key_reaches_the_edge_on_a_network_launcher(tmp_path):
    """Loopback: the edge services run the heuristic; greedy output stays the target's and the
    merged rounds.csv shows the per-round plans."""
    from dsd.backends.factory import load_pair
    from dsd.drive.generation import generate_ar
    from dsd.speculation.stopping import StopRule
    from orchestrator.spec.workload import make_prompts

    experiment = experiment_from_dict(
        {
            **BASE,
            "launcher": "loopback",
            "rtt_ms": [10],
            "clients": [1],
            "edges": 1,
            "warmup_requests": 0,
            "controller": "heuristic",
            "gamma_max": 6,
        }
    )
    run_experiment(experiment, tmp_path / "lo", resume=False)
    rounds = pd.read_csv(tmp_path / "lo" / "rounds.csv")
    live = rounds[~rounds["stale"].astype(bool)]
    assert (live["proposed"] == live["round_gamma"]).all() and live["round_gamma"].nunique() >= 3
    _, target = load_pair(experiment.backend)
    prompts = make_prompts(experiment.backend, 2, experiment.prompt_tokens, experiment.seed)
    requests = pd.read_csv(tmp_path / "lo" / "requests.csv")
    assert len(requests) == 2 * 2  # modes x requests
    for row in requests.itertuples():
        expected = generate_ar(
            target, prompts[row.request_index], StopRule(40, target.eos_token_id), seq_id=f"r{row.request_index}"
        ).tokens
        assert [int(t) for t in str(row.token_ids).split()] == expected, row.point
