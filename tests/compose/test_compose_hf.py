"""The compose testbed with real models: two edge containers draft with the default pair's draft,
the verifier container verifies with its target, over links shaped to 10 and 20 ms, and every
mode emits exactly what the target's greedy decoding in this process emits."""

from __future__ import annotations

import pytest

from dsd.backends.factory import DEFAULT_PAIR, HfBackendConfig, load_pair
from dsd.drive.generation import generate_ar
from dsd.speculation.stopping import StopRule
from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed
from tests.compose.edge_runs import check_greedy, run_waves
from tests.compose.host import host_state, new_since
from tests.checks import every

pytestmark = [
    pytest.mark.docker,
    pytest.mark.root,
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (DEFAULT_PAIR / "manifest.json").is_file(), reason=f"no model pair at {DEFAULT_PAIR} (dsdbed build-pair)"
    ),
]

RTTS_MS = (10.0, 20.0)
BACKEND = HfBackendConfig()
PROMPTS = [[17, 250, 99, 1024, 7], [3000, 12, 44]]
MAX_NEW_TOKENS = 16
GAMMA = 4


def test_every_mode_emits_the_target_greedy_tokens_with_the_default_pair(docker_engine):
    before = host_state()
    with ComposeTestbed(ComposeConfig(n_edges=len(RTTS_MS), backend=BACKEND, verify_count=20)) as testbed:
        links = testbed.shape(list(RTTS_MS))
        assert every(abs(s.rtt_measured_p50_ms - s.rtt_configured_ms) < 2.0 for s in links), links
        runs = run_waves(testbed, PROMPTS, MAX_NEW_TOKENS, GAMMA, timeout_s=600.0, probe_count=2)
        testbed.check()
    _, target = load_pair(BACKEND)
    stop = StopRule(MAX_NEW_TOKENS, target.eos_token_id)
    check_greedy(runs, [generate_ar(target, p, stop, seq_id=f"ref-{i}").tokens for i, p in enumerate(PROMPTS)])
    assert new_since(before) == {}
