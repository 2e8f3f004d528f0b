"""The netns launcher (root): the verifier and each edge in a network namespace of their own,
joined by a bridge, every edge's link shaped by netem/ (kernel netem or the NFQUEUE fallback).

Data traffic (the WebSocket between edge and verifier) crosses the shaped bridge; the
orchestrator reaches the services' HTTP APIs through Unix sockets, which are not bound to a
network namespace, so control traffic never touches the shaped links.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from netem import Shaper, ShaperConfig, Topology, TopologyConfig
from netem.probe import choose_backend
from orchestrator.links import keys as link_keys
from orchestrator.links import rows as link_rows
from orchestrator.launchers.base import EdgeHandle, LinkState
from orchestrator.launchers.control_api import ControlApiTestbed
from orchestrator.launchers.services_config import ServicesConfig
from orchestrator.launchers.processes import ServiceProcess, heal_services, write_token_file

VERIFIER_PORT = 8700
EDGE_PORT = 8701


class NetnsTestbed(ControlApiTestbed):
    def __init__(
        self, config: ServicesConfig, shaper_config: ShaperConfig | None = None, loss_pct: float = 0.0
    ) -> None:
        self.config = config
        self.loss_pct = loss_pct  # each direction of every link (fault tests)
        self.shaper_config = shaper_config or ShaperConfig()
        # Probed now so the sweep's sidecar can say which backend shapes every link.
        self.shaper, self.shaper_reason = choose_backend(self.shaper_config.backend)
        self._processes: list[ServiceProcess] = []
        self._shaper: Shaper | None = None
        self._socket_dir = Path(tempfile.mkdtemp(prefix="dsdbed-sock-"))
        self._topology = Topology(TopologyConfig(n_edges=config.n_edges))
        try:
            self._topology.__enter__()
            self._start_services()
        except BaseException:
            self.close()
            raise

    def _start_services(self) -> None:
        topology = self._topology
        work = self.config.make_work_dir()
        token_file = write_token_file(work)  # the bridge is reachable from the host namespace
        token = token_file.read_text()
        verifier_socket = self._socket_dir / "verifier.sock"
        verifier = ServiceProcess(
            "verifier",
            self.config.verifier_argv(topology.verifier.ip, VERIFIER_PORT, token_file)
            + ["--unix-socket", str(verifier_socket)],
            f"unix:{verifier_socket}/health",
            netns=topology.verifier.netns,
            log_dir=work,
        )
        self._processes.append(verifier)
        self.verifier_url = f"ws://{topology.verifier.ip}:{VERIFIER_PORT}/ws"
        self.edges = []
        for i, endpoint in enumerate(topology.edges):
            edge_socket = self._socket_dir / f"edge{i}.sock"
            self._processes.append(
                ServiceProcess(
                    f"edge{i}",
                    self.config.edge_argv(endpoint.ip, EDGE_PORT, work / f"edge{i}", token_file)
                    + ["--unix-socket", str(edge_socket)],
                    f"unix:{edge_socket}/health",
                    netns=endpoint.netns,
                    log_dir=work,
                )
            )
            self.edges.append(EdgeHandle(i, f"unix:{edge_socket}", endpoint.name, token))
        for process in self._processes:
            process.wait_ready(self.config.ready_timeout_s)

    def shape(self, rtt_ms_per_edge: list) -> list[LinkState]:
        """A fresh Shaper per set of links (netem's Shaper applies once); the old one goes first.
        One RTT (ms) or one LinkSpec per edge."""
        if self._shaper is not None:
            self._shaper.close()
            self._shaper = None
        shaper = Shaper(self.shaper_config)
        shaper.__enter__()
        self._shaper = shaper
        specs = [link_keys.as_spec(r) for r in rtt_ms_per_edge]
        if self.loss_pct:
            specs = [dataclasses.replace(s, loss_pct=self.loss_pct) for s in specs]
        records = shaper.apply(self._topology.links(specs))
        return [link_rows.link_state(r) for r in records]

    def local_shaper(self) -> Shaper | None:
        return self._shaper

    def local_processes(self) -> list[ServiceProcess]:
        return list(self._processes)

    @property
    def link_shaper(self):
        """The netem Shaper of the links shaped now (a link schedule changes them through it)."""
        if self._shaper is None:
            raise RuntimeError("no links are shaped: call shape() first")
        return self._shaper

    def check(self) -> None:
        """Raise if shaping died (a dead NFQUEUE daemon drops every packet of its links)."""
        if self._shaper is not None:
            self._shaper.check()

    def heal(self) -> list[str]:
        """Before a retry: remove broken shaping (the next shape() applies and verifies it
        afresh) and restart every service that died or stopped answering."""
        healed = []
        if self._shaper is not None and self._shaper.failures():
            failures = self._shaper.failures()
            self._shaper.close()
            self._shaper = None
            healed.append(f"removed dead shaping ({failures[0][:120]}); the next point re-applies it")
        return healed + heal_services(self._processes, self.config.ready_timeout_s)

    def app_delay_ms(self, client_id: int) -> float:
        return 0.0

    def edge_endpoint(self, client_id: int) -> tuple[str, str]:
        """(network namespace path, IP) of edge ``client_id``: where a program that stands for the
        device's own app runs to reach the edge's HTTP API (benchmarks/openai_peer.py)."""
        endpoint = self._topology.edges[client_id]
        return endpoint.netns, endpoint.ip

    def close(self) -> None:
        if self._shaper is not None:
            self._shaper.close()
            self._shaper = None
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        self._topology.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> NetnsTestbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
