"""The compose testbed end to end: four edge containers and a verifier container come up healthy,
each edge's link is shaped to its own RTT (5, 10, 20, 40 ms) and measures it, every mode run
through the edges' control API emits exactly the target's greedy tokens over those links, and
close() leaves nothing behind on the host.

Brings the image up to date first (scripts/build_images.sh): several minutes from scratch, a few
seconds when an image built earlier on this machine only needs the current code.
"""

from __future__ import annotations

import ipaddress
import json
import statistics
from pathlib import Path

import pytest

from dsd.backends.factory import SyntheticBackendConfig, load_pair
from dsd.drive.generation import generate_ar
from dsd.costs.profiles import HardwareProfile
from dsd.speculation.stopping import StopRule
from netem.probe import BACKENDS
from orchestrator.common import cpus
from orchestrator.common.http_client import call
from orchestrator.launchers.compose import ComposeConfig, ComposeTestbed
from tests.compose.edge_runs import check_greedy, read_csv, run_waves, wait_for
from tests.compose.host import host_state, new_since
from tests.checks import every

pytestmark = [pytest.mark.docker, pytest.mark.root, pytest.mark.slow]

RTTS_MS = (5.0, 10.0, 20.0, 40.0)
BACKEND = SyntheticBackendConfig(alpha=0.7, seed=3)
# Small emulated compute times: the link, not the emulated device, sets the pace.
PROFILE = HardwareProfile(
    name="compose-test",
    t_draft_edge_s=0.0005,
    t_draft_server_s=0.0003,
    t_ar_s=0.001,
    t_verify_base_s=0.0008,
    t_verify_per_position_s=0.0001,
    t_prefill_per_token_s=0.00001,
    batch_slope=0.1,
)
PROMPTS = [[(11 * i + 5 * j) % 500 + 1 for j in range(2 + i % 4)] for i in range(3)]
MAX_NEW_TOKENS = 24
GAMMA = 3
RUNS_TIMEOUT_S = 300.0
LINK_P50_TOLERANCE_MS = 2.0


@pytest.fixture(scope="module")
def testbed(docker_engine, tmp_path_factory):
    before = host_state()
    config = ComposeConfig(
        n_edges=len(RTTS_MS),
        backend=BACKEND,
        profile=PROFILE,
        max_batch=4,
        verify_count=50,
        log_dir=str(tmp_path_factory.mktemp("compose-logs")),
    )
    testbed = ComposeTestbed(config)
    try:
        yield testbed, before
    finally:
        testbed.close()


@pytest.fixture(scope="module")
def links(testbed):
    return testbed[0].shape(list(RTTS_MS))


@pytest.fixture(scope="module")
def runs(testbed, links):
    results = run_waves(
        testbed[0],
        PROMPTS,
        MAX_NEW_TOKENS,
        GAMMA,
        RUNS_TIMEOUT_S,
        max_in_flight=2,
        probe_count=5,
        probe_interval_ms=100,
    )
    testbed[0].check()  # the shaping held the whole time
    return results


def test_four_edges_come_up_healthy_in_order_on_the_testbed_network(testbed):
    tb = testbed[0]
    subnet = ipaddress.IPv4Network(tb.config.subnet)
    assert [e.name for e in tb.edges] == [f"dsdbed-edge-{n}" for n in range(1, 5)]
    assert [e.client_id for e in tb.edges] == [0, 1, 2, 3]
    assert tb.verifier_url == "ws://verifier:8700/ws"
    for edge, container in zip(tb.edges, tb.edge_containers):
        assert container.labels["dsdbed.role"] == "edge"
        assert container.status == "running"
        check = container.attrs["Config"]["Healthcheck"]["Test"]  # compose.yaml's healthcheck
        assert check[0] == "CMD" and container.exec_run(check[1:]).exit_code == 0
        host = edge.control_url.removeprefix("http://").rsplit(":", 1)[0]
        assert ipaddress.IPv4Address(host) in subnet
        assert json.loads(call("GET", edge.control_url + "/health"))["role"] == "edge"
    verifier = tb.verifier_container
    assert verifier.labels["dsdbed.role"] == "verifier"
    assert not any(verifier.attrs["NetworkSettings"]["Ports"].values()), "the verifier publishes no port"
    assert tb.shaper in BACKENDS


def test_each_link_measures_its_configured_rtt(testbed, links):
    tb = testbed[0]
    assert [s.edge for s in links] == [e.name for e in tb.edges]
    for state, rtt_ms in zip(links, RTTS_MS):
        assert state.shaper == tb.shaper
        assert state.rtt_configured_ms == rtt_ms
        assert abs(state.rtt_measured_p50_ms - rtt_ms) < LINK_P50_TOLERANCE_MS, state
        assert state.loss_measured_pct == 0.0, state


def test_every_mode_on_every_edge_emits_the_target_greedy_tokens(runs):
    _, target = load_pair(BACKEND)
    stop = StopRule(MAX_NEW_TOKENS, target.eos_token_id)
    check_greedy(
        runs, [generate_ar(target, prompt, stop, seq_id=f"ref-{i}").tokens for i, prompt in enumerate(PROMPTS)]
    )


def test_traffic_between_the_containers_takes_the_configured_rtt(testbed, runs):
    for i, rtt_ms in enumerate(RTTS_MS):
        mine = [v for (edge, _), v in runs.items() if edge == i]
        # Application-level pings on the runs' own WebSockets, pooled over the edge's four runs:
        # never faster than the link, and near it in the lower quartile. The median carries the
        # host's CPU contention (4 runs, 5 containers, the shaper, on 2 cores), so only a gross
        # bound applies there.
        probes = [
            p
            for summary, rounds, _ in mine
            for p in summary["rtt_before_ms"] + [float(r["rtt_probe_ms"]) for r in rounds if r["rtt_probe_ms"]]
        ]
        p25_ms = statistics.quantiles(probes, n=4)[0]
        assert min(probes) >= rtt_ms - 0.5, (i, sorted(probes)[:5])
        assert p25_ms <= rtt_ms + max(3.0, 0.1 * rtt_ms), (i, p25_ms, sorted(probes))
        assert statistics.median(probes) <= rtt_ms + max(10.0, 0.5 * rtt_ms), (i, sorted(probes))
        for summary, rounds, _ in mine:
            if summary["mode"] in ("sync", "pipelined"):
                # A draft block cannot come back faster than the link's round trip.
                trips_ms = [(float(r["t_receive_s"]) - float(r["t_send_s"])) * 1000 for r in rounds]
                assert min(trips_ms) >= rtt_ms - 0.5, (i, summary["mode"], min(trips_ms))
    # And the links themselves still hold their RTT after all that traffic.
    for state, rtt_ms in zip(testbed[0].measure(), RTTS_MS):
        assert abs(state.rtt_measured_p50_ms - rtt_ms) < LINK_P50_TOLERANCE_MS, state


def test_a_cpu_plan_becomes_the_containers_cpusets_and_unpinning_gives_every_cpu_back(testbed, runs):
    tb = testbed[0]
    usable = cpus.usable_cpus()
    plan = cpus.plan_cpus(usable, len(tb.edges), "on")  # on 2 CPUs too: the verifier alone on the last
    applied = cpus.pin_testbed(tb, plan)
    assert applied[tb.verifier_container.name] == plan["sets"]["verifier"]
    for handle, container in zip(tb.edges, tb.edge_containers):
        assert applied[container.name] == plan["sets"][f"edge{handle.client_id}"]
        assert container.attrs["HostConfig"]["CpusetCpus"] == ",".join(
            map(str, plan["sets"][f"edge{handle.client_id}"])
        )
    # A pinned testbed still runs: one sync run on the first edge, the target's greedy tokens.
    edge = tb.edges[0]
    call(
        "POST",
        f"{edge.control_url}/runs",
        token=edge.token,
        body={
            "run_id": "pinned-sync",
            "client_id": "pinned-sync",
            "mode": "sync",
            "gamma": GAMMA,
            "prompts": PROMPTS[:1],
            "max_new_tokens": MAX_NEW_TOKENS,
            "verifier_url": tb.verifier_url,
            "app_delay_ms": tb.app_delay_ms(0),
        },
    )
    summary = wait_for({(0, "sync"): (edge, "pinned-sync")}, RUNS_TIMEOUT_S)[0, "sync"]
    _, target = load_pair(BACKEND)
    expected = generate_ar(target, PROMPTS[0], StopRule(MAX_NEW_TOKENS, target.eos_token_id), seq_id="pinned").tokens
    check_greedy(
        {
            (0, "sync"): (
                summary,
                read_csv(edge, "pinned-sync", "rounds.csv"),
                read_csv(edge, "pinned-sync", "requests.csv"),
            )
        },
        [expected],
    )
    unpinned = cpus.pin_testbed(tb, cpus.plan_cpus(usable, len(tb.edges), "off"))
    assert every(mask == usable for mask in unpinned.values()), unpinned


def test_close_saves_the_logs_and_leaves_nothing_behind(testbed):
    tb, before = testbed
    tb.close()
    assert new_since(before) == {}
    tb.close()  # idempotent
    logs = (Path(tb.config.log_dir) / "compose-dsdbed.log").read_text()
    assert "services.verifier verifier on" in logs and logs.count("services.edge edge on") == len(RTTS_MS)
