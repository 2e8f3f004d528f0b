"""The controller contract (dsd/controller/interface.py) and the fixed policies (dsd/controller/rule_based.py):
plans change between rounds of one request without changing the target's greedy output or its
sampling, bad plans and bad configs are refused naming the field, each policy takes only its own
settings, and static and heuristic decide as specified."""

import pytest

from dsd.controller.interface import ControllerConfig, Decision, Observation, check_decision, shadow_matches
from dsd.controller.policies import make_controller
from dsd.controller.bandit import BanditPolicy
from dsd.controller.rule_based import HeuristicPolicy
from dsd.drive.generation import generate_ar
from dsd.controller.policy_configs import BanditConfig, ModelPolicyConfig, StaticConfig
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from tests.dsd.control_helpers import Scripted, bigram_sequence_probs, synthetic_pair
from tests.checks import every
from dsd.drive.driver import DriverConfig


PLANS = [
    Decision(g, m)
    for g, m in [
        (1, "sync"),
        (5, "pipelined"),
        (2, "pipelined"),
        (7, "sync"),
        (3, "pipelined"),
        (1, "pipelined"),
        (6, "sync"),
        (4, "pipelined"),
    ]
    * 8
]


@pytest.mark.parametrize("rtt_s", [0.0, 0.004, 0.03])
@pytest.mark.parametrize("depth", [1, 3])
def test_gamma_and_mode_changes_mid_request_keep_the_target_greedy_output(rtt_s, depth):
    draft, target = synthetic_pair()
    stop = StopRule(80)
    for i in range(3):
        prompt = [i + 1, 7, 3]
        expected = generate_ar(target, prompt, stop, seq_id=f"ar{i}").tokens
        controller = Scripted(PLANS)
        run = simulate_dsd(
            draft,
            target,
            prompt,
            stop,
            LinkCosts(0.001, 0.002, rtt_s),
            DriverConfig(4, "sync", max_in_flight=depth, gamma_max=8),
            seq_id=f"c{i}",
            controller=controller,
        )
        assert run.generation.tokens == expected
        live = [r for r in run.generation.rounds if not r.stale]
        assert {r.mode for r in live} == {"sync", "pipelined"}  # the switch happened mid-request
        assert len({r.gamma for r in live}) >= 3
        assert every(r.proposed == r.gamma for r in live)  # each block drafted to its plan
        assert len(controller.seen) == len(run.generation.rounds)  # every verdict observed


def test_static_controller_changes_nothing_but_the_plan_columns():
    draft, target = synthetic_pair()
    stop = StopRule(60)
    for pipelined in (False, True):
        plain = simulate_dsd(
            draft,
            target,
            [4, 2],
            stop,
            LinkCosts(0.001, 0.002, 0.01),
            DriverConfig(4, "pipelined" if pipelined else "sync"),
            seq_id="a",
        )
        mode = "pipelined" if pipelined else "sync"
        static = make_controller(ControllerConfig("static", 4, mode))
        controlled = simulate_dsd(
            draft,
            target,
            [4, 2],
            stop,
            LinkCosts(0.001, 0.002, 0.01),
            DriverConfig(4, "pipelined" if pipelined else "sync"),
            seq_id="b",
            controller=static,
        )
        assert controlled.generation.tokens == plain.generation.tokens
        assert controlled.total_s == plain.total_s
        assert controlled.generation.rounds == plain.generation.rounds
        assert {(r.gamma, r.mode) for r in plain.generation.rounds if not r.stale} == {(4, mode)}


@pytest.mark.parametrize("bad", [Decision(9, "sync"), (3, "sync")])
def test_a_controller_returning_an_invalid_plan_is_refused_naming_the_field(bad):
    draft, target = synthetic_pair()
    with pytest.raises(ValueError, match="gamma|Decision"):
        simulate_dsd(
            draft,
            target,
            [1, 2],
            StopRule(30),
            LinkCosts(0.001, 0.002, 0.01),
            DriverConfig(4, "sync", gamma_max=8),
            controller=Scripted([Decision(4, "sync"), bad]),
        )
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
    policy.observe(_obs(1, 1, stale=True))  # stale blocks say nothing
    assert policy.decide().gamma == 1


def test_shadow_matches_measure_the_drafts_acceptance_on_the_stream():
    draft, target = synthetic_pair(alpha=0.6, seed=3)
    prompt = [5, 9, 2]
    generated = generate_ar(target, prompt, StopRule(4000), seq_id="s").tokens
    positions, matches = shadow_matches(draft, "shadow", prompt, generated)
    assert positions == 4000 and abs(matches / positions - 0.6) < 0.03
    assert shadow_matches(draft, "shadow", prompt, []) == (0, 0)


def test_controller_config_refuses_bad_bandit_and_model_settings():
    for bad in (dict(gammas=()), dict(gammas=(0, 2)), dict(horizon_s=0), dict(exploration=-1.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ControllerConfig("bandit", settings=BanditConfig(**bad))
    for bad in (dict(explore_after=0), dict(t_ar_s=-0.1), dict(margin_pct=100), dict(stream_ahead_floor_s=11)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ControllerConfig("model", settings=ModelPolicyConfig(**bad))
    with pytest.raises(ValueError, match="t_ar_s"):
        BanditConfig(model={"t_ar_s": -0.1})  # the model policy beside the bandit
    with pytest.raises(ValueError, match="modes"):
        ControllerConfig("bandit", modes=("sync", "beam"))


def test_a_setting_of_another_policy_is_refused_naming_the_key_and_its_policy():
    for policy, key, owner in (
        ("bandit", "margin_pct", "model"),
        ("model", "gammas", "bandit"),
        ("static", "prior_rounds", "bandit"),
        ("heuristic", "explore_after", "model"),
    ):
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
    assert BanditPolicy(bandit).model.settings.margin_pct == 2.0  # its model policy runs on its table


def test_plan_changes_mid_request_keep_speculative_sampling_exact():
    """Sampled DSD whose gamma and mode change every round (sim, one and two blocks in flight) vs
    the exact distribution of the bigram target's 4-token continuations (vocab 3: 81 outcomes),
    6k runs, chi-square at p > 1e-3 (fixed seeds)."""

    from scipy import stats

    from dsd.backends.protocol import SamplingParams
    from tests.toy_models import BigramLM, random_bigram

    vocab, n_runs, length = 3, 6_000, 4
    target_table = random_bigram(vocab, seed=1, sharpness=1.5)
    target, draft = BigramLM(target_table, "t"), BigramLM(random_bigram(vocab, seed=2, sharpness=1.5), "d")
    exact = bigram_sequence_probs(target_table, vocab, length)
    counts = dict.fromkeys(exact, 0)
    plans = [Decision(1, "pipelined"), Decision(2, "sync"), Decision(1, "sync"), Decision(3, "pipelined")] * 4
    for run in range(n_runs):
        out = simulate_dsd(
            draft,
            target,
            [0],
            StopRule(length),
            LinkCosts(0.001, 0.002, 0.005),
            DriverConfig(2, "sync", max_in_flight=1 + run % 2, gamma_max=3),
            sampling=SamplingParams(temperature=1.0, seed=run),
            seq_id=str(run),
            controller=Scripted(plans[run % 4 :]),
        )
        counts[tuple(out.generation.tokens)] += 1
    total = sum(exact.values())
    _, p_value = stats.chisquare([counts[s] for s in exact], [exact[s] * n_runs / total for s in exact])
    assert p_value > 1e-3
