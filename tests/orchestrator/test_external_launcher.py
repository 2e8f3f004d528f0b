"""The external launcher against services started by hand in network namespaces (root).

A verifier and two edges run in namespaces on a bridge, started here the way a user would start
them on their devices (`python -m services.verifier/edge --host ADDR --token-file F`, the edges
with --shape-link); the sweep runs as the CLI in a namespace of its own on the same bridge and is
told only the services' URLs and the token file. The test process itself polls the services
over Unix sockets (it has no route into the namespaces) and never talks to any other address.
"""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.spec.external import ExternalConfig
from orchestrator.launchers.processes import REPO, ServiceProcess, write_token_file
from tests.checks import every

pytestmark = pytest.mark.root
PROFILE = ["--backend-json", '{"kind": "synthetic", "alpha": 0.7}', "--profile", "toy-edge-cloud"]


def verifier_process(ip: str, netns: str, token_file: Path, work: Path) -> ServiceProcess:
    return ServiceProcess(
        "verifier",
        [
            "services.verifier",
            "--host",
            ip,
            "--port",
            "8700",
            *PROFILE,
            "--token-file",
            str(token_file),
            "--unix-socket",
            str(work / "v.sock"),
        ],
        f"unix:{work / 'v.sock'}/health",
        netns=netns,
        log_dir=work,
    )


def edge_process(i: int, ip: str, netns: str, token_file: Path, work: Path) -> ServiceProcess:
    """Edge i, which may shape its own link."""
    return ServiceProcess(
        f"edge{i}",
        [
            "services.edge",
            "--host",
            ip,
            "--port",
            "8701",
            *PROFILE,
            "--shape-link",
            "--out-dir",
            str(work / f"edge{i}"),
            "--token-file",
            str(token_file),
            "--unix-socket",
            str(work / f"e{i}.sock"),
        ],
        f"unix:{work / f'e{i}.sock'}/health",
        netns=netns,
        log_dir=work,
    )


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    """(verifier ws URL, edge control URLs, token file, orchestrator namespace, edge namespaces);
    torn down after."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    from netem import Topology, TopologyConfig

    work = tmp_path_factory.mktemp("devices")
    token_file = write_token_file(work)
    processes = []
    with Topology(TopologyConfig(n_edges=3)) as topo:
        try:
            v = topo.verifier
            processes.append(verifier_process(v.ip, v.netns, token_file, work))
            edge_urls = []
            for i, e in enumerate(topo.edges[:2]):
                processes.append(edge_process(i, e.ip, e.netns, token_file, work))
                edge_urls.append(f"http://{e.ip}:8701")
            for process in processes:
                process.wait_ready(60)
            yield f"ws://{v.ip}:8700/ws", edge_urls, token_file, topo.edges[2].netns, [e.netns for e in topo.edges[:2]]
        finally:
            for process in processes:
                process.stop()


def run_cli_sweep(tmp_path: Path, orchestrator_netns: str, experiment: str) -> subprocess.CompletedProcess:
    """`dsdbed sweep` as a user runs it, from the orchestrator's namespace."""
    (tmp_path / "exp.toml").write_text(experiment)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [
            "nsenter",
            f"--net={orchestrator_netns}",
            "--",
            sys.executable,
            "-m",
            "orchestrator.cli",
            "sweep",
            str(tmp_path / "exp.toml"),
            "--out",
            str(tmp_path / "out"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )


def experiment_toml(verifier_url, edge_urls, token_file, shaping: str, rtt_ms: list[float]) -> str:
    urls = ", ".join(f'"{u}"' for u in edge_urls)
    return f"""
name = "external-{shaping}"
launcher = "external"
modes = ["ar", "sync"]
rtt_ms = {rtt_ms}
gamma = [3]
clients = [2]
edges = 2
requests = 2
warmup_requests = 1
max_new_tokens = 24
prompt_tokens = 8
profile = "toy-edge-cloud"
[backend]
kind = "synthetic"
alpha = 0.7
[external]
verifier_url = "{verifier_url}"
edge_urls = [{urls}]
token_file = "{token_file}"
shaping = "{shaping}"
"""


def test_external_sweep_on_the_real_link_records_its_measured_rtt(devices, tmp_path):
    verifier_url, edge_urls, token_file, orchestrator_netns, _ = devices
    done = run_cli_sweep(tmp_path, orchestrator_netns, experiment_toml(verifier_url, edge_urls, token_file, "off", [0]))
    assert done.returncode == 0, done.stderr[-3000:]
    links = pd.read_csv(tmp_path / "out" / "links.csv")
    assert set(links["shaper"]) == {"none"}
    assert sorted(set(links["edge"])) == [f"edge{i}@{u.split('//')[1]}" for i, u in enumerate(edge_urls)]
    # Namespaces on one bridge: a link of about a millisecond as the edges' WebSocket probes see
    # it (application to application), measured, not assumed.
    assert links["rtt_measured_p50_ms"].between(0.01, 10).all(), links
    requests = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert len(requests) == 2 * 2 * 2 and set(requests["shaper"]) == {"none"}
    assert requests["rtt_probe_ms"].lt(50).all()


def test_external_sweep_shapes_each_edge_from_inside_its_namespace(devices, tmp_path):
    verifier_url, edge_urls, token_file, orchestrator_netns, _ = devices
    done = run_cli_sweep(
        tmp_path, orchestrator_netns, experiment_toml(verifier_url, edge_urls, token_file, "edge", [0, 20])
    )
    assert done.returncode == 0, done.stderr[-3000:]
    links = pd.read_csv(tmp_path / "out" / "links.csv")
    assert len(set(links["shaper"])) == 1 and links["shaper"].iloc[0] in ("in-edge-nfqueue", "in-edge-kernel-netem")
    shaped = links[links["rtt_ms"] == 20]
    assert len(shaped) == 2 * 2  # 2 modes x 2 edges
    # configured = the real link's RTT measured just before + the 20 ms added; ICMP measured it.
    assert shaped["rtt_configured_ms"].between(20, 21).all(), shaped
    assert (shaped["rtt_measured_p50_ms"] - shaped["rtt_configured_ms"]).abs().lt(2).all(), shaped
    unshaped = links[links["rtt_ms"] == 0]
    assert unshaped["rtt_measured_p50_ms"].lt(2).all(), unshaped
    requests = pd.read_csv(tmp_path / "out" / "requests.csv")
    # The edges' own WebSocket probes see the link the runs crossed.
    assert requests.loc[requests["rtt_ms"] == 20, "rtt_probe_ms"].between(19.5, 40).all(), requests
    # Unshaped: 2-7 ms (the edge's WebSocket ping through two event loops); a host stall once put
    # one request's at 18.7 ms, so the median is bounded, and each below the shaped ones' top.
    unshaped_probe_ms = requests.loc[requests["rtt_ms"] == 0, "rtt_probe_ms"]
    assert unshaped_probe_ms.median() < 15 and unshaped_probe_ms.lt(40).all(), requests


def test_external_config_names_the_bad_key(tmp_path):
    token = write_token_file(tmp_path)
    good = {"verifier_url": "http://127.0.0.1:1", "edge_urls": ["http://127.0.0.1:2"], "token_file": str(token)}
    assert ExternalConfig.from_dict(good).verifier_health_url == "http://127.0.0.1:1"
    assert ExternalConfig.from_dict({**good, "verifier_url": "ws://h:5/ws"}).verifier_health_url == "http://h:5"
    for bad, key in (
        ({"edge_urls": []}, "edge_urls"),
        ({"edge_urls": ["ftp://x"]}, "edge_urls"),
        ({"verifier_url": "nope"}, "verifier_url"),
        ({"shaping": "tc"}, "shaping"),
        ({"token_file": str(tmp_path / "missing")}, "token_file"),
        ({"edge_url": "x"}, "edge_url"),
        ({"edge_urls": ["http://a:1", "http://a:1/"]}, "edge_urls"),
    ):
        with pytest.raises(ValueError, match=key):
            ExternalConfig.from_dict({**good, **bad})
    base = {"name": "x", "launcher": "external", "profile": "toy-edge-cloud", "backend": {"kind": "synthetic"}}
    with pytest.raises(ValueError, match="rtt_ms"):
        experiment_from_dict({**base, "rtt_ms": [0, 20], "external": good})
    with pytest.raises(ValueError, match="external"):
        experiment_from_dict({**base, "rtt_ms": [0]})
    assert (
        experiment_from_dict({**base, "rtt_ms": [0, 20], "external": {**good, "shaping": "edge"}}).external.shaping
        == "edge"
    )


def test_a_dead_shaping_daemon_in_an_edge_fails_the_check_and_heal_drops_it(devices):
    """The orchestrator sees, through the control API only, that an edge's shaping died (its link
    drops every packet), and heal() removes it so the next point applies it afresh."""
    from netem.nsutil import call_in_netns
    from netem.topology import netns_pids
    from orchestrator.launchers.external import ExternalTestbed

    verifier_url, edge_urls, token_file, orchestrator_netns, edge_netns = devices
    config = ExternalConfig(verifier_url, tuple(edge_urls), str(token_file), shaping="edge", verify_count=20)
    testbed = call_in_netns(orchestrator_netns, lambda: ExternalTestbed(config, n_edges=2))
    try:
        states = call_in_netns(orchestrator_netns, lambda: testbed.shape([10.0, 10.0]))
        assert [s.shaper for s in states] == ["in-edge-nfqueue"] * 2
        call_in_netns(orchestrator_netns, testbed.check)
        daemons = [
            pid
            for pid in netns_pids(edge_netns[1])
            if b"netem.nfqueue_daemon" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(daemons) == 1
        os.kill(daemons[0], 9)
        testbed._last_check_s = 0.0
        with pytest.raises(RuntimeError, match=r"shaping in edge1@.*died"):
            call_in_netns(orchestrator_netns, testbed.check)
        healed = call_in_netns(orchestrator_netns, testbed.heal)
        assert len(healed) == 1 and "edge1@" in healed[0]
        states = call_in_netns(orchestrator_netns, lambda: testbed.shape([10.0, 10.0]))
        assert every(abs(s.rtt_measured_p50_ms - s.rtt_configured_ms) < 2 for s in states)
    finally:
        call_in_netns(orchestrator_netns, testbed.close)
