"""The experiment key controller_modes: a sweep's adaptive controller may hand requests to the
server (cloud AR), on the sim launcher and on a network launcher alike, each client on its own
link deciding for itself; greedy output stays the target's."""

import json
import os

import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.running.run import run_experiment
from tests.orchestrator.controller_runs import BASE, assert_greedy, modes_by_request, run_two_links, target_tokens
from tests.checks import every


@pytest.mark.parametrize(
    "extra,why",
    [
        ({"controller": "static", "gamma_max": 16}, "none with controller 'static'"),
        ({"controller_modes": ["ar", "turbo"]}, "distinct modes"),
        ({"controller_modes": ["ar", "pipelined"]}, "every mode of modes"),
    ],
)
def test_bad_controller_modes_are_refused_naming_the_key(extra, why):
    with pytest.raises(ValueError, match=f"controller_modes.*{why}"):
        experiment_from_dict({**BASE, "rtt_ms": [5], **extra})


def test_the_sim_sweeps_controller_hands_far_requests_to_cloud_ar_and_learns_across_requests(tmp_path):
    experiment = experiment_from_dict({**BASE, "rtt_ms": [5, 300]})
    out = tmp_path / "sim"
    run_experiment(experiment, out, resume=False)
    assert json.loads((out / "sweep.json").read_text())["experiment"]["controller_modes"] == ["ar", "sync", "pipelined"]
    modes = modes_by_request(pd.read_csv(out / "rounds.csv"), "rtt_ms")
    # The first request measures the link in DSD; from the second on, the far point runs on the server.
    assert every(modes[(300, i)] == ["ar"] for i in (1, 2, 3)), modes
    assert every("ar" not in modes[(5, i)] for i in range(4)), modes
    assert_greedy(pd.read_csv(out / "requests.csv"), target_tokens(experiment))


def test_each_client_on_loopback_adapts_to_its_own_link(tmp_path):
    run_two_links("loopback", tmp_path / "lo")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_each_client_on_netns_adapts_to_its_own_shaped_link(tmp_path):
    run_two_links("netns", tmp_path / "ns")
