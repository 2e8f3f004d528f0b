"""The loopback launcher: verifier and edges as processes on 127.0.0.1, for machines without
root. The kernel cannot delay loopback traffic for us here, so each edge delays its messages in
the application (half the RTT each way) and every trace says shaper=app-delay.

Every testbed (this one and netns) gets a fresh random token in ``WORK_DIR/token`` (mode 0600),
passed to the verifier and every edge by ``--token-file``: other users and programs on the host
can reach 127.0.0.1 too."""

from __future__ import annotations

from netem.spec import LinkSpec
from orchestrator.launchers.base import EdgeHandle, LinkState
from orchestrator.launchers.control_api import ControlApiTestbed
from orchestrator.launchers.processes import ServiceProcess, free_port, heal_services, write_token_file
from orchestrator.launchers.services_config import ServicesConfig


class LoopbackTestbed(ControlApiTestbed):
    shaper = "app-delay"

    def __init__(self, config: ServicesConfig) -> None:
        self.config = config
        self._processes: list[ServiceProcess] = []
        self._delay_ms: dict[int, float] = {}
        work = config.make_work_dir()
        try:
            token_file = write_token_file(work)
            token = token_file.read_text()
            port = free_port()
            verifier = ServiceProcess(
                "verifier",
                config.verifier_argv("127.0.0.1", port, token_file),
                f"http://127.0.0.1:{port}/health",
                log_dir=work,
            )
            self._processes.append(verifier)
            self.verifier_url = f"ws://127.0.0.1:{port}/ws"
            self.edges = []
            for i in range(config.n_edges):
                edge_port = free_port()
                self._processes.append(
                    ServiceProcess(
                        f"edge{i}",
                        config.edge_argv("127.0.0.1", edge_port, work / f"edge{i}", token_file),
                        f"http://127.0.0.1:{edge_port}/health",
                        log_dir=work,
                    )
                )
                self.edges.append(EdgeHandle(i, f"http://127.0.0.1:{edge_port}", f"edge{i}", token))
            for process in self._processes:
                process.wait_ready(config.ready_timeout_s)
        except BaseException:
            self.close()
            raise

    def shape(self, rtt_ms_per_edge: list) -> list[LinkState]:
        """One RTT (ms) per edge; a LinkSpec only if it is a plain symmetric delay."""
        rtt_ms_per_edge = [_plain_rtt_ms(link) for link in rtt_ms_per_edge]
        self._delay_ms = {i: rtt / 2 for i, rtt in enumerate(rtt_ms_per_edge)}
        return [LinkState(edge.name, self.shaper, rtt) for edge, rtt in zip(self.edges, rtt_ms_per_edge)]

    def app_delay_ms(self, client_id: int) -> float:
        return self._delay_ms.get(client_id % len(self.edges), 0.0)

    def check(self) -> None:
        """Nothing to check: the delay lives in the edges, which a run's failure reports."""

    def heal(self) -> list[str]:
        return heal_services(self._processes, self.config.ready_timeout_s)

    def local_processes(self) -> list[ServiceProcess]:
        return list(self._processes)

    def close(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()

    def __enter__(self) -> LoopbackTestbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plain_rtt_ms(link) -> float:
    if not isinstance(link, LinkSpec):
        return link
    if link != LinkSpec(rtt_ms=link.rtt_ms):
        raise ValueError(
            f"the loopback launcher delays in the application and can only give an RTT; "
            f"got {link} (use netns or compose)"
        )
    return link.rtt_ms
