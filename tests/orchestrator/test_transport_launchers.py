"""The frame transport (services/frames.py, experiment key ``transport = "tcp"``) through the
launchers: the same greedy tokens as the target's, and on netns the frame connection's round
trips carry the shaped link's delay (the shapers select by interface and address, so the data
path cannot bypass them)."""

import os

import pandas as pd
import pytest

from dsd.backends.factory import load_pair
from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.running.run import run_experiment
from orchestrator.spec.workload import make_prompts
from tests.link_sweep import check_links_shaped

RTT_MS = 20.0
BASE = {
    "modes": ["ar", "sync", "pipelined"],
    "rtt_ms": [RTT_MS],
    "gamma": [3],
    "clients": [1],
    "edges": 1,
    "requests": 2,
    "warmup_requests": 1,
    "max_new_tokens": 24,
    "prompt_tokens": 8,
    "profile": "toy-edge-cloud",
    "backend": {"kind": "synthetic", "alpha": 0.7},
    "transport": "tcp",
}


def check(experiment, out):
    requests = pd.read_csv(out / "requests.csv")
    assert len(requests) == 3 * 2  # modes x requests
    assert requests["error"].isna().all() or (requests["error"].astype(str).isin(["", "nan"])).all()
    _, target = load_pair(experiment.backend)
    prompts = make_prompts(experiment.backend, 3, experiment.prompt_tokens, experiment.seed)
    for row in requests.itertuples():
        expected = generate_ar(
            target, prompts[row.request_index + 1], StopRule(24, target.eos_token_id), seq_id="ref"
        ).tokens
        assert [int(t) for t in str(row.token_ids).split()] == expected, row.point
    # every sync round waited out the link's round trip, and the probes (on the same frame
    # connection) measured it
    rounds = pd.read_csv(out / "rounds.csv")
    sync = rounds[(rounds["mode"] == "sync") & (rounds["round_index"] > 0)]
    assert len(sync) > 0
    assert ((sync["t_receive_s"] - sync["t_send_s"]) * 1e3 >= 0.95 * RTT_MS).all()
    probes = requests["rtt_probe_ms"]
    assert probes.min() >= 0.95 * RTT_MS and probes.median() < RTT_MS + 5.0, probes


def test_loopback_sweep_over_frames_emits_target_greedy_tokens(tmp_path):
    experiment = experiment_from_dict({"name": "lo-tcp", "launcher": "loopback", **BASE})
    run_experiment(experiment, tmp_path / "lo", resume=False)
    check(experiment, tmp_path / "lo")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_netns_sweep_over_frames_is_shaped_like_the_websocket(tmp_path):
    experiment = experiment_from_dict({"name": "ns-tcp", "launcher": "netns", **BASE})
    run_experiment(experiment, tmp_path / "ns", resume=False)
    check(experiment, tmp_path / "ns")
    check_links_shaped(tmp_path / "ns")
