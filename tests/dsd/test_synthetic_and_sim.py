"""The synthetic backend keeps its promises, and the simulated protocol meets the closed form."""

import math

import pytest

from dsd.analytic import latency_model as lm
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import Generation, generate_colocated
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from dsd.costs.compute_times import ComputeTimes
from dsd.drive.driver import DriverConfig


@pytest.mark.parametrize("alpha,gamma", [(0.5, 4), (0.8, 4), (0.9, 8), (0.7, 1)])
def test_measured_acceptance_and_tokens_per_round_match_alpha_and_E(alpha, gamma):
    config = SyntheticConfig(alpha=alpha, seed=5)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    rounds = []
    for i in range(25):
        rounds += generate_colocated(draft, target, [i + 1, 2, 3], gamma, StopRule(200), seq_id=str(i)).rounds
    measured = Generation([], rounds)
    n_rounds = len(rounds)
    # alpha_measured is a proportion over accepted + rejections trials; allow 4 standard errors.
    trials = sum(r.accepted for r in rounds) + sum(r.accepted < r.proposed for r in rounds)
    assert abs(measured.alpha_measured - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / trials)
    # Tokens per round: mean of a bounded variable, 4 standard errors (sd <= (gamma+1)/2).
    e = lm.expected_tokens_per_round(alpha, gamma)
    assert abs(measured.tokens_per_round - e) < 4 * ((gamma + 1) / 2) / math.sqrt(n_rounds)


def test_synthetic_streams_are_deterministic_and_eos_free_by_default():
    config = SyntheticConfig(alpha=0.6, seed=9)
    a = generate_colocated(SyntheticLM(config, "draft"), SyntheticLM(config, "target"), [1, 2], 4, StopRule(100))
    b = generate_colocated(SyntheticLM(config, "draft"), SyntheticLM(config, "target"), [1, 2], 4, StopRule(100))
    assert a.tokens == b.tokens and a.rounds == b.rounds
    assert config.eos_token_id not in a.tokens


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("rtt_s", [0.0, 0.006, 0.02, 0.08])
def test_simulated_protocol_meets_the_closed_form(pipelined, rtt_s):
    """Steady-state per-token time of the real protocol on virtual time vs the formula at the
    measured alpha: within 3% (the rest is the last, clipped round of each request)."""
    config = SyntheticConfig(alpha=0.8, seed=3)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    costs = LinkCosts(t_draft_s=0.004, t_verify_s=0.010, rtt_s=rtt_s)
    total_s, tokens, rounds = 0.0, 0, []
    for i in range(10):
        run = simulate_dsd(
            draft,
            target,
            [i + 1, 2, 3],
            StopRule(300),
            costs,
            DriverConfig(4, "pipelined" if pipelined else "sync"),
            seq_id=str(i),
        )
        total_s += run.total_s - run.first_token_s
        tokens += len(run.generation.tokens) - run.generation.rounds[0].emitted
        rounds += run.generation.rounds
    alpha_measured = Generation([], rounds).alpha_measured
    model = lm.per_token_pipelined_dsd_s if pipelined else lm.per_token_sync_dsd_s
    predicted_s = model(alpha_measured, 4, costs.t_draft_s, costs.t_verify_s, rtt_s)
    assert total_s / tokens == pytest.approx(predicted_s, rel=0.03)


def _sim_pair(alpha: float = 0.8):
    config = SyntheticConfig(alpha=alpha, seed=3)
    return SyntheticLM(config, "draft"), SyntheticLM(config, "target")


@pytest.mark.parametrize("mode", ["ar", "colocated"])
def test_sim_runs_ar_and_colocated_through_the_protocol_a_link_delay_moves_ttft_not_per_token(mode):
    """The server's own modes run the message exchange on virtual time: each message pays the
    link's one-way delay, so a longer delay per message adds exactly two of them (Open out, the
    first Tokens back) to the time to first token and nothing to the time per token after it."""
    from dsd.drive.generation import generate_ar
    from dsd.simulation.one_client import ServerCosts, simulate_on_server

    draft, target = _sim_pair()
    runs = {}
    for one_way_s in (0.0, 0.015):
        costs = ServerCosts(t_ar_s=0.010, t_draft_s=0.002, t_verify_s=0.011, t_prefill_s=0.003, one_way_s=one_way_s)
        runs[one_way_s] = simulate_on_server(
            draft, target, [4, 5, 6], 4, StopRule(60), mode, costs, seq_id=f"{mode}{one_way_s}"
        )
    near, far = runs[0.0], runs[0.015]
    assert far.generation.tokens == near.generation.tokens
    assert far.first_token_s - near.first_token_s == pytest.approx(0.030)
    steady = {
        k: (r.total_s - r.first_token_s) / (len(r.generation.tokens) - r.generation.rounds[0].emitted)
        for k, r in runs.items()
    }
    assert steady[0.015] == pytest.approx(steady[0.0], rel=1e-12)
    if mode == "ar":
        assert near.first_token_s == pytest.approx(0.003 + 0.010)
        assert steady[0.0] == pytest.approx(0.010)
        assert len(near.generation.rounds) == len(near.generation.tokens) == 60  # one Tokens message per step
        assert near.generation.tokens == generate_ar(target, [4, 5, 6], StopRule(60), seq_id="ref").tokens
    else:
        # Rounds are timed one by one, so the total follows the rounds the protocol ran.
        assert near.total_s == pytest.approx(0.003 + len(near.generation.rounds) * (4 * 0.002 + 0.011))
        assert (
            near.generation.tokens == generate_colocated(draft, target, [4, 5, 6], 4, StopRule(60), seq_id="ref").tokens
        )


def test_sim_launcher_ar_point_rows_come_from_the_protocol():
    """The sim launcher's AR request: one round row per streamed token and the link delay in
    the time to first token only (orchestrator.launchers.sim.run_request)."""
    from orchestrator.launchers.sim import SimClient, SimRequest, run_request

    draft, target = _sim_pair()
    times = ComputeTimes(
        t_draft_edge_s=0.004,
        t_draft_server_s=0.002,
        t_ar_s=0.010,
        t_verify_by_gamma_s={4: 0.010},
        t_prefill_per_token_s=0.0005,
    )
    out = {
        rtt_s: run_request(
            SimClient(draft, target, times, StopRule(40)),
            SimRequest("ar", 4, [1, 2, 3, 4, 5], f"r{rtt_s}"),
            lambda _t, r=rtt_s: r,
        )
        for rtt_s in (0.0, 0.04)
    }
    (tokens0, rounds0, wall0, ttft0), (tokens1, _, wall1, ttft1) = out[0.0], out[0.04]
    assert tokens0 == tokens1 and len(rounds0) == 40 and all(r.emitted == 1 for r in rounds0)
    assert ttft1 - ttft0 == pytest.approx(0.04)
    assert (wall1 - ttft1) == pytest.approx(wall0 - ttft0)


def test_sim_colocated_lays_out_stratified_acceptance_like_generate_colocated():
    """With stratified acceptance the draft must be told the request first (begin_request): the
    simulated co-located run then accepts exactly what dsd.drive.generation.generate_colocated does."""
    from dsd.simulation.one_client import ServerCosts, simulate_on_server

    config = SyntheticConfig(alpha=0.7, seed=4, acceptance="stratified")
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    costs = ServerCosts(t_ar_s=0.010, t_draft_s=0.002, t_verify_s=0.011, t_prefill_s=0.0, one_way_s=0.005)
    sim = simulate_on_server(draft, target, [7, 8, 9], 4, StopRule(80), "colocated", costs, seq_id="s")
    reference = generate_colocated(draft, target, [7, 8, 9], 4, StopRule(80), seq_id="r")
    assert sim.generation.tokens == reference.tokens
    assert [(r.accepted, r.emitted) for r in sim.generation.rounds] == [
        (r.accepted, r.emitted) for r in reference.rounds
    ]


def test_alpha_classes_set_the_drafts_acceptance_per_prompt_class_and_leave_the_target_alone():
    """A prompt starting with a class token is drafted with that class's alpha (i.i.d. per
    position, as the latency model assumes); the target, so greedy output, is the plain one's."""
    from dsd.backends.synthetic import SyntheticConfig, SyntheticLM, target_token

    classes = SyntheticConfig(alpha=0.5, seed=2, alpha_classes=((1, 0.9), (2, 0.2)))
    plain = SyntheticConfig(alpha=0.5, seed=2)
    for first, alpha in ((1, 0.9), (2, 0.2), (7, 0.5)):
        assert classes.alpha_of([first, 40, 41]) == alpha
        draft = SyntheticLM(classes, "draft")
        context = [first, 40, 41]
        hits, n = 0, 6000
        for _ in range(n):
            right = target_token(classes, context)
            assert right == target_token(plain, context)
            guess = int(draft.logits("s", context, 1)[0].argmax())
            hits += guess == right
            context.append(right)
        assert abs(hits / n - alpha) < 0.025, (first, hits / n)


def test_alpha_classes_are_validated_naming_the_field():
    from dsd.backends.synthetic import SyntheticConfig

    for bad in (((1, 1.5),), ((600, 0.5),), ((1, 0.5), (1, 0.6)), [(1, 0.5)], ((True, 0.5),)):
        with pytest.raises(ValueError, match="alpha_classes"):
            SyntheticConfig(alpha_classes=bad)
    with pytest.raises(ValueError, match="alpha_classes"):
        SyntheticConfig(alpha_classes=((1, 0.5),), acceptance="stratified")


def test_alpha_classes_reach_the_services_in_the_backend_json():
    """The launchers send a backend config whole as JSON (--backend-json): the classes survive."""
    from dsd.backends.factory import backend_from_dict, backend_from_json

    config = backend_from_dict({"kind": "synthetic", "alpha": 0.5, "alpha_classes": "1:0.9,2:0.3"})
    draft, _ = backend_from_json(config.to_json()).load()
    assert draft.config.alpha_classes == ((1, 0.9), (2, 0.3)) and draft.config.alpha_of([2, 7]) == 0.3
    with pytest.raises(ValueError, match="alpha_classes"):
        backend_from_dict({"kind": "synthetic", "alpha_classes": "1=0.9"})
