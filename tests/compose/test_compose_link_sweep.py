"""A sweep over the link's loss and jitter on the compose testbed, end to end through
`run_experiment` (the sweep brings the project up and down itself): each point's containers are
shaped as configured and measured, and every point still emits exactly the target's greedy tokens.
Kept to two points and few tokens (CI time); tests/orchestrator/test_link_sweep_netns.py runs the
wider grid on network namespaces.
"""

from __future__ import annotations

import pytest

from netem.cleanup import find_leftovers
from netem.probe import BACKENDS
from orchestrator.launchers.compose import ComposeConfig
from tests.compose.host import project_containers
from tests.link_sweep import check_tokens_exact_and_link_columns, run_loss_jitter_sweep

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]

HOST_EXCESS_MS = 2.0  # what a busy 2-core host may add to a shaped link's median RTT


def test_compose_sweep_over_loss_and_jitter_records_link_and_keeps_tokens_exact(docker_engine, tmp_path):
    assert project_containers() == [], "a dsdbed compose project is up already: `docker compose down` it first"
    requests, links, points = run_loss_jitter_sweep(
        tmp_path / "lj", "compose", jitter_ms=[4], delay_distribution="normal", loss_pct=[0, 3]
    )
    assert len(requests) == 2 * 2 * 2  # loss x modes x requests
    assert len(points) == 2 * 2  # loss x modes
    check_tokens_exact_and_link_columns(requests, points)
    assert links["shaper"].isin(BACKENDS).all(), links["shaper"].tolist()
    assert set(links["distribution_configured"]) == {"normal"}
    assert sorted(set(zip(links["jitter_configured_ms"], links["loss_configured_pct"]))) == [(4, 0), (4, 3)]
    # normal, 4 ms per direction: RTT stdev 4 * sqrt(2) = 5.7 ms (a loose band: few probes, and
    # the containers share 2 busy cores).
    assert links["rtt_measured_stdev_ms"].between(3.0, 9.0).all(), links["rtt_measured_stdev_ms"]
    # The median of n probes is off by 1.25 * stdev / sqrt(n) (0.7 ms here) by chance alone; the host
    # only ever adds delay: +0.2-0.3 ms unjittered, and up to +2 ms for a point measured while its
    # containers were busy (mean excess +1.0-1.2 ms quiet; one CI run had p50s of +1.1 to +3.3 ms).
    n_probes = ComposeConfig.verify_count * (1 - links["loss_measured_pct"] / 100)
    chance_ms = 3 * 1.2533 * links["rtt_expected_stdev_ms"] / n_probes**0.5
    excess_ms = links["rtt_measured_p50_ms"] - links["rtt_expected_p50_ms"]
    assert (excess_ms > -chance_ms).all() and (excess_ms < chance_ms + HOST_EXCESS_MS).all(), links[
        ["rtt_measured_p50_ms", "rtt_expected_p50_ms", "rtt_measured_stdev_ms", "loss_measured_pct"]
    ]
    assert set(points["loss_link_expected_pct"].round(2)) == {0.0, 5.91}  # 1 - 0.97^2
    assert project_containers() == [] and find_leftovers() == []  # brought up, and down
