"""Adaptive DSD (dsd/control.py): plans change between rounds of one request without changing the
target's greedy output, bad plans are refused naming the field, and the policies decide as
specified."""
import itertools

import pytest

from dsd import latency_model as lm
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.control import (BanditPolicy, ControllerConfig, Decision, HeuristicPolicy, ModelPolicy, Observation,
                         RequestObservation, best_decision, check_decision, make_controller, shadow_matches)
from dsd.policy_configs import BanditConfig, ModelPolicyConfig, StaticConfig
from dsd.decoding import generate_ar
from dsd.modes import edge_modes, server_modes
from dsd.policy_model import finite_request_factor
from dsd.simulate import LinkCosts, simulate_dsd
from dsd.stopping import StopRule


class Scripted:
    """A controller that plays a fixed list of plans, one per decision, then repeats the last."""

    def __init__(self, plans):
        self.plans, self.calls, self.seen = list(plans), 0, []

    def observe(self, observation):
        self.seen.append(observation)

    def decide(self):
        plan = self.plans[min(self.calls, len(self.plans) - 1)]
        self.calls += 1
        return plan


def _pair(alpha=0.7, seed=5):
    config = SyntheticConfig(alpha=alpha, seed=seed)
    return SyntheticLM(config, "draft"), SyntheticLM(config, "target")


PLANS = [Decision(g, m) for g, m in [(1, "sync"), (5, "pipelined"), (2, "pipelined"), (7, "sync"), (3, "pipelined"),
                                     (1, "pipelined"), (6, "sync"), (4, "pipelined")] * 8]


@pytest.mark.parametrize("rtt_s", [0.0, 0.004, 0.03])
@pytest.mark.parametrize("depth", [1, 3])
def test_gamma_and_mode_changes_mid_request_keep_the_target_greedy_output(rtt_s, depth):
    draft, target = _pair()
    stop = StopRule(80)
    for i in range(3):
        prompt = [i + 1, 7, 3]
        expected = generate_ar(target, prompt, stop, seq_id=f"ar{i}").tokens
        controller = Scripted(PLANS)
        run = simulate_dsd(draft, target, prompt, 4, stop, LinkCosts(0.001, 0.002, rtt_s), pipelined=False,
                           max_in_flight=depth, seq_id=f"c{i}", controller=controller, gamma_max=8)
        assert run.generation.tokens == expected
        live = [r for r in run.generation.rounds if not r.stale]
        assert {r.mode for r in live} == {"sync", "pipelined"}       # the switch happened mid-request
        assert len({r.gamma for r in live}) >= 3
        assert all(r.proposed == r.gamma for r in live)               # each block drafted to its plan
        assert len(controller.seen) == len(run.generation.rounds)     # every verdict observed


def test_static_controller_changes_nothing_but_the_plan_columns():
    draft, target = _pair()
    stop = StopRule(60)
    for pipelined in (False, True):
        plain = simulate_dsd(draft, target, [4, 2], 4, stop, LinkCosts(0.001, 0.002, 0.01), pipelined, seq_id="a")
        mode = "pipelined" if pipelined else "sync"
        static = make_controller(ControllerConfig("static", 4, mode))
        controlled = simulate_dsd(draft, target, [4, 2], 4, stop, LinkCosts(0.001, 0.002, 0.01), pipelined,
                                  seq_id="b", controller=static)
        assert controlled.generation.tokens == plain.generation.tokens
        assert controlled.total_s == plain.total_s
        assert controlled.generation.rounds == plain.generation.rounds
        assert {(r.gamma, r.mode) for r in plain.generation.rounds if not r.stale} == {(4, mode)}


@pytest.mark.parametrize("bad", [Decision(9, "sync"), (3, "sync")])
def test_a_controller_returning_an_invalid_plan_is_refused_naming_the_field(bad):
    draft, target = _pair()
    with pytest.raises(ValueError, match="gamma|Decision"):
        simulate_dsd(draft, target, [1, 2], 4, StopRule(30), LinkCosts(0.001, 0.002, 0.01), False,
                     controller=Scripted([Decision(4, "sync"), bad]), gamma_max=8)
    with pytest.raises(ValueError, match="gamma"):
        check_decision(Decision(9, "sync"), 8, ("sync",))
    with pytest.raises(ValueError, match="mode"):
        check_decision(Decision(2, "ar"), 8, ("sync", "pipelined"))
    with pytest.raises(ValueError, match="gamma"):
        Decision(0, "sync")
    with pytest.raises(ValueError, match="controller"):
        ControllerConfig("oracle")
    with pytest.raises(ValueError, match="gamma"):
        ControllerConfig("heuristic", gamma=20, gamma_max=16)


def _obs(proposed, accepted, rtt_s=0.01, stale=False):
    return Observation(proposed, "sync", proposed, accepted, stale, rtt_s, 0.001, 0.002, 0.0)


def test_heuristic_adds_two_on_full_acceptance_and_drops_one_otherwise_clamped():
    policy = HeuristicPolicy(ControllerConfig("heuristic", gamma=4, gamma_max=9))
    gammas = []
    for accepted_all in (True, True, True, False, True, False, False, False, False, False, False, False):
        g = policy.decide().gamma
        policy.observe(_obs(g, g if accepted_all else 0))
        gammas.append(policy.decide().gamma)
    assert gammas == [6, 8, 9, 8, 9, 8, 7, 6, 5, 4, 3, 2]
    policy.observe(_obs(2, 0))
    policy.observe(_obs(1, 0))
    assert policy.decide() == Decision(1, "sync")
    policy.observe(_obs(1, 1, stale=True))                            # stale blocks say nothing
    assert policy.decide().gamma == 1


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
    boundary_s = max(lm.sync_dsd_beats_ar_rtt_s(PROFILE["alpha"], g, PROFILE["t_draft_s"], PROFILE["t_verify_s"],
                                                T_AR_S) for g in range(1, 17))
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
        policy.observe(Observation(4, "sync", 4, accepted, False, rtt_s, PROFILE["t_draft_s"],
                                   PROFILE["t_verify_s"], 0.0))
    return policy.decide()


def test_model_policy_follows_the_rtt_across_the_ar_boundary_and_back():
    """Past the boundary a round hands the request over to cloud AR (and the request-level
    choice is cloud AR); back near, rounds and requests come back to DSD."""
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "ar"),
                              settings=ModelPolicyConfig(t_ar_s=T_AR_S))
    policy = ModelPolicy(config)
    assert policy.decide() == Decision(4, "sync")                     # nothing measured yet
    near = _feed(policy, 0.002, 40)
    assert near.mode == "sync" and _request_plan(policy, 0.002).mode == "sync"
    far = _feed(policy, 0.300, 40)
    assert far == Decision(1, "ar")                                   # a round hands over to the server
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
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "ar"),
                              settings=ModelPolicyConfig(t_ar_s=T_AR_S))
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
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync"),
                              settings=ModelPolicyConfig(margin_pct=0.0))
    policy = ModelPolicy(config)
    _feed(policy, 0.010, 60)
    policy.observe_request(RequestObservation("ar", 1, 101, 0.010 + 100 * T_AR_S, 0.010, 0.010, 100, 95))
    assert policy._t_ar_s() == pytest.approx(T_AR_S)
    alpha = policy.alpha
    boundary_s = max(lm.sync_dsd_beats_ar_rtt_s(alpha, g, PROFILE["t_draft_s"], PROFILE["t_verify_s"],
                                                T_AR_S / finite_request_factor("sync", g, alpha, 101))
                     for g in range(1, 17))
    assert _request_plan(policy, 0.95 * boundary_s).mode == "sync"
    assert _request_plan(policy, 1.05 * boundary_s) == Decision(1, "ar")


def test_model_sees_acceptance_rise_through_shadow_drafting_while_in_ar():
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync", "pipelined"),
                              settings=ModelPolicyConfig(t_ar_s=T_AR_S))
    policy = ModelPolicy(config)
    for _ in range(30):                                               # alpha ~0.3: cloud AR
        policy.observe(Observation(4, "sync", 4, 0, False, 0.01, PROFILE["t_draft_s"], PROFILE["t_verify_s"], 0.0))
        policy.observe(Observation(4, "sync", 4, 1, False, 0.01, PROFILE["t_draft_s"], PROFILE["t_verify_s"], 0.0))
    assert _request_plan(policy, 0.01) == Decision(1, "ar")
    for _ in range(3):                                                # the stream says alpha 0.95
        policy.observe_request(RequestObservation("ar", 1, 60, 1.2, 0.02, 0.01, 60, 57))
    assert policy.alpha > 0.9
    assert _request_plan(policy, 0.01).mode in ("sync", "pipelined")


def test_shadow_matches_measure_the_drafts_acceptance_on_the_stream():
    draft, target = _pair(alpha=0.6, seed=3)
    prompt = [5, 9, 2]
    generated = generate_ar(target, prompt, StopRule(4000), seq_id="s").tokens
    positions, matches = shadow_matches(draft, "shadow", prompt, generated)
    assert positions == 4000 and abs(matches / positions - 0.6) < 0.03
    assert shadow_matches(draft, "shadow", prompt, []) == (0, 0)


def _bandit_round(policy, decision, accepted, rtt_s=0.01):
    policy.observe(Observation(decision.gamma, decision.mode, decision.gamma, accepted, False, rtt_s, 0.001,
                               0.02, 0.0))


def test_bandit_tries_every_arm_then_settles_on_the_best_rate():
    # the uninformed bandit (no prior from the closed form): every arm is tried
    config = ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=8, modes=("sync",),
                              settings=BanditConfig(gammas=(1, 2, 4, 8), prior_rounds=0))
    policy = BanditPolicy(config)
    seen = []
    for _ in range(300):                       # every draft accepted: the largest gamma earns most per second
        d = policy.decide()
        seen.append(d)
        _bandit_round(policy, d, d.gamma)
    assert {d.gamma for d in seen[:8]} == {1, 2, 4, 8}        # (the first verdict moves the alpha context)
    assert sum(d.gamma == 8 for d in seen[-100:]) >= 90


def test_bandit_follows_a_change_of_acceptance():
    config = ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=8, modes=("sync",),
                              settings=BanditConfig(gammas=(1, 8)))
    policy = BanditPolicy(config)
    for _ in range(200):
        d = policy.decide()
        _bandit_round(policy, d, d.gamma)                            # everything accepted: gamma 8
    assert policy.decide().gamma == 8
    for _ in range(400):
        d = policy.decide()
        _bandit_round(policy, d, 0)                                  # nothing accepted: gamma 1 is cheaper
    assert sum(policy.decide().gamma == 1 for _ in range(1)) == 1
    picks = []
    for _ in range(50):
        d = policy.decide()
        picks.append(d.gamma)
        _bandit_round(policy, d, 0)
    assert picks.count(1) >= 45


def test_bandit_request_choice_prefers_the_server_where_it_earned_more():
    # no hand-over: a server request is a plain stream, seen whole by observe_request
    config = ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=4, modes=("ar", "sync"), handover=False,
                              settings=BanditConfig(gammas=(4,)))
    policy = BanditPolicy(config)
    kinds = []
    for _ in range(40):
        d = policy.decide_request(0.150)
        kinds.append(d.mode)
        if d.mode == "ar":                   # 50 tokens/s on the server
            policy.observe_request(RequestObservation("ar", 1, 50, 1.0, 0.15, 0.150))
        else:                                # DSD far away: 4 drafts accepted over 0.2 s per round
            for _ in range(10):
                _bandit_round(policy, policy.decide(), 1, rtt_s=0.150)
    assert set(kinds[:2]) == {"ar", "sync"}
    assert kinds[-10:].count("ar") >= 9


def test_controller_config_refuses_bad_bandit_and_model_settings():
    for bad in (dict(gammas=()), dict(gammas=(0, 2)), dict(horizon_s=0), dict(exploration=-1.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ControllerConfig("bandit", settings=BanditConfig(**bad))
    for bad in (dict(explore_after=0), dict(t_ar_s=-0.1), dict(margin_pct=100), dict(stream_ahead_floor_s=11)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ControllerConfig("model", settings=ModelPolicyConfig(**bad))
    with pytest.raises(ValueError, match="t_ar_s"):
        BanditConfig(model={"t_ar_s": -0.1})                  # the model policy beside the bandit
    with pytest.raises(ValueError, match="modes"):
        ControllerConfig("bandit", modes=("sync", "beam"))


def test_a_setting_of_another_policy_is_refused_naming_the_key_and_its_policy():
    for policy, key, owner in (("bandit", "margin_pct", "model"), ("model", "gammas", "bandit"),
                               ("static", "prior_rounds", "bandit"), ("heuristic", "explore_after", "model")):
        with pytest.raises(ValueError, match=f"{key} is a setting of the {owner} policy, not of controller '{policy}'"):
            ControllerConfig(policy, settings={key: 1})
    with pytest.raises(ValueError, match="set it in its 'model' table"):
        ControllerConfig("bandit", settings={"discount": 0.5})
    with pytest.raises(ValueError, match="unknown setting 'margin' of controller 'model'"):
        ControllerConfig("model", settings={"margin": 5.0})
    with pytest.raises(ValueError, match="handover is shared by every policy"):
        ControllerConfig("model", settings={"handover": False})
    with pytest.raises(ValueError, match="settings of controller 'bandit' must be a BanditConfig"):
        ControllerConfig("bandit", settings=ModelPolicyConfig())


def test_policy_settings_from_keys_are_the_policys_dataclass_and_default_when_absent():
    bandit = ControllerConfig("bandit", 4, "sync", 8, settings={"gammas": [2, 8], "model": {"margin_pct": 2.0}})
    assert bandit.settings == BanditConfig(gammas=(2, 8), model=ModelPolicyConfig(margin_pct=2.0))
    assert ControllerConfig("model").settings == ModelPolicyConfig()
    assert ControllerConfig("static").settings == StaticConfig()
    assert BanditPolicy(bandit).model.settings.margin_pct == 2.0      # its model policy runs on its table


def test_model_policy_does_not_flap_within_its_margin():
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16,
                              settings=ModelPolicyConfig(margin_pct=10.0))
    policy = ModelPolicy(config)
    settled = _feed(policy, 0.020, 40)
    decisions = set()
    for i in range(100):                                # the RTT wobbles +-1 ms around 20 ms
        decisions.add(_feed(policy, 0.020 + (0.001 if i % 2 else -0.001), 1))
    assert decisions == {settled}


def test_model_policy_fits_t_verify_as_a_line_in_gamma():
    policy = ModelPolicy(ControllerConfig("model", gamma=4, mode="sync", gamma_max=16))
    for gamma, t_verify_s in [(2, 0.005), (8, 0.011)] * 5:
        policy.observe(Observation(gamma, "sync", gamma, gamma, False, 0.01, 0.001, t_verify_s, 0.0))
    assert policy.t_verify_s.at(4) == pytest.approx(0.007, rel=1e-6)
    flat = ModelPolicy(ControllerConfig("model", gamma=4, mode="sync"))
    flat.observe(Observation(4, "sync", 4, 4, False, 0.01, 0.001, 0.009, 0.0))
    assert flat.t_verify_s.at(12) == pytest.approx(0.009)       # one gamma seen: no slope to fit


def test_plan_changes_mid_request_keep_speculative_sampling_exact():
    """Sampled DSD whose gamma and mode change every round (sim, one and two blocks in flight) vs
    the exact distribution of the bigram target's 4-token continuations (vocab 3: 81 outcomes),
    6k runs, chi-square at p > 1e-3 (fixed seeds)."""
    import itertools

    from scipy import stats

    from dsd.backends.protocol import SamplingParams
    from tests.toy_models import BigramLM, random_bigram

    vocab, n_runs, length = 3, 6_000, 4
    target_table = random_bigram(vocab, seed=1, sharpness=1.5)
    target, draft = BigramLM(target_table, "t"), BigramLM(random_bigram(vocab, seed=2, sharpness=1.5), "d")
    exact = _bigram_sequence_probs(target_table, vocab, length)
    counts = dict.fromkeys(exact, 0)
    plans = [Decision(1, "pipelined"), Decision(2, "sync"), Decision(1, "sync"), Decision(3, "pipelined")] * 4
    for run in range(n_runs):
        out = simulate_dsd(draft, target, [0], 2, StopRule(length), LinkCosts(0.001, 0.002, 0.005), False,
                           max_in_flight=1 + run % 2, sampling=SamplingParams(temperature=1.0, seed=run),
                           seq_id=str(run), controller=Scripted(plans[run % 4:]), gamma_max=3)
        counts[tuple(out.generation.tokens)] += 1
    total = sum(exact.values())
    _, p_value = stats.chisquare([counts[s] for s in exact], [exact[s] * n_runs / total for s in exact])
    assert p_value > 1e-3


def test_request_level_dispatch_in_the_sim_keeps_greedy_output_and_records_the_choice():
    """orchestrator/launchers/sim.run_request with a live policy: the model hands far requests to
    cloud AR and near ones to DSD (a link schedule moving under it, two prompt classes of
    different alpha); every request's tokens are the target's greedy ones; the plan columns say
    which mode ran."""
    from dsd.times import ComputeTimes
    from orchestrator.launchers.sim import run_request

    config = SyntheticConfig(alpha=0.5, seed=4, alpha_classes=((1, 0.9), (2, 0.3)))
    draft, target = SyntheticLM(config, "draft"), SyntheticLM(config, "target")
    costs = ComputeTimes(t_draft_edge_s=0.001, t_draft_server_s=0.001, t_ar_s=0.020,
                         t_verify_by_gamma_s={g: 0.020 for g in range(1, 17)}, t_prefill_per_token_s=0.0)
    policy = make_controller(ControllerConfig("model", 4, "sync", 16, ("ar", "sync", "pipelined")))
    stop = StopRule(40)
    modes = []
    for i in range(16):
        rtt_ms = 10.0 if (i // 4) % 2 == 0 else 300.0
        prompt = [1 if i < 8 else 2, 30 + i, 7]
        tokens, rounds, wall_s, _ = run_request("sync", draft, target, prompt, 4, rtt_ms / 1e3, stop, costs, 1,
                                                f"q{i}", policy=policy, gamma_max=16,
                                                rtt_at=lambda t, r=rtt_ms: r / 1e3)
        assert tokens == generate_ar(target, prompt, stop, seq_id=f"a{i}").tokens
        kinds = {r.mode for r in rounds}
        assert kinds <= {"ar", "sync", "pipelined"}        # a DSD request may hand over (and start on the server)
        modes.append(rounds[0].mode)
    assert modes[1:4] != ["ar"] * 3 and all(m == "ar" for m in modes[5:8])      # near, alpha 0.9: DSD; far: AR
    assert all(m == "ar" for m in modes[13:16])                               # far and alpha 0.3


def test_bandit_is_a_controller_the_driver_accepts():
    draft, target = _pair()
    stop = StopRule(60)
    policy = make_controller(ControllerConfig("bandit", 4, "sync", 8))
    run = simulate_dsd(draft, target, [3, 1, 4], 4, stop, LinkCosts(0.001, 0.002, 0.01), pipelined=False,
                       controller=policy, gamma_max=8)
    assert run.generation.tokens == generate_ar(target, [3, 1, 4], stop, seq_id="x").tokens
    assert len({(r.gamma, r.mode) for r in run.generation.rounds}) > 1


class ByPosition:
    """A controller whose plan depends on how many tokens are committed: (from token n, plan)."""

    def __init__(self, stop: StopRule, plans):
        self.stop, self.plans, self.seen, self.generated = stop, plans, [], 0

    def observe(self, observation):
        self.seen.append(observation)
        self.generated = self.stop.max_new_tokens - observation.remaining_tokens

    def decide(self):
        return [plan for start, plan in self.plans if start <= self.generated][-1]


HANDOVER_PLANS = [(0, Decision(3, "sync")), (10, Decision(1, "ar")), (30, Decision(5, "pipelined")),
                  (50, Decision(2, "colocated")), (70, Decision(2, "sync")), (85, Decision(1, "ar")),
                  (100, Decision(4, "pipelined"))]


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("segment", [1, 4])
def test_a_mid_request_hand_over_to_the_server_and_back_keeps_the_target_greedy_output(depth, segment):
    """DSD -> cloud AR -> pipelined DSD -> co-located -> ... within one request (sim): every
    token is the target's greedy one, each committed once (emitted counts add up to the output),
    and the rounds say where each ran."""
    draft, target = _pair()
    stop = StopRule(120)
    for i in range(3):
        prompt = [i + 2, 9, 4]
        expected = generate_ar(target, prompt, stop, seq_id=f"ar{i}").tokens
        controller = ByPosition(stop, HANDOVER_PLANS)
        run = simulate_dsd(draft, target, prompt, 4, stop, LinkCosts(0.001, 0.002, 0.03, t_ar_s=0.01,
                                                                     t_draft_server_s=0.0005),
                           pipelined=False, max_in_flight=depth, seq_id=f"h{i}", controller=controller,
                           gamma_max=8, handover_tokens=segment)
        assert run.generation.tokens == expected
        assert sum(r.emitted for r in run.generation.rounds) == len(expected)
        modes = [r.mode for r in run.generation.rounds if not r.stale]
        runs = [mode for mode, _ in itertools.groupby(modes)]
        assert runs[0] == "sync" and {"ar", "colocated", "pipelined"} <= set(runs)
        assert runs.index("pipelined") > runs.index("ar")                 # back to the edge after the server
        # every segment's acknowledgement is seen too: a server round without compute, the link's RTT
        acks = [o for o in controller.seen if o.mode in ("ar", "colocated") and o.t_verify_s is None]
        assert acks and all(o.tokens == 0 and o.rtt_s == pytest.approx(0.03) for o in acks)
        assert len(controller.seen) == len(run.generation.rounds) + len(acks)
        server = [o for o in controller.seen if o.mode in ("ar", "colocated")]
        assert all(o.shadow_positions == o.tokens for o in server)          # greedy: drafted along the stream


class ByRtt:
    """Cloud AR while the link's last measured RTT is above 50 ms (or none is), else pipelined DSD."""

    def __init__(self):
        self.rtt_s = None

    def observe(self, observation):
        self.rtt_s = observation.rtt_s if observation.rtt_s is not None else self.rtt_s

    def decide(self):
        return Decision(1, "ar") if self.rtt_s is None or self.rtt_s > 0.05 else Decision(4, "pipelined")


def _tokens_on_the_server_across_a_fall(new_protocol: bool, monkeypatch) -> tuple[int, float, list[int]]:
    from dsd import simulate

    if not new_protocol:       # a verifier without Queued and Withdraw: the segments' tokens show the link
        monkeypatch.setattr(simulate.VirtualLink, "acknowledge", lambda *_: None)
        monkeypatch.setattr(simulate.VirtualLink, "withdraws", False)
    draft, target = _pair()
    stop = StopRule(160)
    run = simulate_dsd(draft, target, [5, 9, 4], 4, stop, LinkCosts(0.001, 0.002, 0.15, t_ar_s=0.01),
                       pipelined=False, controller=ByRtt(), gamma_max=8, handover_tokens=4,
                       rtt_at=lambda t_s: 0.15 if t_s < 0.6 else 0.01)
    monkeypatch.undo()
    return sum(r.emitted for r in run.generation.rounds if r.mode == "ar"), run.total_s, run.generation.tokens


def test_withdrawing_asked_segments_brings_a_stream_back_soon_after_the_link_gets_faster(monkeypatch):
    """The link falls 150 -> 10 ms while a request streams in cloud AR (sim). The stream is asked
    a round trip of the old link ahead; once the new link shows (a segment's Queued, or its
    tokens), the edge withdraws the segments not started and drafts again after the one being
    served, instead of after all of them: fewer tokens at the server's AR pace, same output."""
    ar_tokens, total_s, tokens = _tokens_on_the_server_across_a_fall(True, monkeypatch)
    ar_without, total_without_s, tokens_without = _tokens_on_the_server_across_a_fall(False, monkeypatch)
    draft, target = _pair()
    assert tokens == tokens_without == generate_ar(target, [5, 9, 4], StopRule(160), seq_id="f").tokens
    assert ar_tokens <= ar_without - 8, (ar_tokens, ar_without)
    assert total_s < total_without_s - 0.01, (total_s, total_without_s)


def test_a_plan_back_to_the_edge_on_a_link_that_held_still_withdraws_nothing(monkeypatch):
    """Withdrawing is for a link that fell: on a steady link the segments asked stay (and the
    output is the target's); across the fall of the test above, a withdraw is sent."""
    from dsd import simulate

    calls = []
    real = simulate.VirtualLink.withdraw

    async def spy(self, drop, after):
        calls.append(drop)
        return await real(self, drop, after)

    monkeypatch.setattr(simulate.VirtualLink, "withdraw", spy)
    draft, target = _pair()
    stop = StopRule(120)
    run = simulate_dsd(draft, target, [2, 9, 4], 4, stop, LinkCosts(0.001, 0.002, 0.03, t_ar_s=0.01),
                       pipelined=False, controller=ByPosition(stop, HANDOVER_PLANS), gamma_max=8)
    assert run.generation.tokens == generate_ar(target, [2, 9, 4], stop, seq_id="s").tokens
    assert {r.mode for r in run.generation.rounds} >= {"ar", "pipelined"} and calls == []
    simulate_dsd(draft, target, [5, 9, 4], 4, StopRule(160), LinkCosts(0.001, 0.002, 0.15, t_ar_s=0.01),
                 pipelined=False, controller=ByRtt(), gamma_max=8, rtt_at=lambda t_s: 0.15 if t_s < 0.6 else 0.01)
    assert len(calls) == 1 and calls[0] >= 2, calls


class ByPositionLookingAhead(ByPosition):
    """ByPosition, whose streams are asked ahead for a 0.3 s link (a slower one than the test's)."""

    def stream_ahead_s(self):
        return 0.3


def test_a_plan_back_to_the_edge_withdraws_the_segments_asked_only_for_the_look_ahead():
    """On a steady 30 ms link (sim), cloud AR from token 10 to 30 is asked 0.3 s ahead (a
    controller's ``stream_ahead_s``): some 30 tokens, 8 segments of 4. When the plan goes back
    to the edge, the segments asked for the look-ahead alone are withdrawn: the server serves
    the 20 tokens planned and what a round trip of this link keeps asked, not the 30 beyond."""
    draft, target = _pair()
    stop = StopRule(120)
    plans = [(0, Decision(3, "sync")), (10, Decision(1, "ar")), (30, Decision(5, "pipelined"))]
    run = simulate_dsd(draft, target, [2, 9, 4], 4, stop, LinkCosts(0.001, 0.002, 0.03, t_ar_s=0.01),
                       pipelined=False, controller=ByPositionLookingAhead(stop, plans), gamma_max=8,
                       handover_tokens=4)
    assert run.generation.tokens == generate_ar(target, [2, 9, 4], stop, seq_id="l").tokens
    ar_tokens = sum(r.emitted for r in run.generation.rounds if r.mode == "ar")
    assert 20 <= ar_tokens <= 20 + 3 * 4, ar_tokens       # a round trip of 30 ms and a step: 2 segments, and 1 serving


class ByRttLookingAhead(ByRtt):
    """ByRtt, whose streams are asked 0.4 s ahead (as the model policy's for a link that may slow)."""

    def stream_ahead_s(self):
        return 0.4


def _ar_tokens_across_a_late_fall(infer: bool, monkeypatch) -> tuple[int, float, list[int]]:
    from dsd import handover

    if not infer:
        monkeypatch.setattr(handover, "fallen_rtt_s", lambda *args: None)
    draft, target = _pair()
    run = simulate_dsd(draft, target, [5, 9, 4], 4, StopRule(60), LinkCosts(0.001, 0.002, 0.15, t_ar_s=0.02),
                       pipelined=False, controller=ByRttLookingAhead(), gamma_max=8, handover_tokens=4,
                       rtt_at=lambda t_s: 0.15 if t_s < 1.0 else 0.01)
    monkeypatch.undo()
    return sum(r.emitted for r in run.generation.rounds if r.mode == "ar"), run.total_s, run.generation.tokens


def test_a_burst_of_stream_tokens_shows_a_fall_that_no_segment_was_left_to_measure(monkeypatch):
    """The link falls 150 -> 10 ms after a 60-token cloud-AR stream, asked 0.4 s ahead, has asked
    its whole budget (sim): no Generate is left whose acknowledgement could show the new link. The tokens sent
    after the fall catch up with those on the old path and arrive in a burst; its drift below the
    server's pace reads as a link about 110 ms faster, so the plan goes back to the edge and the
    segments not started are withdrawn: fewer tokens at the server's pace, sooner, same output."""
    ar_tokens, total_s, tokens = _ar_tokens_across_a_late_fall(True, monkeypatch)
    ar_without, total_without_s, tokens_without = _ar_tokens_across_a_late_fall(False, monkeypatch)
    draft, target = _pair()
    assert tokens == tokens_without == generate_ar(target, [5, 9, 4], StopRule(60), seq_id="b").tokens
    assert ar_without == 60 and ar_tokens <= ar_without - 4, (ar_tokens, ar_without)
    assert total_s < total_without_s - 0.01, (total_s, total_without_s)


class RecordingByRtt(ByRttLookingAhead):
    """ByRttLookingAhead that keeps every RTT it is shown: (rtt_s, inferred)."""

    def __init__(self):
        super().__init__()
        self.rtts = []

    def observe(self, observation):
        super().observe(observation)
        if observation.rtt_s is not None:
            self.rtts.append((observation.rtt_s, observation.rtt_inferred))


def test_after_a_burst_read_as_a_fall_no_segment_asked_before_it_measures_the_link():
    """Across the late fall above, the segments asked before the burst showed it come back out on
    the old link and back on the new one: their round trips are of neither link, and would pull
    the estimate back up. Once the burst is read, the controller is shown only the new link."""
    controller = RecordingByRtt()
    draft, target = _pair()
    simulate_dsd(draft, target, [5, 9, 4], 4, StopRule(60), LinkCosts(0.001, 0.002, 0.15, t_ar_s=0.02),
                 pipelined=False, controller=controller, gamma_max=8, handover_tokens=4,
                 rtt_at=lambda t_s: 0.15 if t_s < 1.0 else 0.01)
    first_guess = [inferred for _, inferred in controller.rtts].index(True)
    assert all(rtt_s <= 0.075 for rtt_s, _ in controller.rtts[first_guess:]), controller.rtts[first_guess:]
    assert all(rtt_s == pytest.approx(0.15) for rtt_s, _ in controller.rtts[:first_guess])


class ByRttDecidedOnAProbe(ByRtt):
    """ByRtt in a request sent to the server on a probe of 150 ms: the link the plan was decided on."""

    def link_rtt_s(self):
        return 0.15


def _server_tokens_after_a_stale_probe(controller) -> tuple[int, list[int]]:
    draft, target = _pair()
    run = simulate_dsd(draft, target, [5, 9, 4], 4, StopRule(60), LinkCosts(0.001, 0.002, 0.01, t_ar_s=0.01),
                       pipelined=False, controller=controller, gamma_max=8, handover_tokens=4)
    return sum(r.emitted for r in run.generation.rounds if r.mode == "ar"), run.generation.tokens


def test_a_request_sent_to_the_server_on_a_stale_probe_comes_back_after_its_first_segment():
    """A request starts in cloud AR, decided on a probe of 150 ms, but the link is at 10 ms by
    then (sim). Its first two segments' worth is asked before any tokens measure the server's
    pace; the first acknowledgement shows the fall against the probe (``link_rtt_s``), so all but
    the first segment are withdrawn and drafting resumes after its one token: while the request
    has not measured the link, the first segment (the one a Withdraw cannot take back) asks one
    token, the next the rest of ``handover_tokens`` (before: 4, then 4; netns seeds 1, 3, 4 of
    session 18 served 4 at 20 ms a step). A controller that says nothing of the RTT it decided on
    keeps them all (the fall does not show: 1 + 3 + 4 tokens, segments ending where they did)."""
    ar_tokens, tokens = _server_tokens_after_a_stale_probe(ByRttDecidedOnAProbe())
    ar_without, tokens_without = _server_tokens_after_a_stale_probe(ByRtt())
    draft, target = _pair()
    assert tokens == tokens_without == generate_ar(target, [5, 9, 4], StopRule(60), seq_id="p").tokens
    assert (ar_tokens, ar_without) == (1, 8)


def test_a_server_plan_is_refused_naming_the_mode_where_the_link_cannot_hand_over():
    draft, target = _pair()
    with pytest.raises(ValueError, match="mode"):
        simulate_dsd(draft, target, [1, 2], 4, StopRule(30), LinkCosts(0.001, 0.002, 0.01), False,
                     controller=Scripted([Decision(4, "sync"), Decision(1, "ar")]), gamma_max=8)
    with pytest.raises(ValueError, match="handover"):
        ControllerConfig("model", handover="yes")


def test_hand_overs_keep_speculative_sampling_exact():
    """Sampled requests whose rounds move between edge DSD, cloud AR and co-located SD (segments
    of one token) vs the exact distribution of the bigram target's 4-token continuations (vocab
    3: 81 outcomes), 4k runs, chi-square at p > 1e-3 (fixed seeds)."""
    import itertools

    from scipy import stats

    from dsd.backends.protocol import SamplingParams
    from tests.toy_models import BigramLM, random_bigram

    vocab, n_runs, length = 3, 4_000, 4
    target_table = random_bigram(vocab, seed=1, sharpness=1.5)
    target, draft = BigramLM(target_table, "t"), BigramLM(random_bigram(vocab, seed=2, sharpness=1.5), "d")
    exact = _bigram_sequence_probs(target_table, vocab, length)
    counts, handed_over = dict.fromkeys(exact, 0), 0
    plans = [Decision(1, "sync"), Decision(1, "ar"), Decision(2, "pipelined"), Decision(2, "colocated")] * 4
    costs = LinkCosts(0.001, 0.002, 0.005, t_ar_s=0.002, t_draft_server_s=0.001)
    for run in range(n_runs):
        out = simulate_dsd(draft, target, [0], 2, StopRule(length), costs, False, max_in_flight=1 + run % 2,
                           sampling=SamplingParams(temperature=1.0, seed=run), seq_id=str(run),
                           controller=Scripted(plans[run % 4:]), gamma_max=3, handover_tokens=1)
        handed_over += bool({r.mode for r in out.generation.rounds} & {"ar", "colocated"})
        counts[tuple(out.generation.tokens)] += 1
    assert handed_over > n_runs / 3
    total = sum(exact.values())
    _, p_value = stats.chisquare([counts[s] for s in exact], [exact[s] * n_runs / total for s in exact])
    assert p_value > 1e-3


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
        run = simulate_dsd(draft, target, prompt, 8, stop, costs, True, controller=policy, gamma_max=16,
                           seq_id=f"m{i}", mode="pipelined")
        assert run.generation.tokens == generate_ar(target, prompt, stop, seq_id=f"a{i}").tokens
        runs.append([r.mode for r in run.generation.rounds if not r.stale])
    assert "ar" not in runs[1]                                   # alpha 0.9: DSD pays
    assert runs[2][0] == "pipelined" and runs[2][-1] == "ar"     # alpha 0.2: handed over mid-request
    assert runs[3][0] == "ar" and runs[3][-1] == "pipelined"     # alpha 0.9 again: back to the edge
    for modes in runs[2:]:
        assert sum((a == "ar") != (b == "ar") for a, b in zip(modes, modes[1:])) == 1    # no flapping


def _bigram_sequence_probs(target_table, vocab: int, length: int) -> dict:
    """Every token sequence of the given length and its probability under the bigram target
    (starting after token 0): the distribution exact sampling must reproduce."""
    exact = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, previous = 1.0, 0
        for token in seq:
            prob *= float(target_table[previous, token])
            previous = token
        exact[seq] = prob
    return exact


def test_a_stream_measures_the_link_on_every_segment_and_sees_it_fall():
    """A request streamed from the server (cloud AR in a DSD session) over a link that falls from
    150 to 10 ms mid-stream: the first tokens of every segment measure the RTT (not only the
    first segment's), so the controller sees 150 ms, then 10 ms; each direction of the link stays
    in order, so the output is still the target's greedy one."""
    draft, target = _pair(alpha=0.8)
    stop = StopRule(120)
    prompt = [3, 9, 4]
    expected = generate_ar(target, prompt, stop, seq_id="ar").tokens
    controller = Scripted([Decision(1, "ar")])
    run = simulate_dsd(draft, target, prompt, 4, stop, LinkCosts(0.001, 0.02, 0.15, t_ar_s=0.02), False,
                       controller=controller, gamma_max=8, rtt_at=lambda t: 0.150 if t < 1.0 else 0.010,
                       t_open_s=0.0)
    assert run.generation.tokens == expected
    rtts = [o.rtt_s for o in controller.seen if o.rtt_s is not None]
    assert len(rtts) >= 120 // 4 // 2                  # about one per 4-token segment, not one per stream
    assert rtts[0] == pytest.approx(0.150, abs=1e-9)
    assert rtts[-1] == pytest.approx(0.010, abs=1e-9)
    assert all(b >= 0 for b in rtts)
    shadow = [o for o in controller.seen if o.shadow_positions]
    assert sum(o.shadow_matches for o in shadow) / sum(o.shadow_positions for o in shadow) > 0.6


def test_a_session_that_hands_over_at_once_costs_about_a_plain_server_request():
    """The edge sends Open and Generate back to back (it does not wait for Opened), so a request
    that starts on the server inside a DSD session takes what cloud AR alone takes, not an extra
    round trip (the sim used to charge one)."""
    from dsd.simulate import ServerCosts, simulate_on_server

    draft, target = _pair(alpha=0.8)
    stop = StopRule(48)
    rtt_s, t_ar_s, prefill_s = 0.150, 0.020, 0.005
    plain = simulate_on_server(draft, target, [3, 9, 4], 1, stop, "ar",
                               ServerCosts(t_ar_s, 0.001, t_ar_s, prefill_s, rtt_s / 2), seq_id="plain")
    session = simulate_dsd(draft, target, [3, 9, 4], 4, stop, LinkCosts(0.001, t_ar_s, rtt_s, t_ar_s=t_ar_s), False,
                           controller=Scripted([Decision(1, "ar")]), gamma_max=8, t_open_s=prefill_s, seq_id="s")
    assert session.generation.tokens == plain.generation.tokens
    assert plain.total_s <= session.total_s < plain.total_s + rtt_s / 4


class ScriptedKnowingThePace(Scripted):
    """Scripted, with the link and the server's step as learnt from earlier requests."""

    def __init__(self, plans, rtt_s, step_s):
        super().__init__(plans)
        self.link_rtt_s, self.server_step_s = (lambda: rtt_s), (lambda: step_s)


def test_a_stream_begun_on_the_server_is_asked_a_round_trip_ahead_on_the_pace_learnt_before():
    """Before a request's first token measures the server's step, its stream used to be kept two
    segments (8 tokens, 0.16 s at 20 ms) ahead: on a 150 ms link the server idled until the next
    Generate came (~12 ms a request on netns). With the controller's pace from earlier requests it
    is asked a round trip ahead from the start and takes what one plain server request takes."""
    from dsd.simulate import ServerCosts, simulate_on_server

    draft, target = _pair(alpha=0.8)
    stop = StopRule(48)
    rtt_s, t_ar_s, prefill_s = 0.150, 0.020, 0.005
    plain = simulate_on_server(draft, target, [3, 9, 4], 1, stop, "ar",
                               ServerCosts(t_ar_s, 0.001, t_ar_s, prefill_s, rtt_s / 2), seq_id="plain")

    def session_s(controller) -> float:
        run = simulate_dsd(draft, target, [3, 9, 4], 4, stop, LinkCosts(0.001, t_ar_s, rtt_s, t_ar_s=t_ar_s),
                           False, controller=controller, gamma_max=8, t_open_s=prefill_s, seq_id="s")
        assert run.generation.tokens == plain.generation.tokens
        return run.total_s

    knowing = session_s(ScriptedKnowingThePace([Decision(1, "ar")], rtt_s, t_ar_s))
    unknowing = session_s(Scripted([Decision(1, "ar")]))
    assert knowing < plain.total_s + 0.002 < unknowing


def test_level_follows_a_step_of_the_link_but_not_one_outlier():
    from dsd.estimators import Level

    level = Level(0.9)
    for _ in range(30):
        level.add(0.010)
    level.add(0.150)                                   # one spike: the discounted mean only
    assert level.value < 0.030
    level.add(0.010)
    for _ in range(2):                                 # a step up: two in a row restart it
        level.add(0.150)
    assert level.value == pytest.approx(0.150)
    level.add(0.010)                                   # a fall: one is enough (delays only add)
    assert level.value == pytest.approx(0.010)


def test_acceptance_change_test_finds_a_drop_within_a_few_rounds_and_holds_when_stationary():
    import random

    from dsd.estimators import Acceptance

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
    assert min(seen[:6]) < 0.6                         # the running value alone: ~0.8 after six rounds
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

    from dsd.estimators import Acceptance

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
    for sequence, at_boundary, mid_request in (([1, 0, 0, 1, 0, 1, 0, 1, 0], 4, None),
                                               ([0, 0, 2, 0, 0, 0, 0, 0, 0], 4, 7),
                                               ([0, 0, 0, 1, 1, 0, 0, 0, 0], 2, 7)):
        assert first_below_half(sequence, True) == at_boundary
        assert first_below_half(sequence, False) == mid_request
    for alpha, gamma in ((0.3, 2), (0.9, 16), (0.6, 4), (0.9, 8)):     # stationary, a request every 6 rounds
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
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync"),
                              settings=ModelPolicyConfig(t_ar_s=T_AR_S))
    policy = ModelPolicy(config)
    assert _feed(policy, 0.300, 40) == Decision(1, "ar")
    stream = dict(proposed=0, accepted=0, stale=False, t_draft_s=None, t_verify_s=T_AR_S, server_queue_s=0.0,
                  tokens=1, interval_s=T_AR_S, remaining_tokens=60)
    policy.observe(Observation(1, "ar", rtt_s=0.300, **stream))
    assert policy.decide() == Decision(1, "ar")
    policy.observe(Observation(1, "ar", rtt_s=0.002, **stream))          # a segment's first tokens: 2 ms
    assert policy.decide().mode == "sync"


def _after_six_shadow_matches_at_a_new_prompt(rtt_s: float) -> tuple[ModelPolicy, Decision]:
    """The benchmark's profile (draft 1 ms, verify = AR step = 20 ms): rounds at alpha 0.3, so a
    new request at ``rtt_s`` goes to cloud AR; then its stream's first six tokens all match the
    edge's shadow drafts (a new prompt: the estimate restarts from them at 1.0)."""
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync", "pipelined"),
                              settings=ModelPolicyConfig(t_ar_s=0.02))
    policy = ModelPolicy(config)
    for accepted in [0, 0, 1, 0, 1] * 8:                           # alpha 2/7
        policy.observe(Observation(4, "sync", 4, accepted, False, rtt_s, 0.001, 0.02, 0.0, remaining_tokens=32))
    assert _request_plan(policy, rtt_s) == Decision(1, "ar")
    for left in range(32, 26, -1):
        policy.observe(Observation(1, "ar", 0, 0, False, None, None, 0.02, 0.0, tokens=1, interval_s=0.02,
                                   shadow_positions=1, shadow_matches=1, remaining_tokens=left))
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
        config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync", "pipelined"),
                                  settings=ModelPolicyConfig(t_ar_s=0.02))
        policy = ModelPolicy(config)
        for accepted in [0, 0, 1, 0, 1] * 8:                        # alpha 2/7
            policy.observe(Observation(4, "sync", 4, accepted, False, 0.01, 0.001, 0.02, 0.0, remaining_tokens=32))
        assert _request_plan(policy, 0.01) == Decision(1, "ar")
        for k, match in enumerate([1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 1, 0]):
            policy.observe(Observation(1, "ar", 0, 0, False, None, None, 0.02, 0.0, tokens=1, interval_s=0.02,
                                       shadow_positions=1, shadow_matches=match, remaining_tokens=31 - k))
            policy.decide()
        assert 0.5 < policy.alpha < 0.55 and policy.acceptance.lower_bound(1.0) < 0.4
        return policy.current, _request_plan(policy, 0.01)

    assert run(1.0) == (Decision(1, "ar"), Decision(1, "ar"))
    stream, request = run(0.0)
    assert stream.mode == request.mode == "pipelined"


def test_finite_request_factor_charges_the_budget_overshoot_of_long_rounds():
    from dsd.policy_model import finite_request_factor

    assert finite_request_factor("ar", 1, 0.9, 10) == 1.0
    assert finite_request_factor("sync", 8, 0.9, None) == 1.0
    e = lm.expected_tokens_per_round(0.9, 16)
    assert finite_request_factor("pipelined", 16, 0.9, 48) == pytest.approx(1 + (e - 1) / 96)
    assert finite_request_factor("sync", 16, 0.9, 48) > finite_request_factor("sync", 4, 0.9, 48)


def test_bandit_explores_an_untried_server_kind_by_a_hand_over_and_credits_its_pace():
    """Every request is a DSD session: the first round runs the request's start plan, a kind never
    tried (cloud AR) is explored by a hand-over within the request, and its rate leaves out the
    hand-over's round trip (1 token in 0.17 s of which 0.15 s was the link: 50 tokens/s)."""
    config = ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=4, modes=("ar", "sync"),
                              settings=BanditConfig(gammas=(4,), prior_rounds=0))
    policy = BanditPolicy(config)
    start = policy.decide_request(0.010)
    assert start == Decision(4, "sync") and policy.decide() == start     # DSD first: no hand-over to try it
    _bandit_round(policy, start, 3)
    assert policy.decide() == Decision(1, "ar")                         # untried: one segment on the server
    policy.observe(Observation(1, "ar", 0, 0, False, 0.150, None, 0.020, 0.0, tokens=1, interval_s=0.170,
                               remaining_tokens=40))
    tokens, seconds, _ = policy._known()[Decision(1, "ar")]
    assert tokens / seconds == pytest.approx(50.0)
    assert policy.decide() == Decision(4, "sync")                       # DSD earned more: back to the edge


def test_bandit_contexts_do_not_flip_on_jitter_at_a_bucket_edge():
    """A 10 ms link measured at 10-13 ms (jitter, load) stays in one RTT context; a step to 150 ms
    moves it at once; the alpha context moves only a quarter bucket past an edge."""
    assert {BanditPolicy.rtt_bucket_of(ms / 1e3, 3) for ms in (9.0, 10.6, 11.7, 13.2)} == {3}
    assert BanditPolicy.rtt_bucket_of(0.150, 3) == 7 and BanditPolicy.rtt_bucket_of(0.010, 7) == 3
    policy = BanditPolicy(ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=8, modes=("sync",)))
    for accepted in (3, 3, 3, 2, 3, 3):                 # alpha ~0.62-0.66: bucket 3 (0.6-0.8)
        _bandit_round(policy, Decision(4, "sync"), accepted)
    assert policy.context[1] == 3
    _bandit_round(policy, Decision(4, "sync"), 2)       # ~0.58: just under the edge, still 3
    assert policy.context[1] == 3


def _far_policy():
    config = ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=8, modes=("ar", "sync"),
                              settings=BanditConfig(gammas=(2, 8)))
    policy = BanditPolicy(config)
    policy.rtt_bucket, policy.alpha_bucket = 7, 4                          # 150 ms, alpha 0.8-1
    policy._credit((7, 4), Decision(1, "ar"), 50.0, 1.0, 20.0)           # cloud AR: 50 tokens/s
    return policy


def test_bandit_kind_is_not_worth_its_luckiest_single_round():
    """At 150 ms sync 2 earned 29 tokens/s over ten rounds, sync 8 once 9 tokens in 0.178 s (50.6/s,
    above cloud AR's 50): the kind's value shrinks that one round toward the kind's pooled rate, so
    the request stays on the server instead of exploring DSD arms there."""
    policy = _far_policy()
    for _ in range(10):
        policy._credit((7, 4), Decision(2, "sync"), 5.0, 5 / 29.0, 1.0)
    policy._credit((7, 4), Decision(8, "sync"), 9.0, 0.178, 1.0)
    values = policy._kind_values(policy._kinds(policy.config.modes))
    assert values["dsd"][0] == pytest.approx((9 / 0.178 + 59 / (50 / 29.0 + 0.178)) / 2, rel=0.01)  # (discounting)
    assert values["dsd"][0] < 45.0
    assert policy._ucb_kind(values, "ar") == "ar"


def test_bandit_borrows_dsd_only_from_a_neighbouring_or_a_dominating_context():
    """DSD untried at (150 ms, alpha 0.2-0.4): what it earned at 10 ms and alpha 0.8-1 bounds it
    from above (a faster link, a higher acceptance), so that optimistic rate stands in for it; if
    it is below cloud AR there is nothing to explore. A context with a faster link but a lower
    acceptance bounds nothing: DSD stays untried there."""
    policy = _far_policy()
    policy.alpha_bucket = 1
    policy._credit((3, 0), Decision(8, "sync"), 60.0, 1.0, 30.0)
    assert policy._kind_values(policy._kinds(policy.config.modes), borrow=True)["dsd"] is None
    policy._credit((3, 4), Decision(8, "sync"), 40.0, 1.0, 30.0)
    values = policy._kind_values(policy._kinds(policy.config.modes), borrow=True)
    assert values["dsd"][0] == pytest.approx(40.0)          # a rate: the discount cancels
    assert policy._ucb_kind(values, "ar") == "ar"


def test_bandit_prior_skips_arms_the_closed_form_puts_far_behind():
    """With the informed prior (the closed form on the measured estimates, as pseudo-rounds), a
    bandit at 10 ms whose drafts are all accepted does not spend rounds on gamma 1 or on cloud AR
    (predicted two to six times slower) nor hand over to try the server; without it every arm and
    kind is tried once."""
    def first_picks(prior_rounds):
        config = ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=8, modes=("ar", "sync"),
                                  settings=BanditConfig(gammas=(1, 2, 4, 8), prior_rounds=prior_rounds))
        policy = BanditPolicy(config)
        policy.decide_request(0.010)
        seen = []
        for _ in range(30):
            d = policy.decide()
            seen.append(d)
            if d.mode == "ar":
                policy.observe(Observation(1, "ar", 0, 0, False, 0.010, None, 0.020, 0.0, tokens=1,
                                           interval_s=0.030, remaining_tokens=40))
            else:
                _bandit_round(policy, d, d.gamma)
        return seen

    informed = first_picks(6.0)
    assert Decision(1, "sync") not in informed and all(d.mode == "sync" for d in informed)
    assert sum(d.gamma == 8 for d in informed[-10:]) >= 9
    uninformed = first_picks(0)
    assert Decision(1, "sync") in uninformed and Decision(1, "ar") in uninformed


def test_bandit_prior_is_outweighed_by_what_an_arm_earns():
    """The prior is a prediction, not a measurement: gamma 8 is predicted best (every draft is
    accepted), but its pipelined blocks wait 0.3 s in the verifier's queue (which the model leaves
    out of its estimate of the queueing: a pipelined block may be waiting behind the edge's own
    previous one), so it earns less than gamma 2 would; the bandit leaves it within a few rounds."""
    config = ControllerConfig("bandit", gamma=8, mode="pipelined", gamma_max=8, modes=("pipelined",),
                              settings=BanditConfig(gammas=(2, 8)))
    policy = BanditPolicy(config)
    picks = []
    for _ in range(60):
        d = policy.decide()
        picks.append(d.gamma)
        queue_s = 0.3 if d.gamma == 8 else 0.0
        policy.observe(Observation(d.gamma, "pipelined", d.gamma, d.gamma, False, 0.01, 0.001, 0.02, queue_s))
    assert picks[:2] == [8, 8]
    assert 2 in picks[:12]
    assert sum(g == 2 for g in picks[-20:]) >= 18


class _BackWhenNear:
    """Cloud AR until a round measures the link under 50 ms, then sync DSD (gamma 4)."""

    def __init__(self):
        self.near, self.seen = False, []

    def observe(self, observation):
        self.seen.append(observation)
        self.near = self.near or (observation.rtt_s is not None and observation.rtt_s < 0.05)

    def decide(self):
        return Decision(4, "sync") if self.near else Decision(1, "ar")


def test_a_stream_does_not_ask_for_the_rest_of_the_request_when_the_link_falls():
    """An AR stream at 150 ms whose link falls to 10 ms (over 80 ms): the tokens the slow link
    held back arrive in a burst, whose gaps are not the server's pace (its compute per token bounds
    the step), so the stream keeps asking only a round trip's worth ahead and the request is back
    on the edge within a few segments (36 of 96 tokens on the server). With the burst's gaps of a
    few ms taken as the server's step it asked for the whole rest of the request at once and
    finished it on the server (84), as on netns. (A step fall in the sim delivers the burst with
    gaps of exactly 0, which the driver never took as a step.)"""
    draft, target = _pair(alpha=0.9)
    stop, prompt = StopRule(96), [3, 9, 4]

    def rtt_at(t_s):
        return 0.150 if t_s < 0.5 else 0.010 if t_s >= 0.58 else 0.150 - 0.140 * (t_s - 0.5) / 0.08

    controller = _BackWhenNear()
    run = simulate_dsd(draft, target, prompt, 4, stop, LinkCosts(0.001, 0.02, 0.15, t_ar_s=0.02),
                       pipelined=False, seq_id="fall", controller=controller, gamma_max=8, handover_tokens=4,
                       rtt_at=rtt_at)
    assert run.generation.tokens == generate_ar(target, prompt, stop, seq_id="fall-ar").tokens
    rounds = [r for r in run.generation.rounds if not r.stale]
    assert controller.near and rounds[-1].mode == "sync"
    assert sum(r.emitted for r in rounds if r.mode == "ar") <= 44


def _feed_queued(policy, rtt_s, rounds, queue_s, mode="sync"):
    """Rounds of gamma 4 as ``_feed``'s, each having waited ``queue_s`` in the verifier's queue."""
    for i in range(rounds):
        accepted = (4, 4, 4, 4, 2)[i % 5]
        policy.observe(Observation(4, mode, 4, accepted, False, rtt_s, PROFILE["t_draft_s"], PROFILE["t_verify_s"],
                                   queue_s))
    return policy.decide()


def test_model_charges_the_verifiers_queueing_per_pass_so_a_loaded_server_moves_it_off_cloud_ar():
    """Far (300 ms) at alpha ~0.95, cloud AR (20 ms a step) beats sync DSD on an idle verifier.
    With 30 ms of queueing per pass, AR pays it on every token and a sync round once per ~11
    tokens: the model measures the queueing and picks sync DSD at the gamma the closed form with
    the queueing added says, in its rounds and for the next request."""
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "ar"),
                              settings=ModelPolicyConfig(t_ar_s=T_AR_S))
    idle, loaded = ModelPolicy(config), ModelPolicy(config)
    assert _feed_queued(idle, 0.300, 40, 0.0) == Decision(1, "ar")
    assert _request_plan(idle, 0.300) == Decision(1, "ar")
    plan = _feed_queued(loaded, 0.300, 40, 0.030)
    assert plan.mode == "sync" and _request_plan(loaded, 0.300).mode == "sync"
    assert loaded.server_queue_s == pytest.approx(0.030)
    expected, _ = best_decision(loaded.alpha, loaded.rtt_s.value, PROFILE["t_draft_s"], PROFILE["t_verify_s"],
                                ("sync", "ar"), 16, T_AR_S, queue_s=0.030)
    assert plan == expected
    # among sync plans, a fixed cost per round wants longer rounds: the queueing grows gamma as RTT does
    near = [best_decision(rtt_s=0.010, modes=("sync",), gamma_max=16, t_ar_s=T_AR_S, queue_s=q, **PROFILE)[0].gamma
            for q in (0.0, 0.050)]
    assert near[0] < near[1]


def test_model_counts_only_queueing_behind_other_clients_not_its_own_work():
    """A pipelined block waits behind the edge's previous block, a request's first round behind its
    own Open, a hand-over segment's first step behind the segment before: none of that is load.
    A sync round after a sync round, and a stream's later steps (per pass), are."""
    config = ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("sync", "pipelined", "ar"),
                              settings=ModelPolicyConfig(t_ar_s=T_AR_S))
    policy = ModelPolicy(config)
    _feed_queued(policy, 0.010, 10, 0.015, mode="pipelined")
    assert policy.server_queue_s == 0.0
    policy.decide_request(0.010)
    _feed_queued(policy, 0.010, 1, 0.015)                    # the request's first round
    assert policy.server_queue_s == 0.0
    step = dict(gamma=1, mode="ar", proposed=0, accepted=0, stale=False, t_draft_s=None, t_verify_s=0.02, tokens=1)
    policy.observe(Observation(rtt_s=0.010, server_queue_s=0.05, **step))      # a segment's first step
    assert policy.server_queue_s == 0.0
    policy.observe(Observation(rtt_s=None, server_queue_s=0.004, **step))      # a later step: others' passes
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
        run = simulate_dsd(draft, target, prompt, 8, stop, costs, True, controller=policy, gamma_max=16,
                           seq_id=f"step{i}", mode="pipelined", rtt_at=rtt_at)
        assert run.generation.tokens == generate_ar(target, prompt, stop, seq_id=f"a{i}").tokens
        assert [r.mode for r in run.generation.rounds if not r.stale][-1] == "ar"
    return run.total_s


def _look_ahead_config(floor_s: float) -> ControllerConfig:
    return ControllerConfig("model", 8, "pipelined", 16, ("ar", "sync", "pipelined"),
                            settings=ModelPolicyConfig(stream_ahead_floor_s=floor_s))


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
    policy = ModelPolicy(ControllerConfig("model", 8, "pipelined", 16, ("ar", "sync", "pipelined"),
                                          settings=ModelPolicyConfig(stream_ahead_floor_s=0.0)))
    assert policy.stream_ahead_s() is None
    for rtt_s in (0.150, 0.010):
        for _ in range(10):
            policy.observe(Observation(8, "pipelined", 8, 8 if _ % 3 else 5, False, rtt_s, 0.001, 0.02, 0.0))
    policy.current = Decision(1, "ar")
    policy.request_positions, policy.request_matches = 40, 36
    assert policy.stream_ahead_s() is None
    policy.request_matches = 4                       # this request's own positions: alpha 0.1
    policy.acceptance = type(policy.acceptance)(0.9)
    policy.acceptance.add(1, 9)
    assert policy.stream_ahead_s() == pytest.approx(0.150, rel=0.05)
    policy.config = ControllerConfig("model", 8, "pipelined", 16, ("ar", "sync", "pipelined"))
    assert policy.stream_ahead_s() == pytest.approx(0.2)          # the default floor: above the slowest seen


def test_the_floor_keeps_a_stream_asked_for_a_slower_link_than_any_seen_yet():
    """The run's first step: a request on a 10 ms link, then one stepping to 150 ms mid-stream. No
    slower level has been seen, so without a floor the stream is asked 10 ms ahead and the server
    runs dry at the step; with the default floor (0.2 s) it does not."""
    walls = {floor_s: _second_request_wall_s(ModelPolicy(_look_ahead_config(floor_s)), 0.010)
             for floor_s in (0.2, 0.0)}
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
    policy = ModelPolicy(ControllerConfig("model", gamma=4, mode="sync", gamma_max=16, modes=("ar", "sync", "pipelined")))
    policy.decide_request(0.010)
    plans = []
    for _ in range(2):
        policy.observe(Observation(4, "sync", 4, 4, False, 0.010, 0.001, 0.020, 0.0, remaining_tokens=40))
        plans.append(policy.decide())
    assert plans[0] == Decision(4, "sync") and plans[1].mode == "pipelined", plans
    policy.observe(Observation(4, "sync", 4, 4, False, 0.010, 0.0004, 0.020, 0.0, remaining_tokens=30))
    assert policy.t_draft_s.count == 1       # a step far below restarted it: one round measured



class ByRttOnAStaleProbeWithThePace(ByRtt):
    """ByRtt in a request sent to the server on a 300 ms probe, at the 10 ms step learnt before."""

    def link_rtt_s(self):
        return 0.30

    def server_step_s(self):
        return 0.01


def _server_tokens_as_the_link_falls(monkeypatch, withdraw_on_the_server: bool) -> tuple[int, list[int]]:
    from dsd import handover

    if not withdraw_on_the_server:
        monkeypatch.setattr(handover.HandoverStream, "_asked_for_a_fallen_link", lambda self: 0)
    draft, target = _pair()
    run = simulate_dsd(draft, target, [5, 9, 4], 4, StopRule(60), LinkCosts(0.001, 0.002, 0.15, t_ar_s=0.01),
                       pipelined=False, controller=ByRttOnAStaleProbeWithThePace(), gamma_max=8, handover_tokens=4,
                       rtt_at=lambda t_s: 0.15 if t_s < 0.001 else 0.01)
    monkeypatch.undo()
    return sum(r.emitted for r in run.generation.rounds if r.mode == "ar"), run.generation.tokens


def test_a_stream_that_stays_on_the_server_across_a_fall_withdraws_what_the_old_link_needed(monkeypatch):
    """A request begins in cloud AR as the link falls 150 -> 10 ms (sim): its first round trip is
    half on each link (~80 ms), under the 300 ms it was asked ahead for but still slow enough for
    the plan to stay on the server. The segments asked beyond the new link's needs are withdrawn,
    and asked again as the stream goes on, so the next asks measure the link and the plan goes back
    to the edge after a few segments; kept, the stream served ~30 tokens before the next ask
    measured it (netns seed 3 of session 19: 16 tokens, 0.28 s)."""
    tokens_on_server, tokens = _server_tokens_as_the_link_falls(monkeypatch, True)
    kept_on_server, tokens_kept = _server_tokens_as_the_link_falls(monkeypatch, False)
    draft, target = _pair()
    assert tokens == tokens_kept == generate_ar(target, [5, 9, 4], StopRule(60), seq_id="f").tokens
    assert tokens_on_server <= kept_on_server - 10, (tokens_on_server, kept_on_server)
