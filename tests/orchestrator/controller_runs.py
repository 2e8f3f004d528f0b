"""Runs of the controller's request-level choice on a launcher, and checks of their output,
shared by the orchestrator's and the compose launcher's tests."""

import pandas as pd

from dsd.backends.factory import load_pair
from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.running.run import run_experiment
from orchestrator.spec.workload import make_prompts
from tests.checks import every

# paper-cap-td1: edge draft 1 ms, t_verify = t_ar = 20 ms. At alpha 0.9 DSD wins clearly at 5 ms
# RTT and cloud AR at 300 ms (a DSD round costs the RTT, AR pays it once per request).
BASE = {
    "name": "handover",
    "profile": "paper-cap-td1",
    "gamma": [4],
    "modes": ["sync"],
    "requests": 4,
    "warmup_requests": 0,
    "max_new_tokens": 32,
    "prompt_tokens": 8,
    "backend": {"kind": "synthetic", "alpha": 0.9},
    "controller": "model",
    "gamma_max": 8,
    "controller_modes": ["ar", "sync", "pipelined"],
}


def target_tokens(experiment) -> list[list[int]]:
    _, target = load_pair(experiment.backend)
    prompts = make_prompts(experiment.backend, experiment.requests, experiment.prompt_tokens, experiment.seed)
    return [
        generate_ar(target, p, StopRule(experiment.max_new_tokens, target.eos_token_id), seq_id=f"r{i}").tokens
        for i, p in enumerate(prompts)
    ]


def modes_by_request(rounds: pd.DataFrame, by: str) -> dict:
    live = rounds[~rounds["stale"].astype(bool)]
    return {key: sorted(set(g["round_mode"])) for key, g in live.groupby([by, "request_index"])}


def assert_greedy(requests: pd.DataFrame, expected: list[list[int]]) -> None:
    assert len(requests), "no request rows"
    for row in requests.itertuples():
        assert [int(t) for t in str(row.token_ids).split()] == expected[row.request_index], row


def run_two_links(launcher: str, out) -> None:
    """Two clients on two edges of one verifier, one at 5 ms and one at 300 ms: only the far one's
    controller moves its requests to cloud AR, and its AR requests are faster than its first
    (DSD) one; every request emits the target's greedy tokens."""
    experiment = experiment_from_dict(
        {
            **BASE,
            "launcher": launcher,
            "rtt_ms": [5],
            "clients": [2],
            "edges": 2,
            "link": {"edges": [{"rtt_ms": 5}, {"rtt_ms": 300}]},
        }
    )
    run_experiment(experiment, out, resume=False)
    modes = modes_by_request(pd.read_csv(out / "rounds.csv"), "client_id")
    assert every(modes[(1, i)] == ["ar"] for i in (1, 2, 3)), modes
    assert every("ar" not in modes[(0, i)] for i in range(4)), modes
    requests = pd.read_csv(out / "requests.csv")
    far = requests[requests["client_id"] == 1].set_index("request_index")["wall_s"]
    assert far.loc[[1, 2, 3]].max() < far.loc[0]
    assert_greedy(requests, target_tokens(experiment))
