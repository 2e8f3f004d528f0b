"""N closed-loop clients on one verifier (dsd.simulation.many_clients): one client is dsd.simulation.one_client's run
to the bit, and with deterministic times the per-token time is the closed network's cycle.

A closed network of N clients, one queue (service S per visit) and a delay (think time Z per
visit), every time deterministic: in steady state each client goes round once per
max(N * S, S + Z). Here one visit is a round: with alpha = 1 a DSD round emits gamma + 1 tokens
and with alpha = 0 one; the clients start together, so from their first verdict on each request
is in steady state and its steady per-token time is the cycle over the tokens of a round."""

import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.simulation.many_clients import MAX_CLIENTS, ClientsSetup, simulate_clients
from dsd.drive.batching import BatchingConfig
from dsd.costs.compute_times import pass_cost_s
from dsd.speculation.stopping import StopRule
from orchestrator.launchers.sim import SimClient, SimRequest, run_request
from dsd.costs.compute_times import ComputeTimes

GAMMA = 4
T_DRAFT_EDGE_S, T_DRAFT_SERVER_S, T_AR_S, T_VERIFY_S = 0.004, 0.002, 0.020, 0.010
TIMES = ComputeTimes(
    T_DRAFT_EDGE_S,
    T_DRAFT_SERVER_S,
    T_AR_S,
    t_prefill_per_token_s=0.0,
    t_verify_by_gamma_s={GAMMA: T_VERIFY_S},
    batch_slope=0.25,
)


def pair(alpha: float):
    config = SyntheticConfig(alpha=alpha, seed=3)
    return SyntheticLM(config, "draft"), SyntheticLM(config, "target")


def per_token_s_of(requests) -> list[float]:
    """Each request's time per token after its first tokens (what requests.csv's steady_per_token_s is)."""
    return [(r.total_s - r.first_token_s) / (len(r.tokens) - r.rounds[0].emitted) for r in requests]


def run(
    mode: str,
    n_clients: int,
    alpha: float,
    rtt_s: float,
    max_batch: int = 1,
    max_new_tokens: int = 100,
    times: ComputeTimes = TIMES,
    t_draft_edge_s: float | None = None,
):
    if t_draft_edge_s is not None:
        times = times.replace(t_draft_edge_s=t_draft_edge_s)
    setup = ClientsSetup(n_clients, mode, GAMMA, times, lambda _t: rtt_s, BatchingConfig(max_batch), max_in_flight=2)
    return simulate_clients(setup, *pair(alpha), [[1, 2, 3]], StopRule(max_new_tokens))


@pytest.mark.parametrize("mode", ["sync", "pipelined", "cached", "ar", "colocated"])
@pytest.mark.parametrize("rtt_s", [0.0, 0.03, 0.2])
def test_one_client_is_the_single_client_simulation_to_the_bit(mode, rtt_s):
    """The shared verifier with one client adds nothing: tokens, rounds and times are those of
    dsd.simulation.one_client's run (the sim launcher's one-client path), prefill and all."""
    times = TIMES.replace(t_prefill_per_token_s=0.0003)
    draft, target = pair(0.6)
    tokens, rounds, wall_s, ttft_s = run_request(
        SimClient(draft, target, times, StopRule(40), max_in_flight=2),
        SimRequest(mode, GAMMA, [5, 6, 7, 8], "single"),
        lambda _t: rtt_s,
    )
    setup = ClientsSetup(1, mode, GAMMA, times, lambda _t: rtt_s, max_in_flight=2)
    [shared] = simulate_clients(setup, draft, target, [[5, 6, 7, 8]], StopRule(40))
    assert shared.tokens == tokens and shared.rounds == rounds
    assert (shared.total_s, shared.first_token_s) == (wall_s, ttft_s)


@pytest.mark.parametrize("n_clients", [1, 2, 3, 4, 6, 10])
@pytest.mark.parametrize("alpha, tokens_per_round", [(1.0, GAMMA + 1), (0.0, 1)])
def test_sync_dsd_on_a_serial_verifier_goes_round_at_the_closed_networks_cycle(n_clients, alpha, tokens_per_round):
    """Service S = t_verify on the shared verifier; think Z = gamma * t_draft_edge + RTT on the
    client's own device and link: per token max(N * S, S + Z) / tokens per round. At RTT 20 ms
    Z = 36 ms, so N <= 4 is think-bound and N >= 5 server-bound."""
    rtt_s = 0.020
    think_s = GAMMA * T_DRAFT_EDGE_S + rtt_s
    cycle_s = max(n_clients * T_VERIFY_S, T_VERIFY_S + think_s)
    requests = run("sync", n_clients, alpha, rtt_s, max_new_tokens=60)
    assert len(requests) == n_clients
    for per_token_s in per_token_s_of(requests):
        assert per_token_s == pytest.approx(cycle_s / tokens_per_round, rel=1e-9)


@pytest.mark.parametrize("n_clients", [1, 2, 5])
def test_the_servers_own_modes_pay_every_clients_steps_on_the_one_verifier(n_clients):
    """Cloud AR: each token is a job of t_ar and the client thinks not at all (the server goes
    on), so per token N * t_ar. Co-located SD: each round is gamma server draft steps and a
    verification, so per token N * (gamma * t_draft_server + t_verify) / (gamma + 1) at alpha 1."""
    [ar] = set(per_token_s_of(run("ar", n_clients, 1.0, 0.05, max_new_tokens=30)))
    [colocated] = set(per_token_s_of(run("colocated", n_clients, 1.0, 0.05)))
    assert ar == pytest.approx(n_clients * T_AR_S, rel=1e-9)
    assert colocated == pytest.approx(n_clients * (GAMMA * T_DRAFT_SERVER_S + T_VERIFY_S) / (GAMMA + 1), rel=1e-9)


def test_pipelined_dsd_on_a_saturated_serial_verifier_gets_its_share_of_the_verifier():
    """Past saturation every DSD mode is the verifier's: N clients share 1 / t_verify blocks a
    second, gamma + 1 tokens each at alpha 1, whatever the edge overlaps."""
    n_clients = 12
    for per_token_s in per_token_s_of(run("pipelined", n_clients, 1.0, 0.02)):
        assert per_token_s == pytest.approx(n_clients * T_VERIFY_S / (GAMMA + 1), rel=1e-9)


@pytest.mark.parametrize("n_clients, max_batch", [(3, 4), (4, 4), (8, 4), (12, 4), (8, 8)])
def test_a_batched_verifier_serves_the_clients_in_batches_at_the_batch_curve(n_clients, max_batch):
    """The clients start together and stay in step, so they go round in ceil(N / B) groups of
    b = min(N, B): per round max(groups * t_v(b), t_v(b) + Z), t_v(b) = t_v (1 + slope (b - 1)).
    Z = 1 + 2 ms here (edge draft steps of 0.25 ms and a 2 ms RTT), so two groups or more are
    server-bound."""
    rtt_s, t_draft_edge_s = 0.002, 0.00025
    batch = min(n_clients, max_batch)
    groups = -(-n_clients // max_batch)
    t_verify_batch_s = TIMES.t_verify_s(GAMMA, batch)
    assert t_verify_batch_s == pytest.approx(T_VERIFY_S * (1 + 0.25 * (batch - 1)))
    cycle_s = max(groups * t_verify_batch_s, t_verify_batch_s + GAMMA * t_draft_edge_s + rtt_s)
    requests = run("sync", n_clients, 1.0, rtt_s, max_batch, t_draft_edge_s=t_draft_edge_s)
    for per_token_s in per_token_s_of(requests):
        assert per_token_s == pytest.approx(cycle_s / (GAMMA + 1), rel=1e-9)


def test_a_batch_of_one_is_the_serial_verifier():
    assert per_token_s_of(run("sync", 6, 1.0, 0.02, max_batch=1)) == per_token_s_of(
        run("sync", 6, 1.0, 0.02, max_batch=1, times=TIMES.replace(batch_slope=None))
    )


def test_every_client_runs_every_prompt_in_turn_and_the_next_starts_when_the_last_ends():
    setup = ClientsSetup(3, "sync", GAMMA, TIMES, lambda _t: 0.01)
    requests = simulate_clients(setup, *pair(0.7), [[1, 2], [3, 4], [5, 6]], StopRule(20))
    assert [(r.client, r.index) for r in requests] == [(c, i) for c in range(3) for i in range(3)]
    for client in range(3):
        mine = [r for r in requests if r.client == client]
        assert mine[0].start_s == 0.0
        for before, after in zip(mine, mine[1:]):
            assert after.start_s >= before.start_s + before.total_s


def test_the_pass_costs_are_the_schedulers():
    assert pass_cost_s(TIMES, "verify", [GAMMA, 2]) == TIMES.t_verify_s(GAMMA, 2)
    assert pass_cost_s(TIMES, "ar", [1, 1, 1]) == TIMES.t_ar_batch_s(3)
    assert pass_cost_s(TIMES, "draft", [GAMMA]) == pytest.approx(GAMMA * T_DRAFT_SERVER_S)
    assert pass_cost_s(TIMES, "stale", [GAMMA]) == 0.0


@pytest.mark.parametrize(
    "changes, word",
    [
        ({"n_clients": MAX_CLIENTS + 1}, "clients"),
        ({"n_clients": 0}, "clients"),
        ({"verifier": BatchingConfig(4), "times": TIMES.replace(batch_slope=None)}, "max_batch"),
        ({"mode": "warp"}, "warp"),
    ],
)
def test_a_setup_the_simulation_cannot_run_is_refused_naming_the_setting(changes, word):
    settings = {"n_clients": 2, "mode": "sync", "gamma": GAMMA, "times": TIMES, "rtt_at": lambda _t: 0.0, **changes}
    with pytest.raises(ValueError, match=word):
        ClientsSetup(**settings)


def test_a_pass_that_is_not_full_waits_the_batch_window_from_its_first_job():
    """3 clients, max_batch 4, a 5 ms window: the batch never fills, so every pass starts 5 ms
    after its jobs arrived: per round window + t_v(3) + Z."""
    rtt_s, window_s = 0.002, 0.005
    setup = ClientsSetup(3, "sync", GAMMA, TIMES, lambda _t: rtt_s, BatchingConfig(4, window_s * 1e3))
    requests = simulate_clients(setup, *pair(1.0), [[1, 2, 3]], StopRule(60))
    cycle_s = window_s + TIMES.t_verify_s(GAMMA, 3) + GAMMA * T_DRAFT_EDGE_S + rtt_s
    for per_token_s in per_token_s_of(requests):
        assert per_token_s == pytest.approx(cycle_s / (GAMMA + 1), rel=1e-9)
