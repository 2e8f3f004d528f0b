"""The experiment key controller_modes: a sweep's adaptive controller may hand requests to the
server (cloud AR), on the sim launcher and on a network launcher alike, each client on its own
link deciding for itself; greedy output stays the target's."""
import json
import os

import pandas as pd
import pytest

from dsd.backends.factory import load_pair
from dsd.decoding import generate_ar
from dsd.stopping import StopRule
from orchestrator.experiment import experiment_from_dict
from orchestrator.run import run_experiment
from orchestrator.workload import make_prompts

# paper-cap-td1: edge draft 1 ms, t_verify = t_ar = 20 ms. At alpha 0.9 DSD wins clearly at 5 ms
# RTT and cloud AR at 300 ms (a DSD round costs the RTT, AR pays it once per request).
BASE = {"name": "handover", "profile": "paper-cap-td1", "gamma": [4], "modes": ["sync"], "requests": 4,
        "warmup_requests": 0, "max_new_tokens": 32, "prompt_tokens": 8,
        "backend": {"kind": "synthetic", "alpha": 0.9}, "controller": "model", "gamma_max": 8,
        "controller_modes": ["ar", "sync", "pipelined"]}


@pytest.mark.parametrize("extra,why", [
    ({"controller": "static", "gamma_max": 16}, "none with controller 'static'"),
    ({"controller_modes": ["ar", "turbo"]}, "distinct modes"),
    ({"controller_modes": ["ar", "pipelined"]}, "every mode of modes"),
])
def test_bad_controller_modes_are_refused_naming_the_key(extra, why):
    with pytest.raises(ValueError, match=f"controller_modes.*{why}"):
        experiment_from_dict({**BASE, "rtt_ms": [5], **extra})


def _target_tokens(experiment) -> list[list[int]]:
    _, target = load_pair(experiment.backend)
    prompts = make_prompts(experiment.backend, experiment.requests, experiment.prompt_tokens, experiment.seed)
    return [generate_ar(target, p, StopRule(experiment.max_new_tokens, target.eos_token_id), seq_id=f"r{i}").tokens
            for i, p in enumerate(prompts)]


def _modes_by_request(rounds: pd.DataFrame, by: str) -> dict:
    live = rounds[~rounds["stale"].astype(bool)]
    return {key: sorted(set(g["round_mode"])) for key, g in live.groupby([by, "request_index"])}


def _assert_greedy(requests: pd.DataFrame, expected: list[list[int]]) -> None:
    for row in requests.itertuples():
        assert [int(t) for t in str(row.token_ids).split()] == expected[row.request_index], row


def test_the_sim_sweeps_controller_hands_far_requests_to_cloud_ar_and_learns_across_requests(tmp_path):
    experiment = experiment_from_dict({**BASE, "rtt_ms": [5, 300]})
    out = tmp_path / "sim"
    run_experiment(experiment, out, resume=False)
    assert json.loads((out / "sweep.json").read_text())["experiment"]["controller_modes"] == ["ar", "sync", "pipelined"]
    modes = _modes_by_request(pd.read_csv(out / "rounds.csv"), "rtt_ms")
    # The first request measures the link in DSD; from the second on, the far point runs on the server.
    assert all(modes[(300, i)] == ["ar"] for i in (1, 2, 3)), modes
    assert all("ar" not in modes[(5, i)] for i in range(4)), modes
    _assert_greedy(pd.read_csv(out / "requests.csv"), _target_tokens(experiment))


def run_two_links(launcher: str, out) -> None:
    """Two clients on two edges of one verifier, one at 5 ms and one at 300 ms: only the far one's
    controller moves its requests to cloud AR, and its AR requests are faster than its first
    (DSD) one; every request emits the target's greedy tokens."""
    experiment = experiment_from_dict({**BASE, "launcher": launcher, "rtt_ms": [5], "clients": [2], "edges": 2,
                                       "link": {"edges": [{"rtt_ms": 5}, {"rtt_ms": 300}]}})
    run_experiment(experiment, out, resume=False)
    modes = _modes_by_request(pd.read_csv(out / "rounds.csv"), "client_id")
    assert all(modes[(1, i)] == ["ar"] for i in (1, 2, 3)), modes
    assert all("ar" not in modes[(0, i)] for i in range(4)), modes
    requests = pd.read_csv(out / "requests.csv")
    far = requests[requests["client_id"] == 1].set_index("request_index")["wall_s"]
    assert far.loc[[1, 2, 3]].max() < far.loc[0]
    _assert_greedy(requests, _target_tokens(experiment))


def test_each_client_on_loopback_adapts_to_its_own_link(tmp_path):
    run_two_links("loopback", tmp_path / "lo")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_each_client_on_netns_adapts_to_its_own_shaped_link(tmp_path):
    run_two_links("netns", tmp_path / "ns")
