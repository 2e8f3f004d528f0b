"""The feature-draft pair (models/smollm2-eagle: SmolLM2-135M-Instruct and a one-layer draft on its
features) over the network: the verdicts carry the target's features (rounds.csv counts their
bytes), greedy DSD emits the target's own greedy tokens, and sampled DSD follows the target's
truncated distribution (chi-square), as for the layer draft (test_real_pair.py)."""

import json

import pytest

from dsd.drive.generation import generate_ar
from dsd.features import encoded_bytes
from dsd.speculation.stopping import StopRule
from pairs import smollm2
from tests.services.real_pair_checks import check_first_token_follows_the_target, run, start_pair

pytestmark = [pytest.mark.model, pytest.mark.slow]

PAIR = smollm2.REPO / "models" / "smollm2-eagle"


@pytest.fixture(scope="module")
def eagle_pair(spawn, tmp_path_factory):
    return start_pair(spawn, tmp_path_factory, PAIR)


def test_greedy_dsd_with_the_feature_draft_emits_the_targets_own_greedy_tokens(eagle_pair):
    verifier, edge, target, prompts = eagle_pair
    width = json.loads((PAIR / "manifest.json").read_text())["features"]["width"]
    stop = StopRule(max_new_tokens=24, eos_token_id=target.eos_token_id)
    expected = [generate_ar(target, p, stop, seq_id=f"ref-{i}").tokens for i, p in enumerate(prompts)]
    for mode, dtype in (("sync", "bfloat16"), ("pipelined", "bfloat16"), ("sync", "int8")):
        rows, rounds = run(edge, verifier, f"greedy-{mode}-{dtype}", mode, prompts, 24, feature_dtype=dtype)
        got = [[int(t) for t in row["token_ids"].split()] for row in rows]
        assert got == expected, (mode, dtype)
        assert any(int(r["accepted"]) > 0 for r in rounds), "the draft must be right sometimes"
        # every verdict carries one feature row per emitted token (a round clipped by the token
        # budget emits fewer than it decided, so only whole rounds are checked)
        whole = [r for r in rounds if r["stale"] == "0" and int(r["emitted"]) == int(r["accepted"]) + 1]
        assert whole and all(
            int(r["feature_bytes"]) == encoded_bytes(int(r["emitted"]), width, dtype) for r in whole
        ), (mode, dtype)


def test_sampled_dsd_with_the_feature_draft_follows_the_targets_truncated_distribution(eagle_pair):
    verifier, edge, _, _ = eagle_pair
    check_first_token_follows_the_target(verifier, edge, PAIR)
