"""The sim launcher with several clients per point: one shared verifier (dsd.simulation.many_clients),
rows per client as the network launchers write them, and the limits refused naming the key."""

import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.simulation.many_clients import MAX_CLIENTS
from dsd.drive.batching import BatchingConfig
from dsd.costs.compute_times import ComputeTimes
from orchestrator.launchers.base import PointSettings
from orchestrator.launchers.sim import SimTestbed, check_clients_settings
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.spec.plan import Point

GAMMA, T_VERIFY_S, T_DRAFT_EDGE_S = 3, 0.010, 0.002
TIMES = ComputeTimes(
    T_DRAFT_EDGE_S, 0.001, 0.02, t_prefill_per_token_s=0.0, t_verify_by_gamma_s={GAMMA: T_VERIFY_S}, batch_slope=0.5
)


def sim_testbed(alpha: float = 1.0, max_batch: int = 1) -> SimTestbed:
    config = SyntheticConfig(alpha=alpha, seed=1)
    return SimTestbed(SyntheticLM(config, "draft"), SyntheticLM(config, "target"), TIMES, BatchingConfig(max_batch))


def run(
    clients: int,
    rtt_ms: float = 20.0,
    mode: str = "sync",
    warmup: int = 1,
    requests: int = 3,
    max_batch: int = 1,
    alpha: float = 1.0,
):
    point = Point(mode, rtt_ms, GAMMA, clients, 0)
    prompts = [[i + 1, 2, 3] for i in range(warmup + requests)]
    return sim_testbed(alpha, max_batch).run_point(
        point, prompts, PointSettings(warmup=warmup, max_new_tokens=40, max_in_flight=1)
    )


def test_each_client_is_a_run_with_its_own_client_id_and_every_request_after_the_warm_up():
    rounds, requests, links, extra = run(clients=3)
    assert sorted({r["client_id"] for r in requests}) == ["0", "1", "2"]
    assert len({r["run_id"] for r in requests}) == 3
    for client in ("0", "1", "2"):
        assert sorted(r["request_index"] for r in requests if r["client_id"] == client) == [0, 1, 2]
    assert {r["client_id"] for r in rounds} == {"0", "1", "2"}
    # the virtual clock's trace, as a network launcher's rows carry the real one
    assert all(r["t_draft_start_s"] < r["t_draft_end_s"] <= r["t_send_s"] < r["t_receive_s"] for r in rounds)
    assert all(r["server_queue_s"] >= 0 and r["server_compute_s"] == pytest.approx(T_VERIFY_S) for r in rounds)
    assert {r["server_batch_size"] for r in rounds} == {1}
    assert {r["link_rtt_configured_ms"] for r in requests} == {20.0}


def test_the_per_token_time_in_the_rows_is_the_closed_networks_cycle():
    """Sync DSD at alpha 1, 20 ms RTT: think Z = gamma t_draft + RTT = 26 ms, service t_verify
    = 10 ms: 2 clients go round in max(20, 36) ms, 6 clients in max(60, 36) ms, gamma + 1 tokens
    a round. One request each: the clients start together and stay in step (where one opens its
    next request, the others have the verifier to themselves for a round trip)."""
    for clients in (2, 6):
        _, requests, _, _ = run(clients, warmup=0, requests=1)
        cycle_s = max(clients * T_VERIFY_S, T_VERIFY_S + GAMMA * T_DRAFT_EDGE_S + 0.020)
        assert [r["steady_per_token_s"] for r in requests] == pytest.approx(
            [cycle_s / (GAMMA + 1)] * len(requests), rel=1e-9
        )


def test_a_batched_verifier_takes_the_waiting_clients_in_one_pass():
    """4 clients, max_batch 4: one pass of 4 at t_v (1 + 0.5 * 3) = 25 ms, think 26 ms."""
    rounds, requests, _, _ = run(clients=4, max_batch=4, warmup=0, requests=1)
    assert {r["server_batch_size"] for r in rounds} == {4}
    cycle_s = T_VERIFY_S * 2.5 + GAMMA * T_DRAFT_EDGE_S + 0.020
    assert [r["steady_per_token_s"] for r in requests] == pytest.approx([cycle_s / (GAMMA + 1)] * 4, rel=1e-9)


def test_one_client_keeps_the_single_client_rows():
    rounds, requests, _, _ = run(clients=1, alpha=0.7)
    assert {r["run_id"] for r in requests} == {"sim-sync_rtt20ms_g3_c1_r0"}
    assert all(r["t_receive_s"] is None or r["t_receive_s"] != r["t_receive_s"] for r in rounds)


@pytest.mark.parametrize(
    "clients, controller, word",
    [
        (MAX_CLIENTS + 1, "static", "clients"),
        (2, "heuristic", "controller"),
    ],
)
def test_what_the_shared_verifier_cannot_run_is_refused_naming_the_setting(clients, controller, word):
    with pytest.raises(ValueError, match=word):
        check_clients_settings(clients, controller)


def test_the_sim_launcher_takes_thousands_of_clients_and_the_network_launchers_256():
    base = {
        "name": "c",
        "modes": ["sync"],
        "rtt_ms": [10],
        "gamma": [3],
        "profile": "toy-edge-cloud",
        "backend": {"kind": "synthetic", "alpha": 0.7},
    }
    assert experiment_from_dict({**base, "launcher": "sim", "clients": [1, MAX_CLIENTS]}).clients[-1] == MAX_CLIENTS
    for launcher, clients in (("sim", MAX_CLIENTS + 1), ("netns", 257)):
        with pytest.raises(ValueError, match="clients"):
            experiment_from_dict({**base, "launcher": launcher, "clients": [clients]})
