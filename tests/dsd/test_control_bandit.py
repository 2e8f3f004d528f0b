"""The bandit policy (dsd/controller/bandit.py): discounted UCB over (mode, gamma) arms tries
arms, settles on the best rate, follows changes, chooses kinds of request, and uses its informed
prior as specified."""

import pytest

from dsd.controller.interface import ControllerConfig, Decision, Observation, RequestObservation
from dsd.controller.policies import make_controller
from dsd.controller.bandit import BanditPolicy
from dsd.drive.generation import generate_ar
from dsd.controller.policy_configs import BanditConfig
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from tests.dsd.control_helpers import synthetic_pair
from dsd.drive.driver import DriverConfig


def _bandit_round(policy, decision, accepted, rtt_s=0.01):
    policy.observe(Observation(decision.gamma, decision.mode, decision.gamma, accepted, False, rtt_s, 0.001, 0.02, 0.0))


def test_bandit_tries_every_arm_then_settles_on_the_best_rate():
    # the uninformed bandit (no prior from the closed form): every arm is tried
    config = ControllerConfig(
        "bandit",
        gamma=4,
        mode="sync",
        gamma_max=8,
        modes=("sync",),
        settings=BanditConfig(gammas=(1, 2, 4, 8), prior_rounds=0),
    )
    policy = BanditPolicy(config)
    seen = []
    for _ in range(300):  # every draft accepted: the largest gamma earns most per second
        d = policy.decide()
        seen.append(d)
        _bandit_round(policy, d, d.gamma)
    assert {d.gamma for d in seen[:8]} == {1, 2, 4, 8}  # (the first verdict moves the alpha context)
    assert sum(d.gamma == 8 for d in seen[-100:]) >= 90


def test_bandit_follows_a_change_of_acceptance():
    config = ControllerConfig(
        "bandit", gamma=4, mode="sync", gamma_max=8, modes=("sync",), settings=BanditConfig(gammas=(1, 8))
    )
    policy = BanditPolicy(config)
    for _ in range(200):
        d = policy.decide()
        _bandit_round(policy, d, d.gamma)  # everything accepted: gamma 8
    assert policy.decide().gamma == 8
    for _ in range(400):
        d = policy.decide()
        _bandit_round(policy, d, 0)  # nothing accepted: gamma 1 is cheaper
    assert sum(policy.decide().gamma == 1 for _ in range(1)) == 1
    picks = []
    for _ in range(50):
        d = policy.decide()
        picks.append(d.gamma)
        _bandit_round(policy, d, 0)
    assert picks.count(1) >= 45


def test_bandit_request_choice_prefers_the_server_where_it_earned_more():
    # no hand-over: a server request is a plain stream, seen whole by observe_request
    config = ControllerConfig(
        "bandit",
        gamma=4,
        mode="sync",
        gamma_max=4,
        modes=("ar", "sync"),
        handover=False,
        settings=BanditConfig(gammas=(4,)),
    )
    policy = BanditPolicy(config)
    kinds = []
    for _ in range(40):
        d = policy.decide_request(0.150)
        kinds.append(d.mode)
        if d.mode == "ar":  # 50 tokens/s on the server
            policy.observe_request(RequestObservation("ar", 1, 50, 1.0, 0.15, 0.150))
        else:  # DSD far away: 4 drafts accepted over 0.2 s per round
            for _ in range(10):
                _bandit_round(policy, policy.decide(), 1, rtt_s=0.150)
    assert set(kinds[:2]) == {"ar", "sync"}
    assert kinds[-10:].count("ar") >= 9


def test_bandit_is_a_controller_the_driver_accepts():
    draft, target = synthetic_pair()
    stop = StopRule(60)
    policy = make_controller(ControllerConfig("bandit", 4, "sync", 8))
    run = simulate_dsd(
        draft,
        target,
        [3, 1, 4],
        stop,
        LinkCosts(0.001, 0.002, 0.01),
        DriverConfig(4, "sync", gamma_max=8),
        controller=policy,
    )
    assert run.generation.tokens == generate_ar(target, [3, 1, 4], stop, seq_id="x").tokens
    assert len({(r.gamma, r.mode) for r in run.generation.rounds}) > 1


def test_bandit_explores_an_untried_server_kind_by_a_hand_over_and_credits_its_pace():
    """Every request is a DSD session: the first round runs the request's start plan, a kind never
    tried (cloud AR) is explored by a hand-over within the request, and its rate leaves out the
    hand-over's round trip (1 token in 0.17 s of which 0.15 s was the link: 50 tokens/s)."""
    config = ControllerConfig(
        "bandit",
        gamma=4,
        mode="sync",
        gamma_max=4,
        modes=("ar", "sync"),
        settings=BanditConfig(gammas=(4,), prior_rounds=0),
    )
    policy = BanditPolicy(config)
    start = policy.decide_request(0.010)
    assert start == Decision(4, "sync") and policy.decide() == start  # DSD first: no hand-over to try it
    _bandit_round(policy, start, 3)
    assert policy.decide() == Decision(1, "ar")  # untried: one segment on the server
    policy.observe(
        Observation(1, "ar", 0, 0, False, 0.150, None, 0.020, 0.0, tokens=1, interval_s=0.170, remaining_tokens=40)
    )
    tokens, seconds, _ = policy._known()[Decision(1, "ar")]
    assert tokens / seconds == pytest.approx(50.0)
    assert policy.decide() == Decision(4, "sync")  # DSD earned more: back to the edge


def test_bandit_contexts_do_not_flip_on_jitter_at_a_bucket_edge():
    """A 10 ms link measured at 10-13 ms (jitter, load) stays in one RTT context; a step to 150 ms
    moves it at once; the alpha context moves only a quarter bucket past an edge."""
    assert {BanditPolicy.rtt_bucket_of(ms / 1e3, 3) for ms in (9.0, 10.6, 11.7, 13.2)} == {3}
    assert BanditPolicy.rtt_bucket_of(0.150, 3) == 7 and BanditPolicy.rtt_bucket_of(0.010, 7) == 3
    policy = BanditPolicy(ControllerConfig("bandit", gamma=4, mode="sync", gamma_max=8, modes=("sync",)))
    for accepted in (3, 3, 3, 2, 3, 3):  # alpha ~0.62-0.66: bucket 3 (0.6-0.8)
        _bandit_round(policy, Decision(4, "sync"), accepted)
    assert policy.context[1] == 3
    _bandit_round(policy, Decision(4, "sync"), 2)  # ~0.58: just under the edge, still 3
    assert policy.context[1] == 3


def _far_policy():
    config = ControllerConfig(
        "bandit", gamma=4, mode="sync", gamma_max=8, modes=("ar", "sync"), settings=BanditConfig(gammas=(2, 8))
    )
    policy = BanditPolicy(config)
    policy.rtt_bucket, policy.alpha_bucket = 7, 4  # 150 ms, alpha 0.8-1
    policy._credit((7, 4), Decision(1, "ar"), 50.0, 1.0, 20.0)  # cloud AR: 50 tokens/s
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
    assert values["dsd"][0] == pytest.approx(40.0)  # a rate: the discount cancels
    assert policy._ucb_kind(values, "ar") == "ar"


def test_bandit_prior_skips_arms_the_closed_form_puts_far_behind():
    """With the informed prior (the closed form on the measured estimates, as pseudo-rounds), a
    bandit at 10 ms whose drafts are all accepted does not spend rounds on gamma 1 or on cloud AR
    (predicted two to six times slower) nor hand over to try the server; without it every arm and
    kind is tried once."""

    def first_picks(prior_rounds):
        config = ControllerConfig(
            "bandit",
            gamma=4,
            mode="sync",
            gamma_max=8,
            modes=("ar", "sync"),
            settings=BanditConfig(gammas=(1, 2, 4, 8), prior_rounds=prior_rounds),
        )
        policy = BanditPolicy(config)
        policy.decide_request(0.010)
        seen = []
        for _ in range(30):
            d = policy.decide()
            seen.append(d)
            if d.mode == "ar":
                policy.observe(
                    Observation(
                        1, "ar", 0, 0, False, 0.010, None, 0.020, 0.0, tokens=1, interval_s=0.030, remaining_tokens=40
                    )
                )
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
    config = ControllerConfig(
        "bandit", gamma=8, mode="pipelined", gamma_max=8, modes=("pipelined",), settings=BanditConfig(gammas=(2, 8))
    )
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
