"""What every launcher provides to the sweep: a ``Testbed`` that runs a point and returns its rows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Protocol
from collections.abc import Callable

from dsd.controller.interface import GAMMA_MAX
from dsd.cache.speculation_cache import CacheConfig

from orchestrator.links.keys import LinkOptions
from orchestrator.links.rows import LinkState

__all__ = ["EdgeHandle", "LauncherError", "LinkState", "PointSettings", "Testbed"]


class LauncherError(RuntimeError):
    """A testbed could not be brought up, used or taken down. The CLI prints it as one line
    (`dsdbed --debug` shows the traceback); orchestrator.running.run wraps whatever else a launcher
    raises while starting or stopping in one of these."""


@dataclass(frozen=True)
class EdgeHandle:
    client_id: int
    control_url: str  # the edge's HTTP control API, as the orchestrator reaches it
    name: str  # netns or container name; for link records
    token: str | None = field(default=None, repr=False)  # the testbed's token: its control API requires it


@dataclass(frozen=True)
class PointSettings:
    """What every point of a sweep runs with, whatever the launcher (orchestrator/running/run.py makes
    it from the experiment). The network launchers also use run_prefix (the start of their run
    ids), link_options and after_shape(testbed) (called once the links are shaped, before the
    runs start: the CPU pinning); the sim launcher has no link and nothing to pin."""

    warmup: int
    max_new_tokens: int
    max_in_flight: int
    controller: str = "static"
    gamma_max: int = GAMMA_MAX
    controller_modes: tuple[str, ...] = ()  # what the controller may pick (empty: the edge modes)
    transport: str = "ws"  # services/frames.py: the edges' link to the verifier
    request_deadline_s: float = 0.0  # services/edge/config.py RunConfig: 0 = none
    tcp_rto_max_ms: int = 0  # services/edge/config.py RunConfig: 0 = the kernel's
    cache: CacheConfig = CacheConfig()  # the cached mode's speculation cache (dsd/cache/speculation_cache.py)
    run_prefix: str = "run"
    link_options: LinkOptions | None = None  # the experiment's [link]
    after_shape: Callable | None = None
    # the category of each of the point's prompts (a categorized workload), or none: set per
    # point by orchestrator/running/run.py, as the prompts are
    categories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, low in (("warmup", 0), ("max_new_tokens", 1), ("max_in_flight", 1), ("gamma_max", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)!r}")

    def run_fields(self) -> dict:
        """The keys of an edge run (services/edge/config.py RunConfig) these settings set; a key
        at the edge's own default stays out, so an edge built before it still takes the run."""
        adaptive = self.controller != "static"
        return {
            "max_in_flight": self.max_in_flight,
            **({"controller": self.controller, "gamma_max": self.gamma_max} if adaptive else {}),
            **({"controller_modes": list(self.controller_modes)} if adaptive and self.controller_modes else {}),
            **({"transport": self.transport} if self.transport != "ws" else {}),
            **({"cache": dataclasses.asdict(self.cache)} if self.cache != CacheConfig() else {}),
            **({"request_deadline_s": self.request_deadline_s} if self.request_deadline_s else {}),
            **({"tcp_rto_max_ms": self.tcp_rto_max_ms} if self.tcp_rto_max_ms else {}),
            **({"categories": list(self.categories)} if self.categories else {}),
        }


class Testbed(Protocol):
    verifier_url: str  # the verifier's WebSocket URL as the edges reach it
    edges: list[EdgeHandle]
    shaper: str  # which backend shapes the links (recorded in every trace)

    def shape(self, rtt_ms_per_edge: list[float]) -> list[LinkState]:
        """Set each edge's link to its RTT (replacing any earlier shaping), measure, return the
        records. Loopback returns app-delay records and the edges add the delay themselves."""

    def app_delay_ms(self, client_id: int) -> float:
        """One-way delay the edge must add in the application (0 where the link is shaped)."""

    def check(self) -> None:
        """Raise if the links stopped being shaped as configured (called while a point runs)."""

    def heal(self) -> list[str]:
        """Before a retry: restart what died (verifier, edges), drop broken shaping so the next
        shape() re-applies and re-verifies it. Returns what was done."""

    def close(self) -> None:
        """Stop everything this launcher started; idempotent."""

    def local_shaper(self):
        """The netem Shaper of the links this host shapes now (its daemons are pinned, its rules
        count the bytes on the wire); None where no link is shaped on this host."""

    def local_processes(self) -> list:
        """The service processes this launcher started on this host (services.processes
        ServiceProcess), to pin; empty where it started none."""

    def run_point(self, point, prompts: list[list[int]], settings: PointSettings) -> tuple:
        """Run one sweep point (orchestrator.spec.plan.Point), request i of each client on
        prompts[i]; return (rounds rows, request rows, link rows, facts) as run_sweep takes them,
        the rows of services/traces.py finished by orchestrator.records.request_stats.finish_point."""
