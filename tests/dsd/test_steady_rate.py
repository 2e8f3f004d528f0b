"""One steady per-token rate (dsd.costs.compute_times.steady_per_token_s): a co-located request's first emission
is a whole accepted run, and the controller learns the rate requests.csv records, not another."""

from types import SimpleNamespace

import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.controller.interface import Decision, RequestObservation
from dsd.speculation.stopping import StopRule
from dsd.costs.compute_times import ComputeTimes, steady_per_token_s
from orchestrator.launchers.sim import request_row, SimClient, SimRequest, run_request

GAMMA = 3
TIMES = ComputeTimes(0.004, 0.002, 0.020, t_prefill_per_token_s=0.0, t_verify_by_gamma_s={GAMMA: 0.010})


class Recording:
    """A controller that sends every request to co-located SD and keeps what it observes."""

    config = SimpleNamespace(modes=("colocated", "sync"), gamma_max=16)

    def __init__(self) -> None:
        self.seen: list[RequestObservation] = []

    def decide_request(self, rtt_s: float) -> Decision:
        return Decision(GAMMA, "colocated")

    def observe_request(self, observation: RequestObservation) -> None:
        self.seen.append(observation)


def test_the_controller_and_requests_csv_agree_on_a_colocated_request_whose_first_emission_is_several_tokens():
    config = SyntheticConfig(alpha=1.0, seed=3)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    policy = Recording()
    prompt = [5, 9, 2, 7]
    tokens, rounds, wall_s, ttft_s = run_request(
        SimClient(draft, target, TIMES, StopRule(max_new_tokens=24), max_in_flight=2),
        SimRequest("colocated", GAMMA, prompt, "steady"),
        lambda _t: 0.010,
        policy,
    )
    assert rounds[0].emitted == GAMMA + 1, "alpha 1: the first round emits the whole block and its bonus"
    keys = {"run_id": "r", "client_id": "c", "request_index": 0, "mode": "colocated", "gamma": GAMMA}
    row = request_row(keys, prompt, tokens, rounds, wall_s, ttft_s)
    [seen] = policy.seen
    assert seen.first_emitted == GAMMA + 1
    assert seen.steady_per_token_s == pytest.approx(row.steady_per_token_s)
    assert row.steady_per_token_s == pytest.approx((wall_s - ttft_s) / (len(tokens) - GAMMA - 1))


def test_the_rate_is_undefined_without_an_emission_after_the_first():
    assert steady_per_token_s(0.5, 1.5, 4) == pytest.approx(0.25)
    assert steady_per_token_s(0.5, 0.5, 0) is None
    assert RequestObservation("colocated", GAMMA, 4, 0.1, 0.1, 0.0, first_emitted=4).steady_per_token_s is None
