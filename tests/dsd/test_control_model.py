"""The model policy (dsd/controller/model_based.py) and its estimators (dsd/controller/estimators.py): the closed
form on running estimates picks the plan and the request's mode as specified, follows the link
and the acceptance, and hands over to the server and back only where that pays."""

import pytest

from dsd.analytic import latency_model as lm
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.controller.interface import ControllerConfig, Decision, Observation, RequestObservation
from dsd.controller.policies import make_controller
from dsd.controller.model_based import ModelPolicy, best_decision
from dsd.drive.generation import generate_ar
from dsd.modes import edge_modes, server_modes
from dsd.controller.policy_configs import ModelPolicyConfig
from dsd.controller.model_based import finite_request_factor
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from tests.checks import every
from dsd.drive.driver import DriverConfig
import dataclasses


# A known profile: t_draft 2 ms, t_verify = t_ar = 20 ms, alpha 0.8.
PROFILE = dict(alpha=0.8, t_draft_s=0.002, t_verify_s=0.020)


T_AR_S = 0.020


def test_model_choice_grows_gamma_with_rtt_and_goes_to_ar_past_the_boundary():
    modes = ("sync", "ar")
    gammas = []
    for rtt_ms in (0, 20, 60):
        decision, _ = best_decision(rtt_s=rtt_ms / 1e3, modes=("sync",), gamma_max=16, t_ar_s=T_AR_S, **PROFILE)
        gammas.append(decision.gamma)
    assert gammas == sorted(gammas) and gammas[0] < gammas[-1]
    # The boundary: the RTT at which the best sync gamma is as fast as cloud AR.
    boundary_s = max(
        lm.sync_dsd_beats_ar_rtt_s(PROFILE["alpha"], g, PROFILE["t_draft_s"], PROFILE["t_verify_s"], T_AR_S)
        for g in range(1, 17)
    )
    below, _ = best_decision(rtt_s=0.9 * boundary_s, modes=modes, gamma_max=16, t_ar_s=T_AR_S, **PROFILE)
    above, _ = best_decision(rtt_s=1.1 * boundary_s, modes=modes, gamma_max=16, t_ar_s=T_AR_S, **PROFILE)
    assert below.mode == "sync" and above == Decision(1, "ar")


def _request_plan(policy, rtt_s):
    """The plan a request starts in: decide_request's, or, where it runs a server request as a DSD
    session that hands over at once (its ``current`` a server mode), that server plan."""
    decision = policy.decide_request(rtt_s)
    if decision.mode in edge_modes() and policy.current.mode in server_modes():
        return policy.current
    return decision


def _feed(policy, rtt_s, rounds, seed_pattern=(4, 4, 4, 4, 2)):
    """Rounds of gamma 4 with 18 accepted and one rejection per 5 rounds (alpha_measured 18/19)."""
    for i in range(rounds):
        accepted = seed_pattern[i % len(seed_pattern)]
        policy.observe(
            Observation(4, "sync", 4, accepted, False, rtt_s, PROFILE["t_draft_s"], PROFILE["t_verify_s"], 0.0)
        )
    return policy.decide()


def test_model_policy_follows_the_rtt_across_the_ar_boundary_and_back():
    """Past the boundary a round hands the request over to cloud AR (and the request-level
    choice is cloud AR); back near, rounds and requests come back to DSD."""
    config = ControllerConfig(
        "model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "ar"), settings=ModelPolicyConfig(t_ar_s=T_AR_S)
    )
    policy = ModelPolicy(config)
    assert policy.decide() == Decision(4, "sync")  # nothing measured yet
    near = _feed(policy, 0.002, 40)
    assert near.mode == "sync" and _request_plan(policy, 0.002).mode == "sync"
    far = _feed(policy, 0.300, 40)
    assert far == Decision(1, "ar")  # a round hands over to the server
    assert _request_plan(policy, 0.300) == Decision(1, "ar")
    back = _feed(policy, 0.002, 40)
    # back near: the far plan is left for one within the switching margin of the best
    best = policy._best(("sync",), policy.alpha, policy.rtt_s.value)[1]
    assert back.mode == "sync"
    assert policy._cost_s(back, policy.alpha, policy.rtt_s.value) <= best * (1 + config.settings.margin_pct / 100)
    assert _request_plan(policy, 0.002).mode == "sync"


def test_a_guessed_rtt_moves_the_models_link_level_but_not_the_fastest_link_measured():
    """A burst's guess (``rtt_inferred``) is a sample of the link's level, so a plan can follow a
    fall at once; but not a measurement of the fastest link (``rtt_floor_s``, which the stream's
    look-ahead is judged on)."""
    config = ControllerConfig(
        "model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "ar"), settings=ModelPolicyConfig(t_ar_s=T_AR_S)
    )
    policy = ModelPolicy(config)
    _feed(policy, 0.010, 20)
    _feed(policy, 0.150, 20)
    guess = Observation(1, "ar", 0, 0, False, 0.0075, None, None, None, rtt_inferred=True)
    policy.observe(guess)
    assert policy.rtt_floor_s == pytest.approx(0.010) and policy.link_rtt_s() < 0.150
    policy.observe(Observation(1, "ar", 0, 0, False, 0.0075, None, None, None))
    assert policy.rtt_floor_s == pytest.approx(0.0075)


def test_model_request_choice_crosses_the_closed_form_boundary_with_measured_t_ar():
    """No t_ar prior: the AR step is measured from AR requests; the choice flips where the
    closed form says (best sync gamma vs the measured AR step, over a request as long as the
    last: a sync round's cost is spread over E tokens less its overshoot of the budget, i.e. AR
    at t_ar * factor), probed RTT either side."""
    config = ControllerConfig(
        "model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync"), settings=ModelPolicyConfig(margin_pct=0.0)
    )
    policy = ModelPolicy(config)
    _feed(policy, 0.010, 60)
    policy.observe_request(RequestObservation("ar", 1, 101, 0.010 + 100 * T_AR_S, 0.010, 0.010, 100, 95))
    assert policy._t_ar_s() == pytest.approx(T_AR_S)
    alpha = policy.alpha
    boundary_s = max(
        lm.sync_dsd_beats_ar_rtt_s(
            alpha, g, PROFILE["t_draft_s"], PROFILE["t_verify_s"], T_AR_S / finite_request_factor("sync", g, alpha, 101)
        )
        for g in range(1, 17)
    )
    assert _request_plan(policy, 0.95 * boundary_s).mode == "sync"
    assert _request_plan(policy, 1.05 * boundary_s) == Decision(1, "ar")


def test_model_sees_acceptance_rise_through_shadow_drafting_while_in_ar():
    config = ControllerConfig(
        "model",
        gamma=4,
        mode="sync",
        gamma_max=16,
        modes=("ar", "sync", "pipelined"),
        settings=ModelPolicyConfig(t_ar_s=T_AR_S),
    )
    policy = ModelPolicy(config)
    for _ in range(30):  # alpha ~0.3: cloud AR
        policy.observe(Observation(4, "sync", 4, 0, False, 0.01, PROFILE["t_draft_s"], PROFILE["t_verify_s"], 0.0))
        policy.observe(Observation(4, "sync", 4, 1, False, 0.01, PROFILE["t_draft_s"], PROFILE["t_verify_s"], 0.0))
    assert _request_plan(policy, 0.01) == Decision(1, "ar")
    for _ in range(3):  # the stream says alpha 0.95
        policy.observe_request(RequestObservation("ar", 1, 60, 1.2, 0.02, 0.01, 60, 57))
    assert policy.alpha > 0.9
    assert _request_plan(policy, 0.01).mode in ("sync", "pipelined")


def test_model_policy_does_not_flap_within_its_margin():
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, settings=ModelPolicyConfig(margin_pct=10.0))
    policy = ModelPolicy(config)
    settled = _feed(policy, 0.020, 40)
    decisions = set()
    for i in range(100):  # the RTT wobbles +-1 ms around 20 ms
        decisions.add(_feed(policy, 0.020 + (0.001 if i % 2 else -0.001), 1))
    assert decisions == {settled}


def test_model_policy_fits_t_verify_as_a_line_in_gamma():
    policy = ModelPolicy(ControllerConfig("model", gamma=4, mode="sync", gamma_max=16))
    for gamma, t_verify_s in [(2, 0.005), (8, 0.011)] * 5:
        policy.observe(Observation(gamma, "sync", gamma, gamma, False, 0.01, 0.001, t_verify_s, 0.0))
    assert policy.t_verify_s.at(4) == pytest.approx(0.007, rel=1e-6)
    flat = ModelPolicy(ControllerConfig("model", gamma=4, mode="sync"))
    flat.observe(Observation(4, "sync", 4, 4, False, 0.01, 0.001, 0.009, 0.0))
    assert flat.t_verify_s.at(12) == pytest.approx(0.009)  # one gamma seen: no slope to fit


def test_request_level_dispatch_in_the_sim_keeps_greedy_output_and_records_the_choice():
    """orchestrator/launchers/sim.run_request with a live policy: the model hands far requests to
    cloud AR and near ones to DSD (a link schedule moving under it, two prompt classes of
    different alpha); every request's tokens are the target's greedy ones; the plan columns say
    which mode ran."""
    from dsd.costs.compute_times import ComputeTimes
    from orchestrator.launchers.sim import SimClient, SimRequest, run_request

    config = SyntheticConfig(alpha=0.5, seed=4, alpha_classes=((1, 0.9), (2, 0.3)))
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    costs = ComputeTimes(
        t_draft_edge_s=0.001,
        t_draft_server_s=0.001,
        t_ar_s=0.020,
        t_verify_by_gamma_s={g: 0.020 for g in range(1, 17)},
        t_prefill_per_token_s=0.0,
    )
    policy = make_controller(ControllerConfig("model", 4, "sync", 16, ("ar", "sync", "pipelined")))
    stop = StopRule(40)
    modes = []
    for i in range(16):
        rtt_ms = 10.0 if (i // 4) % 2 == 0 else 300.0
        prompt = [1 if i < 8 else 2, 30 + i, 7]
        tokens, rounds, wall_s, _ = run_request(
            SimClient(draft, target, costs, stop, gamma_max=16),
            SimRequest("sync", 4, prompt, f"q{i}"),
            lambda t, r=rtt_ms: r / 1e3,
            policy,
        )
        assert tokens == generate_ar(target, prompt, stop, seq_id=f"a{i}").tokens
        kinds = {r.mode for r in rounds}
        assert kinds <= {"ar", "sync", "pipelined"}  # a DSD request may hand over (and start on the server)
        modes.append(rounds[0].mode)
    assert modes[1:4] != ["ar"] * 3 and all(m == "ar" for m in modes[5:8])  # near, alpha 0.9: DSD; far: AR
    assert every(m == "ar" for m in modes[13:16])  # far and alpha 0.3


def test_model_hands_a_low_acceptance_request_to_cloud_ar_mid_request_and_back_when_it_rises():
    """A 60 ms link, t_ar = t_verify = 20 ms: at alpha 0.9 pipelined DSD pays, at 0.2 cloud AR does.
    On a prompt of alpha 0.2 the model's rounds show the drop and it hands the rest of the request
    to cloud AR; the next request (alpha 0.9) starts where it left off, on the server, and shadow
    drafting shows the rise, so it comes back to DSD within that request (sim, known profile)."""
    config = SyntheticConfig(alpha=0.5, seed=4, alpha_classes=((1, 0.9), (2, 0.2)))
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    policy = ModelPolicy(ControllerConfig("model", 8, "pipelined", 16, ("ar", "sync", "pipelined")))
    costs = LinkCosts(0.001, 0.02, 0.06, t_ar_s=0.02, t_draft_server_s=0.001)
    stop = StopRule(160)
    runs = []
    for i, cls in enumerate([1, 1, 2, 1]):
        prompt = [cls, 40 + i, 7]
        run = simulate_dsd(
            draft,
            target,
            prompt,
            stop,
            costs,
            DriverConfig(8, "pipelined", gamma_max=16),
            seq_id=f"m{i}",
            controller=policy,
        )
        assert run.generation.tokens == generate_ar(target, prompt, stop, seq_id=f"a{i}").tokens
        runs.append([r.mode for r in run.generation.rounds if not r.stale])
    assert "ar" not in runs[1]  # alpha 0.9: DSD pays
    assert runs[2][0] == "pipelined" and runs[2][-1] == "ar"  # alpha 0.2: handed over mid-request
    assert runs[3][0] == "ar" and runs[3][-1] == "pipelined"  # alpha 0.9 again: back to the edge
    for modes in runs[2:]:
        assert sum((a == "ar") != (b == "ar") for a, b in zip(modes, modes[1:])) == 1  # no flapping


def test_level_follows_a_step_of_the_link_but_not_one_outlier():
    from dsd.controller.estimators import Level

    level = Level(0.9)
    for _ in range(30):
        level.add(0.010)
    level.add(0.150)  # one spike: the discounted mean only
    assert level.value < 0.030
    level.add(0.010)
    for _ in range(2):  # a step up: two in a row restart it
        level.add(0.150)
    assert level.value == pytest.approx(0.150)
    level.add(0.010)  # a fall: one is enough (delays only add)
    assert level.value == pytest.approx(0.010)


def test_acceptance_change_test_finds_a_drop_within_a_few_rounds_and_holds_when_stationary():
    import random

    from dsd.controller.estimators import Acceptance

    def rounds(alpha, gamma, n, rng):
        for _ in range(n):
            accepted = 0
            while accepted < gamma and rng.random() < alpha:
                accepted += 1
            yield accepted, float(accepted < gamma)

    rng = random.Random(7)
    acceptance = Acceptance(0.9)
    for a, r in rounds(0.95, 16, 40, rng):
        acceptance.add(a, r)
    assert acceptance.value > 0.85
    seen = []
    for a, r in rounds(0.3, 16, 8, rng):
        acceptance.add(a, r)
        seen.append(acceptance.value)
    assert min(seen[:6]) < 0.6  # the running value alone: ~0.8 after six rounds
    for alpha, gamma in ((0.3, 2), (0.9, 16), (0.6, 4)):
        stationary = Acceptance(0.9)
        restarts = 0
        for a, r in rounds(alpha, gamma, 1000, random.Random(11)):
            weight = stationary.accepted.weight + stationary.rejected.weight
            stationary.add(a, r)
            restarts += stationary.accepted.weight + stationary.rejected.weight < 0.9 * weight
        assert restarts <= 3


def test_acceptance_restarts_sooner_on_a_drop_that_begins_with_a_request():
    """A new prompt may bring a new alpha: the run of the whole current request needs fewer nats.
    The rounds of netns seed 2's two alpha-drop requests (gamma 8-10) after a history at ~0.8."""
    import random

    from dsd.controller.estimators import Acceptance

    def first_below_half(sequence, boundary):
        acceptance = Acceptance(0.9)
        for i in range(30):
            if i % 6 == 0:
                acceptance.new_request()
            acceptance.add(4, 1.0)
        if boundary:
            acceptance.new_request()
        for k, accepted in enumerate(sequence):
            acceptance.add(accepted, 1.0)
            if acceptance.value < 0.5:
                return k
        return None

    # the third: netns seed 0's first 0.3-class request of session 17 (gamma 12): three rejections
    # in the request's first three positions restart it (MIN_REQUEST_POSITIONS), not two rounds later
    for sequence, at_boundary, mid_request in (
        ([1, 0, 0, 1, 0, 1, 0, 1, 0], 4, None),
        ([0, 0, 2, 0, 0, 0, 0, 0, 0], 4, 7),
        ([0, 0, 0, 1, 1, 0, 0, 0, 0], 2, 7),
    ):
        assert first_below_half(sequence, True) == at_boundary
        assert first_below_half(sequence, False) == mid_request
    for alpha, gamma in ((0.3, 2), (0.9, 16), (0.6, 4), (0.9, 8)):  # stationary, a request every 6 rounds
        rng, stationary, restarts = random.Random(11), Acceptance(0.9), 0
        for i in range(1000):
            if i % 6 == 0:
                stationary.new_request()
            accepted = 0
            while accepted < gamma and rng.random() < alpha:
                accepted += 1
            weight = stationary.accepted.weight + stationary.rejected.weight
            stationary.add(accepted, float(accepted < gamma))
            restarts += stationary.accepted.weight + stationary.rejected.weight < 0.9 * weight
        assert restarts <= 5, (alpha, gamma, restarts)


def test_model_hands_a_stream_back_to_dsd_when_the_link_falls_mid_request():
    config = ControllerConfig(
        "model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync"), settings=ModelPolicyConfig(t_ar_s=T_AR_S)
    )
    policy = ModelPolicy(config)
    assert _feed(policy, 0.300, 40) == Decision(1, "ar")
    stream = dict(
        proposed=0,
        accepted=0,
        stale=False,
        t_draft_s=None,
        t_verify_s=T_AR_S,
        server_queue_s=0.0,
        tokens=1,
        interval_s=T_AR_S,
        remaining_tokens=60,
    )
    policy.observe(Observation(1, "ar", rtt_s=0.300, **stream))
    assert policy.decide() == Decision(1, "ar")
    policy.observe(Observation(1, "ar", rtt_s=0.002, **stream))  # a segment's first tokens: 2 ms
    assert policy.decide().mode == "sync"


def _after_six_shadow_matches_at_a_new_prompt(rtt_s: float) -> tuple[ModelPolicy, Decision]:
    """The benchmark's profile (draft 1 ms, verify = AR step = 20 ms): rounds at alpha 0.3, so a
    new request at ``rtt_s`` goes to cloud AR; then its stream's first six tokens all match the
    edge's shadow drafts (a new prompt: the estimate restarts from them at 1.0)."""
    config = ControllerConfig(
        "model",
        gamma=4,
        mode="sync",
        gamma_max=16,
        modes=("ar", "sync", "pipelined"),
        settings=ModelPolicyConfig(t_ar_s=0.02),
    )
    policy = ModelPolicy(config)
    for accepted in [0, 0, 1, 0, 1] * 8:  # alpha 2/7
        policy.observe(Observation(4, "sync", 4, accepted, False, rtt_s, 0.001, 0.02, 0.0, remaining_tokens=32))
    assert _request_plan(policy, rtt_s) == Decision(1, "ar")
    for left in range(32, 26, -1):
        policy.observe(
            Observation(
                1,
                "ar",
                0,
                0,
                False,
                None,
                None,
                0.02,
                0.0,
                tokens=1,
                interval_s=0.02,
                shadow_positions=1,
                shadow_matches=1,
                remaining_tokens=left,
            )
        )
    assert policy.alpha > 0.99
    return policy, policy.decide()


def test_a_request_comes_back_from_the_server_only_if_that_pays_off_at_alphas_lower_bound():
    """Six matches in six read alpha 1.0, where pipelined 16 beats cloud AR even at 150 ms; at
    the 0.9 such a prompt has, cloud AR is still ahead there (24.5 against 20 ms a token), so the
    request stays on the server: the lower bound (0.82) does not pay for the hand-back. At 10 ms
    the same six take it back to the edge (DSD is ahead from alpha ~0.45)."""
    far, plan = _after_six_shadow_matches_at_a_new_prompt(0.15)
    assert plan == Decision(1, "ar")
    assert far._worth_switching(far._best(("pipelined",), far.alpha, 0.15)[0], far.alpha, 0.15, True)
    assert far.acceptance.lower_bound(far.HAND_BACK_Z) < 0.9
    _, plan = _after_six_shadow_matches_at_a_new_prompt(0.01)
    assert plan.mode == "pipelined"


def test_a_noisy_shadow_rate_does_not_take_requests_back_from_the_server(monkeypatch):
    """A 0.3-class prompt on cloud AR at 10 ms: the shadow drafts match 12 of the last 22 tokens,
    which the discounted estimate (about ten positions of memory) reads as alpha 0.53, where DSD
    would win (from ~0.45); its lower bound, 0.38, says it may not. Neither the stream nor the
    next request leaves the server; judged on the point estimate alone (z = 0), both would."""

    def run(z: float) -> tuple[Decision, Decision]:
        monkeypatch.setattr(ModelPolicy, "HAND_BACK_Z", z)
        config = ControllerConfig(
            "model",
            gamma=4,
            mode="sync",
            gamma_max=16,
            modes=("ar", "sync", "pipelined"),
            settings=ModelPolicyConfig(t_ar_s=0.02),
        )
        policy = ModelPolicy(config)
        for accepted in [0, 0, 1, 0, 1] * 8:  # alpha 2/7
            policy.observe(Observation(4, "sync", 4, accepted, False, 0.01, 0.001, 0.02, 0.0, remaining_tokens=32))
        assert _request_plan(policy, 0.01) == Decision(1, "ar")
        for k, match in enumerate([1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 1, 0]):
            policy.observe(
                Observation(
                    1,
                    "ar",
                    0,
                    0,
                    False,
                    None,
                    None,
                    0.02,
                    0.0,
                    tokens=1,
                    interval_s=0.02,
                    shadow_positions=1,
                    shadow_matches=match,
                    remaining_tokens=31 - k,
                )
            )
            policy.decide()
        assert 0.5 < policy.alpha < 0.55 and policy.acceptance.lower_bound(1.0) < 0.4
        return policy.current, _request_plan(policy, 0.01)

    assert run(1.0) == (Decision(1, "ar"), Decision(1, "ar"))
    stream, request = run(0.0)
    assert stream.mode == request.mode == "pipelined"


def test_finite_request_factor_charges_the_budget_overshoot_of_long_rounds():
    from dsd.controller.model_based import finite_request_factor

    assert finite_request_factor("ar", 1, 0.9, 10) == 1.0
    assert finite_request_factor("sync", 8, 0.9, None) == 1.0
    e = lm.expected_tokens_per_round(0.9, 16)
    assert finite_request_factor("pipelined", 16, 0.9, 48) == pytest.approx(1 + (e - 1) / 96)
    assert finite_request_factor("sync", 16, 0.9, 48) > finite_request_factor("sync", 4, 0.9, 48)


def _feed_queued(policy, rtt_s, rounds, queue_s, mode="sync"):
    """Rounds of gamma 4 as ``_feed``'s, each having waited ``queue_s`` in the verifier's queue."""
    for i in range(rounds):
        accepted = (4, 4, 4, 4, 2)[i % 5]
        policy.observe(
            Observation(4, mode, 4, accepted, False, rtt_s, PROFILE["t_draft_s"], PROFILE["t_verify_s"], queue_s)
        )
    return policy.decide()


def test_model_charges_the_verifiers_queueing_per_pass_so_a_loaded_server_moves_it_off_cloud_ar():
    """Far (300 ms) at alpha ~0.95, cloud AR (20 ms a step) beats sync DSD on an idle verifier.
    With 30 ms of queueing per pass, AR pays it on every token and a sync round once per ~11
    tokens: the model measures the queueing and picks sync DSD at the gamma the closed form with
    the queueing added says, in its rounds and for the next request."""
    config = ControllerConfig(
        "model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "ar"), settings=ModelPolicyConfig(t_ar_s=T_AR_S)
    )
    idle, loaded = ModelPolicy(config), ModelPolicy(config)
    assert _feed_queued(idle, 0.300, 40, 0.0) == Decision(1, "ar")
    assert _request_plan(idle, 0.300) == Decision(1, "ar")
    plan = _feed_queued(loaded, 0.300, 40, 0.030)
    assert plan.mode == "sync" and _request_plan(loaded, 0.300).mode == "sync"
    assert loaded.server_queue_s == pytest.approx(0.030)
    expected, _ = best_decision(
        loaded.alpha,
        loaded.rtt_s.value,
        PROFILE["t_draft_s"],
        PROFILE["t_verify_s"],
        ("sync", "ar"),
        16,
        T_AR_S,
        queue_s=0.030,
    )
    assert plan == expected
    # among sync plans, a fixed cost per round wants longer rounds: the queueing grows gamma as RTT does
    near = [
        best_decision(rtt_s=0.010, modes=("sync",), gamma_max=16, t_ar_s=T_AR_S, queue_s=q, **PROFILE)[0].gamma
        for q in (0.0, 0.050)
    ]
    assert near[0] < near[1]


def test_model_counts_only_queueing_behind_other_clients_not_its_own_work():
    """A pipelined block waits behind the edge's previous block, a request's first round behind its
    own Open, a hand-over segment's first step behind the segment before: none of that is load.
    A sync round after a sync round, and a stream's later steps (per pass), are."""
    config = ControllerConfig(
        "model",
        gamma=4,
        mode="sync",
        gamma_max=16,
        modes=("sync", "pipelined", "ar"),
        settings=ModelPolicyConfig(t_ar_s=T_AR_S),
    )
    policy = ModelPolicy(config)
    _feed_queued(policy, 0.010, 10, 0.015, mode="pipelined")
    assert policy.server_queue_s == 0.0
    policy.decide_request(0.010)
    _feed_queued(policy, 0.010, 1, 0.015)  # the request's first round
    assert policy.server_queue_s == 0.0
    step = dict(gamma=1, mode="ar", proposed=0, accepted=0, stale=False, t_draft_s=None, t_verify_s=0.02, tokens=1)
    policy.observe(Observation(rtt_s=0.010, server_queue_s=0.05, **step))  # a segment's first step
    assert policy.server_queue_s == 0.0
    policy.observe(Observation(rtt_s=None, server_queue_s=0.004, **step))  # a later step: others' passes
    assert policy.server_queue_s == pytest.approx(0.004)


class _AskOneRoundTripAhead(ModelPolicy):
    """The model policy without its longer look-ahead: streams asked one measured RTT ahead."""

    def stream_ahead_s(self):
        return None


def _second_request_wall_s(policy: ModelPolicy, first_rtt_s: float) -> float:
    """Two requests at alpha 0.2 (t_ar = t_verify = 20 ms: cloud AR beats DSD on a 10 ms link and
    on a 150 ms one), the first on a link of ``first_rtt_s``, the second on a link that steps
    10 -> 150 ms mid-stream; both end in cloud AR with the target's output. The second's wall time."""
    config = SyntheticConfig(alpha=0.2, seed=4)
    costs = LinkCosts(0.001, 0.02, 0.15, t_ar_s=0.02, t_draft_server_s=0.001)
    stop = StopRule(64)
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    for i, rtt_at in enumerate([lambda t: first_rtt_s, lambda t: 0.010 if t < 0.6 else 0.150]):
        prompt = [5, 40 + i, 7]
        run = simulate_dsd(
            draft,
            target,
            prompt,
            stop,
            dataclasses.replace(costs, rtt_at=rtt_at),
            DriverConfig(8, "pipelined", gamma_max=16),
            seq_id=f"step{i}",
            controller=policy,
        )
        assert run.generation.tokens == generate_ar(target, prompt, stop, seq_id=f"a{i}").tokens
        assert [r.mode for r in run.generation.rounds if not r.stale][-1] == "ar"
    return run.total_s


def _look_ahead_config(floor_s: float) -> ControllerConfig:
    return ControllerConfig(
        "model",
        8,
        "pipelined",
        16,
        ("ar", "sync", "pipelined"),
        settings=ModelPolicyConfig(stream_ahead_floor_s=floor_s),
    )


def test_a_stream_that_stays_on_the_server_is_asked_for_the_slowest_link_seen():
    """After a request on the 150 ms link, a request whose link steps 10 -> 150 ms mid-stream: asked
    only one measured RTT (10 ms) ahead, the server runs dry until a segment's first tokens show
    the new RTT; kept asked for the slowest level seen (no floor), it does not."""
    policy = ModelPolicy(_look_ahead_config(0.0))
    wall_s = _second_request_wall_s(policy, 0.150)
    assert policy.stream_ahead_s() == pytest.approx(0.150, rel=0.05)
    one_rtt_wall_s = _second_request_wall_s(_AskOneRoundTripAhead(_look_ahead_config(0.0)), 0.150)
    # the server idles about the step's 140 ms once when asked one (10 ms) round trip ahead
    assert one_rtt_wall_s - wall_s > 0.08


def test_stream_ahead_stays_off_while_an_edge_plan_could_take_the_request_back():
    """At alpha 0.9 on a link measured at 10 ms DSD beats cloud AR, so a stream stays asked one
    measured RTT ahead (None), as it does for a request's first positions."""
    policy = ModelPolicy(
        ControllerConfig(
            "model",
            8,
            "pipelined",
            16,
            ("ar", "sync", "pipelined"),
            settings=ModelPolicyConfig(stream_ahead_floor_s=0.0),
        )
    )
    assert policy.stream_ahead_s() is None
    for rtt_s in (0.150, 0.010):
        for _ in range(10):
            policy.observe(Observation(8, "pipelined", 8, 8 if _ % 3 else 5, False, rtt_s, 0.001, 0.02, 0.0))
    policy.current = Decision(1, "ar")
    policy.request_positions, policy.request_matches = 40, 36
    assert policy.stream_ahead_s() is None
    policy.request_matches = 4  # this request's own positions: alpha 0.1
    policy.acceptance = type(policy.acceptance)(0.9)
    policy.acceptance.add(1, 9)
    assert policy.stream_ahead_s() == pytest.approx(0.150, rel=0.05)
    policy.config = ControllerConfig("model", 8, "pipelined", 16, ("ar", "sync", "pipelined"))
    assert policy.stream_ahead_s() == pytest.approx(0.2)  # the default floor: above the slowest seen


def test_the_floor_keeps_a_stream_asked_for_a_slower_link_than_any_seen_yet():
    """The run's first step: a request on a 10 ms link, then one stepping to 150 ms mid-stream. No
    slower level has been seen, so without a floor the stream is asked 10 ms ahead and the server
    runs dry at the step; with the default floor (0.2 s) it does not."""
    walls = {floor_s: _second_request_wall_s(ModelPolicy(_look_ahead_config(floor_s)), 0.010) for floor_s in (0.2, 0.0)}
    # the server idles about the step's 140 ms once when asked one (10 ms) round trip ahead
    assert walls[0.0] - walls[0.2] > 0.08


def test_a_stalled_first_block_does_not_send_a_near_edge_to_the_server():
    """The run's first block drafted at 21 ms a step on a 1 ms device (a host stall; CI's compose
    run): the model plans nothing on one draft measurement, and the next, 1 ms, restarts the
    estimate (a stall only adds time), so a 5 ms edge stays on DSD."""
    policy = ModelPolicy(ControllerConfig("model", gamma=4, mode="sync", gamma_max=8, modes=("ar", "sync")))
    policy.decide_request(0.005)
    for t_draft_s in (0.021, 0.001, 0.001):
        policy.observe(Observation(4, "sync", 4, 3, False, 0.005, t_draft_s, 0.020, 0.0, remaining_tokens=40))
        assert policy.decide().mode == "sync", t_draft_s
    assert policy.t_draft_s.value == pytest.approx(0.001)


def test_the_first_plan_comes_after_two_measured_draft_rounds_not_three():
    """DRAFT_ROUNDS counts rounds: two sync rounds of a 1 ms edge, all accepted, on a 10 ms link
    are enough to leave the configured start (the discounted weight, 1.9 after two, held every
    run's first request a third round in sync 4); a restart of the draft estimate counts again."""
    policy = ModelPolicy(
        ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync", "pipelined"))
    )
    policy.decide_request(0.010)
    plans = []
    for _ in range(2):
        policy.observe(Observation(4, "sync", 4, 4, False, 0.010, 0.001, 0.020, 0.0, remaining_tokens=40))
        plans.append(policy.decide())
    assert plans[0] == Decision(4, "sync") and plans[1].mode == "pipelined", plans
    policy.observe(Observation(4, "sync", 4, 4, False, 0.010, 0.0004, 0.020, 0.0, remaining_tokens=30))
    assert policy.t_draft_s.count == 1  # a step far below restarted it: one round measured
