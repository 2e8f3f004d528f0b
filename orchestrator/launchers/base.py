"""What every network launcher provides to the sweep."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class EdgeHandle:
    client_id: int
    control_url: str          # the edge's HTTP control API, as the orchestrator reaches it
    name: str                 # netns or container name; for link records
    token: str | None = field(default=None, repr=False)   # the testbed's token: its control API requires it


@dataclass
class LinkState:
    """The link of one edge as configured and as measured, a row of links.csv."""
    edge: str
    shaper: str               # "kernel-netem", "nfqueue", or "app-delay" (loopback)
    rtt_configured_ms: float
    jitter_configured_ms: float = 0.0
    loss_configured_pct: float = 0.0
    rate_configured_mbit: float = 0.0      # 0 = not limited
    rtt_measured_p50_ms: float = float("nan")
    rtt_measured_p99_ms: float = float("nan")
    rtt_measured_stdev_ms: float = float("nan")
    loss_measured_pct: float = float("nan")
    # The rest of the link (orchestrator/links.py): what jitter, distribution and loss should give.
    distribution_configured: str = "uniform"
    correlation_configured_pct: float = 0.0
    delay_up_configured_ms: float = float("nan")
    delay_down_configured_ms: float = float("nan")
    rtt_expected_p50_ms: float = float("nan")     # the median RTT the jitter distribution gives
    rtt_expected_stdev_ms: float = 0.0
    loss_expected_pct: float = 0.0                # a probe and its reply both get through
    rtt_measured_mean_ms: float = float("nan")


class Testbed(Protocol):
    verifier_url: str         # the verifier's WebSocket URL as the edges reach it
    edges: list[EdgeHandle]
    shaper: str               # which backend shapes the links (recorded in every trace)

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
