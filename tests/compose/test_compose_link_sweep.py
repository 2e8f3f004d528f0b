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
from tests.compose.test_compose_workflow import project_containers
from tests.link_sweep import check_tokens_exact_and_link_columns, run_loss_jitter_sweep

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]


def test_compose_sweep_over_loss_and_jitter_records_link_and_keeps_tokens_exact(docker_engine, tmp_path):
    assert project_containers() == [], "a dsdbed compose project is up already: `docker compose down` it first"
    requests, links, points = run_loss_jitter_sweep(tmp_path / "lj", "compose", jitter_ms=[4],
                                                    delay_distribution="normal", loss_pct=[0, 3])
    assert len(requests) == 2 * 2 * 2                        # loss x modes x requests
    assert len(points) == 2 * 2                              # loss x modes
    check_tokens_exact_and_link_columns(requests, points)
    assert links["shaper"].isin(BACKENDS).all(), links["shaper"].tolist()
    assert set(links["distribution_configured"]) == {"normal"}
    assert sorted(set(zip(links["jitter_configured_ms"], links["loss_configured_pct"]))) == [(4, 0), (4, 3)]
    # normal, 4 ms per direction: RTT stdev 4 * sqrt(2) = 5.7 ms (a loose band: few probes, and
    # the containers share 2 busy cores).
    assert links["rtt_measured_stdev_ms"].between(3.0, 9.0).all(), links["rtt_measured_stdev_ms"]
    assert (links["rtt_measured_p50_ms"] - links["rtt_expected_p50_ms"]).abs().max() < 3.0, links
    assert set(points["loss_link_expected_pct"].round(2)) == {0.0, 5.91}   # 1 - 0.97^2
    assert project_containers() == [] and find_leftovers() == []            # brought up, and down
