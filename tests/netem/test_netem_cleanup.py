"""Nothing is left behind: after a normal exit, an error, Ctrl-C, or a crash plus cleanup_leftovers."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from pyroute2 import netns as pyroute2_netns

from netem import kernel, names, nsutil, rules
from netem.cleanup import cleanup_leftovers, find_leftovers, live_runs, our_processes
from netem.endpoints import ifindex, open_iproute
from netem.shaper import Shaper, ShaperConfig
from netem.spec import LinkSpec
from netem.topology import Topology, TopologyConfig

pytestmark = pytest.mark.root

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def leftovers() -> dict:
    """Everything of ours the system shows, in the places a person would look."""
    host_rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
    ip_netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {
        "netns": [line for line in ip_netns.splitlines() if line.startswith(names.PREFIX)],
        "iptables": [line for line in host_rules.splitlines() if names.CHAIN_PREFIX in line],
        "processes": our_processes(),
        "logs": glob.glob(f"/tmp/{names.PREFIX}-*.log"),
    }


NOTHING = {"netns": [], "iptables": [], "processes": [], "logs": []}


def test_context_managers_leave_nothing_after_normal_exit():
    with Topology(TopologyConfig(n_edges=2)) as topo, Shaper(ShaperConfig(verify_count=20)) as shaper:
        shaper.apply(topo.links(LinkSpec(rtt_ms=10)))
        assert leftovers()["netns"]
    assert leftovers() == NOTHING


def test_context_managers_leave_nothing_after_an_error():
    with pytest.raises(ZeroDivisionError):
        with Topology(TopologyConfig(n_edges=1)) as topo, Shaper(ShaperConfig(verify_count=0)) as shaper:
            shaper.apply(topo.links(LinkSpec(rtt_ms=10)))
            raise ZeroDivisionError("an error inside the shaped block")
    assert leftovers() == NOTHING


def test_ctrl_c_unwinds_and_leaves_nothing():
    # Ctrl-C as in a terminal: a run started in the background of a non-interactive shell (CI
    # under nohup ... &) inherits SIGINT ignored, and Python then raises no KeyboardInterrupt.
    script = textwrap.dedent("""
        import signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig
        with Topology(TopologyConfig(n_edges=1)) as topo, Shaper(ShaperConfig(verify_count=0)) as shaper:
            shaper.apply(topo.links(LinkSpec(rtt_ms=10)))
            print("shaped", shaper.backend, flush=True)
            time.sleep(30)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        word, backend = proc.stdout.readline().split()
        assert word == "shaped"
        if backend == "nfqueue":
            assert leftovers()["processes"], "the daemon should be running now"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0  # KeyboardInterrupt propagated after the cleanup
    assert leftovers() == NOTHING


def test_cleanup_leftovers_removes_a_crashed_runs_state_and_is_idempotent():
    topo = Topology(TopologyConfig(n_edges=2)).__enter__()
    shaper = Shaper(ShaperConfig(verify_count=0))
    shaper.apply(topo.links(LinkSpec(rtt_ms=10)))
    shaper._stop_watchdog.set()  # a crashed run would not watch either
    # The run "crashes" here: neither context manager gets to clean up.
    removed = cleanup_leftovers()
    for daemon in shaper.daemons:  # none with kernel-netem
        assert f"process {daemon.pid}" in removed
        daemon.child.proc.wait(timeout=5)  # reap it: it was our child
    assert sorted(r for r in removed if r.startswith("netns")) == sorted(f"netns {n}" for n in topo.plan.all_netns)
    assert leftovers() == NOTHING
    assert cleanup_leftovers() == []


def test_cleanup_finds_our_qdisc_in_a_namespace_only_a_process_holds():
    """Like a container: no name under /run/netns, reachable through /proc/PID/ns/net."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "30"])
    try:
        netns = f"/proc/{holder.pid}/ns/net"
        deadline = time.monotonic() + 5
        while nsutil.netns_inode(netns) == nsutil.netns_inode(None) and time.monotonic() < deadline:
            time.sleep(0.01)  # unshare has not unshared yet
        with open_iproute(netns) as ipr:
            ipr.link("add", ifname="dsdbq0", kind="veth", peer="dsdbq1")
            ipr.tc("replace", "htb", ifindex(ipr, "dsdbq0"), names.qdisc_handle(names.QDISC_MAJOR_RATE), default=1)
        assert [o for o in kernel.observe(netns, "dsdbq0") if o["kind"] == "htb"]
        removed = cleanup_leftovers()
        assert any(r.startswith("qdisc d5db: on dsdbq0") for r in removed), removed
        assert not [o for o in kernel.observe(netns, "dsdbq0") if o["kind"] == "htb"]
    finally:
        holder.kill()
        holder.wait()


def test_remove_chain_removes_jumps_and_chain_and_is_idempotent():
    name = names.netns_name(names.new_tag(), "fw")
    pyroute2_netns.create(name)
    try:
        netns = nsutil.netns_path(name)
        plan = rules.plan_rules(netns, "DSDBED-x", "FORWARD", [rules.QueueRule("dsdba", "dsdbb", 7)])
        rules.apply_rules(plan)
        rules.apply_rules(plan)  # no second jump, no duplicate rule
        assert rules.read_back(plan) == []
        assert rules.list_chains(netns, names.CHAIN_PREFIX) == ["DSDBED-x"]
        assert len(rules.remove_chain(netns, "DSDBED-x")) == 2  # the jump and the chain
        assert rules.remove_chain(netns, "DSDBED-x") == []
        assert names.CHAIN_PREFIX not in nsutil.run(["iptables", "-S"], netns=netns).stdout
    finally:
        pyroute2_netns.remove(name)


def test_a_live_runs_objects_are_not_leftovers_until_its_process_dies():
    """Another process's run is going on: nothing of it is found or removed, a sweep is refused
    naming it as live (not as leftovers to clean up); once that process is killed, it is all
    leftovers and cleanup removes it, its owner file too."""
    from netem import owners
    from orchestrator.launchers import leftovers as orchestrator_leftovers

    script = textwrap.dedent("""
        import time
        from netem import LinkSpec, Shaper, ShaperConfig, Topology, TopologyConfig
        with Topology(TopologyConfig(n_edges=1)) as topo, Shaper(ShaperConfig(verify_count=0)) as shaper:
            shaper.apply(topo.links(LinkSpec(rtt_ms=10)))
            print(topo.config.tag, shaper.config.tag, flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        topo_tag, shaper_tag = proc.stdout.readline().split()
        assert set(owners.live_tags()) >= {topo_tag, shaper_tag}
        theirs = [n for n in leftovers()["netns"] if topo_tag in n]
        assert theirs  # the run is there
        assert not [item for item in find_leftovers() if topo_tag in item or shaper_tag in item]
        assert any(topo_tag in line and str(proc.pid) in line for line in live_runs())
        assert not [item for item in cleanup_leftovers() if topo_tag in item or shaper_tag in item]
        assert [n for n in leftovers()["netns"] if topo_tag in n] == theirs  # untouched
        with pytest.raises(orchestrator_leftovers.AnotherRunLive, match="another network run is going on"):
            orchestrator_leftovers.refuse_if_any(services=False)
        proc.kill()  # a crash: no teardown
        proc.wait(timeout=10)
        assert [item for item in find_leftovers() if topo_tag in item]
        assert live_runs() == []
        removed = cleanup_leftovers()
        assert sorted(r for r in removed if r.startswith("netns") and topo_tag in r) == sorted(
            f"netns {n}" for n in theirs
        )
        assert any(r.endswith(f"{topo_tag}{owners.OWNER_SUFFIX}") for r in removed)
        assert leftovers() == NOTHING and owners.live_tags() == {}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cleanup_leftovers()


def test_a_run_that_ends_normally_leaves_no_owner_file():
    from netem import owners

    with Topology(TopologyConfig(n_edges=1)) as topo, Shaper(ShaperConfig(verify_count=0)) as shaper:
        shaper.apply(topo.links(LinkSpec(rtt_ms=10)))
        files = {p.name for p in owners.owners_dir().glob(f"*{owners.OWNER_SUFFIX}")}
        assert {f"{topo.config.tag}{owners.OWNER_SUFFIX}", f"{shaper.config.tag}{owners.OWNER_SUFFIX}"} <= files
        assert owners.live_tags() == {}  # our own run is ours to clean, not another's
    files = {p.name for p in owners.owners_dir().glob(f"*{owners.OWNER_SUFFIX}")}
    assert not {f"{topo.config.tag}{owners.OWNER_SUFFIX}", f"{shaper.config.tag}{owners.OWNER_SUFFIX}"} & files
