"""Faults injected into a real netns testbed mid-point: the point retries or records its error
as the policy says, the sweep completes, no row is lost or duplicated, and nothing is left.

Each test runs one small point (synthetic backend, 3 requests of 48 tokens, one edge, RTT 20 ms
shaped by netem) and fires its fault once the first attempt's trace has rounds in it.
"""

import os
import signal
import time

import pandas as pd
import pytest

from netem import nsutil
from orchestrator.spec.plan import plan_points
from tests.faults.faults import (
    FaultWhenMidRun,
    assert_nothing_left,
    check_sweep,
    injected,
    netns_testbed,
    small_experiment,
    survived,
    sweep_on,
    whole_trace_rows,
)

pytestmark = pytest.mark.root


def only_point(done: dict) -> dict:
    (record,) = done.values()
    return record


def kill_service(testbed, name: str) -> int:
    process = next(p for p in testbed._processes if p.name == name)
    os.killpg(process.proc.pid, signal.SIGKILL)
    return process.proc.pid


def test_verifier_killed_mid_point_is_restarted_and_the_point_retried(tmp_path):
    experiment = small_experiment()
    with netns_testbed(tmp_path, experiment) as testbed:
        with FaultWhenMidRun(tmp_path / "services", lambda: kill_service(testbed, "verifier")) as fault:
            sweep_on(testbed, experiment, tmp_path / "out")
        assert fault.fired_at_s and fault.error is None
        record = only_point(check_sweep(experiment, tmp_path / "out"))
        restarts = next(p for p in testbed._processes if p.name == "verifier").restarts
    assert record["status"] == "ok" and len(record["attempts"]) == 2, record
    assert record["attempts"][0]["status"] == "error"
    assert any("restarted verifier" in h for h in record["attempts"][1]["healed"]), record
    assert restarts == 1
    assert_nothing_left()
    survived()


def test_edge_killed_mid_run_is_restarted_its_trace_stays_whole_and_the_point_retried(tmp_path):
    experiment = small_experiment()
    with netns_testbed(tmp_path, experiment) as testbed:
        with FaultWhenMidRun(tmp_path / "services", lambda: kill_service(testbed, "edge0")) as fault:
            sweep_on(testbed, experiment, tmp_path / "out")
        assert fault.fired_at_s and fault.error is None
        record = only_point(check_sweep(experiment, tmp_path / "out"))
    assert record["status"] == "ok" and len(record["attempts"]) == 2, record
    assert any("restarted edge0" in h for h in record["attempts"][1]["healed"]), record
    # The killed edge's live trace on disk: whole rows, at most its last line cut (and dropped).
    traces = sorted((tmp_path / "services" / "edge0").glob("*/rounds.csv"))
    assert len(traces) == 2  # one run folder per attempt
    for path in traces:
        n_rows, dropped = whole_trace_rows(path)
        assert n_rows >= 1 and dropped <= 1, (path, n_rows, dropped)
    assert_nothing_left()
    survived()


@pytest.mark.parametrize("loss_pct", [1.0, 5.0])
def test_link_loss_keeps_the_greedy_tokens_and_records_the_measured_loss(tmp_path, loss_pct):
    experiment = small_experiment()
    injected()
    with netns_testbed(tmp_path, experiment, loss_pct=loss_pct) as testbed:
        sweep_on(testbed, experiment, tmp_path / "out")
        record = only_point(check_sweep(experiment, tmp_path / "out"))  # tokens checked there
    assert record["status"] == "ok", record
    links = pd.read_csv(tmp_path / "out" / "links.csv")
    assert (links["loss_configured_pct"] == loss_pct).all()
    assert links["loss_measured_pct"].notna().all()
    print(f"loss {loss_pct}% per direction: measured RTT-probe loss {links['loss_measured_pct'].tolist()} %")
    assert_nothing_left()
    survived()


def test_link_down_for_two_seconds_stalls_the_rounds_then_the_point_completes(tmp_path):
    experiment = small_experiment()
    with netns_testbed(tmp_path, experiment) as testbed:
        edge = testbed._topology.edges[0]

        def link_down_2s():
            nsutil.run(["ip", "link", "set", edge.bridge_port, "down"], netns=edge.bridge_netns)
            time.sleep(2.0)
            nsutil.run(["ip", "link", "set", edge.bridge_port, "up"], netns=edge.bridge_netns)

        with FaultWhenMidRun(tmp_path / "services", link_down_2s) as fault:
            sweep_on(testbed, experiment, tmp_path / "out")
        assert fault.fired_at_s and fault.error is None
        record = only_point(check_sweep(experiment, tmp_path / "out"))
    assert record["status"] == "ok", record
    if len(record["attempts"]) == 1:  # it rode the outage out: the stall is in its rounds
        rounds = pd.read_csv(tmp_path / "out" / "rounds.csv").sort_values("t_receive_s")
        gap_s = rounds["t_receive_s"].diff().max()
        assert gap_s >= 1.9, gap_s
        print(f"link down 2 s: longest gap between rounds {gap_s:.2f} s, one attempt")
    assert_nothing_left()
    survived()


def test_nfqueue_daemon_killed_mid_point_fails_the_attempt_at_once_and_the_retry_reshapes(tmp_path):
    experiment = small_experiment()
    with netns_testbed(tmp_path, experiment) as testbed:
        if testbed.shaper != "nfqueue":
            pytest.skip(f"links shaped by {testbed.shaper}: no daemon to kill")
        bridge_netns = testbed._topology.edges[0].bridge_netns

        def kill_daemon():
            rules = nsutil.run(["iptables", "-w", "-S"], netns=bridge_netns).stdout
            os.kill(testbed._shaper.daemons[0].pid, signal.SIGKILL)
            return rules

        started = time.monotonic()
        with FaultWhenMidRun(tmp_path / "services", kill_daemon) as fault:
            sweep_on(testbed, experiment, tmp_path / "out")
        assert fault.fired_at_s and fault.error is None
        record = only_point(check_sweep(experiment, tmp_path / "out"))
    # A dead daemon must never leave a link silently unshaped: no --queue-bypass on our rules.
    assert "NFQUEUE" in fault.result and "--queue-bypass" not in fault.result
    assert record["status"] == "ok" and len(record["attempts"]) == 2, record
    assert "NFQUEUE daemon" in record["attempts"][0]["error"], record
    assert any("removed dead shaping" in h for h in record["attempts"][1]["healed"]), record
    assert record["attempts"][0]["wall_s"] < 60, "detected by the check, not by the point's timeout"
    assert time.monotonic() - started < 200
    assert_nothing_left()
    survived()


def test_a_point_that_fails_every_attempt_is_an_error_row_and_the_sweep_goes_on(tmp_path):
    """Policy retries=1: the edge is killed in both attempts, so the point records its error
    (both attempts listed) and the next point still runs."""
    experiment = small_experiment(rtt_ms=[20, 10])
    with netns_testbed(tmp_path, experiment) as testbed:
        kills = []

        def kill_edge_twice():
            for _ in range(2):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    runs = sorted(
                        (tmp_path / "services" / "edge0").glob("*/rounds.csv"), key=lambda path: path.stat().st_mtime
                    )
                    if len(runs) > len(kills) and runs[-1].read_text().count("\n") > 3:
                        kills.append(kill_service(testbed, "edge0"))
                        break
                    time.sleep(0.02)

        with FaultWhenMidRun(tmp_path / "services", kill_edge_twice, min_rounds=3):
            sweep_on(testbed, experiment, tmp_path / "out")
        done = check_sweep(experiment, tmp_path / "out")
    assert len(kills) == 2
    injected()  # the second kill; the first is counted on firing
    # the plan's order, not the grid's: calibration points (here sync at the smallest RTT) run first
    first, second = (done[point.key] for point in plan_points(experiment))
    assert first["status"] == "error" and [a["status"] for a in first["attempts"]] == ["error", "error"], first
    assert any("restarted edge0" in h for h in first["healed_after"]), first
    assert second["status"] == "ok" and len(second["attempts"]) == 1, second
    assert_nothing_left()
    survived(2)
