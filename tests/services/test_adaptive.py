"""Adaptive DSD over the network: the edge service's controller changes gamma and the mode
between rounds of one request, the output stays the target's greedy tokens, and rounds.csv
records each round's plan."""

import pytest

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from tests.services.harness import post_runs, read_csv, synthetic_args, wait_for_runs
from tests.services.harness import PROMPTS, check_greedy, run_body, synthetic_reference
from tests.checks import every

ALPHA, SEED = 0.7, 3


@pytest.fixture(scope="module")
def synthetic(spawn, tmp_path_factory):
    verifier, edge = spawn(
        ("services.verifier", synthetic_args(ALPHA, SEED)),
        ("services.edge", synthetic_args(ALPHA, SEED) + ["--out-dir", str(tmp_path_factory.mktemp("edge"))]),
    )
    return verifier, edge, SyntheticLM(SyntheticConfig(alpha=ALPHA, seed=SEED), "target")


def _plans(edge, run_id):
    rows = [r for r in read_csv(edge, run_id, "rounds.csv") if r["stale"] in ("0", "False")]
    assert every(int(r["proposed"]) == int(r["round_gamma"]) for r in rows)
    return [(int(r["round_gamma"]), r["round_mode"]) for r in rows]


@pytest.mark.parametrize("mode", ["sync", "pipelined"])
def test_heuristic_changes_gamma_mid_request_and_keeps_the_greedy_output(synthetic, mode):
    verifier, edge, target = synthetic
    run_ids = post_runs(
        edge, [run_body(verifier, f"heur-{mode}", mode, PROMPTS[:2], 40, controller="heuristic", gamma_max=8)]
    )
    check_greedy(edge, run_ids, synthetic_reference(target, PROMPTS, 40))
    plans = _plans(edge, run_ids[0])
    assert len({g for g, _ in plans}) >= 3 and {m for _, m in plans} == {mode}


def test_model_switches_from_sync_to_pipelined_mid_request_and_keeps_the_greedy_output(synthetic):
    """Started at gamma 1 in sync on a 30 ms link, the closed form finds a pipelined plan far
    faster (pipelined is never slower when the round trip outlasts the drafting) and switches
    after the first verdict."""
    verifier, edge, target = synthetic
    run_ids = post_runs(
        edge,
        [
            run_body(
                verifier, "model", "sync", PROMPTS[:1], 40, gamma=1, controller="model", gamma_max=8, app_delay_ms=15.0
            )
        ],
    )
    check_greedy(edge, run_ids, synthetic_reference(target, PROMPTS, 40))
    plans = _plans(edge, run_ids[0])
    assert plans[0] == (1, "sync") and "pipelined" in {m for _, m in plans[1:]}
    assert max(g for g, _ in plans) > 1


def test_static_runs_record_their_fixed_plan_and_bad_controller_keys_are_refused(synthetic):
    verifier, edge, _ = synthetic
    run_ids = post_runs(edge, [run_body(verifier, "static", "sync", PROMPTS[:1], 20)])
    wait_for_runs(edge, run_ids)
    assert set(_plans(edge, run_ids[0])) == {(3, "sync")}
    for extra, field in (
        ({"controller": "bandito"}, "controller"),
        ({"controller": "heuristic", "gamma_max": 2}, "gamma"),
        ({"controller": "model", "mode": "ar"}, "controller"),
    ):
        status, body = edge.post_json("/runs", {**run_body(verifier, "bad", "sync", PROMPTS[:1], 20), **extra})
        assert status == 400 and field in body["error"], body


def test_model_hands_far_requests_to_cloud_ar_and_keeps_the_greedy_output(synthetic):
    """controller_modes with "ar": the edge asks the controller per request. On a 200 ms link the
    first request (nothing measured yet) starts in DSD; what its first rounds measure makes it hand
    the rest of the request to the server on the open session (a Generate with max_tokens; cloud
    AR: the AR step ~ one verification, far below a 200 ms round per few tokens), and puts the
    next request on the server. Every output is the target's greedy one, each token once;
    rounds.csv says which mode each round ran in."""
    verifier, edge, target = synthetic
    run_ids = post_runs(
        edge,
        [
            run_body(
                verifier,
                "model-ar",
                "sync",
                PROMPTS[:2],
                24,
                controller="model",
                gamma_max=8,
                controller_modes=["ar", "sync"],
                app_delay_ms=100.0,
            )
        ],
    )
    check_greedy(edge, run_ids, synthetic_reference(target, PROMPTS, 24))
    rows = read_csv(edge, run_ids[0], "rounds.csv")
    by_request = {i: [r["round_mode"] for r in rows if int(r["request_index"]) == i] for i in (0, 1)}
    assert by_request[0][0] == "sync" and by_request[0][-1] == "ar"  # handed over mid-request
    assert set(by_request[1]) == {"ar"}
    emitted = [int(r["emitted"]) for r in rows if int(r["request_index"]) == 0]
    assert sum(emitted) == 24
    status, body = edge.post_json(
        "/runs",
        {
            **run_body(verifier, "bad-modes", "sync", PROMPTS[:1], 20),
            "controller": "model",
            "controller_modes": ["sync", "beam"],
        },
    )
    assert status == 400 and "modes" in body["error"], body
