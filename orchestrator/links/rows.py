"""The rows of links.csv (``LinkState``: one edge's link as configured and as measured) and the
columns points.csv takes from them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from netem.spec import LinkSpec


@dataclass
class LinkState:
    """The link of one edge as configured and as measured, a row of links.csv."""

    edge: str
    shaper: str  # "kernel-netem", "nfqueue", or "app-delay" (loopback)
    rtt_configured_ms: float
    jitter_configured_ms: float = 0.0
    loss_configured_pct: float = 0.0
    rate_configured_mbit: float = 0.0  # 0 = not limited
    rtt_measured_p50_ms: float = float("nan")
    rtt_measured_p99_ms: float = float("nan")
    rtt_measured_stdev_ms: float = float("nan")
    loss_measured_pct: float = float("nan")
    # The rest of the link (orchestrator/links/keys.py): what jitter, distribution and loss should give.
    distribution_configured: str = "uniform"
    correlation_configured_pct: float = 0.0
    delay_up_configured_ms: float = float("nan")
    delay_down_configured_ms: float = float("nan")
    rtt_expected_p50_ms: float = float("nan")  # the median RTT the jitter distribution gives
    rtt_expected_stdev_ms: float = 0.0
    loss_expected_pct: float = 0.0  # a probe and its reply both get through
    rtt_measured_mean_ms: float = float("nan")


def link_state(record) -> LinkState:
    """A netem LinkRecord as a row of links.csv: the link as configured and as measured."""
    spec, m = record.spec, record.measured
    nan = math.nan
    return LinkState(
        edge=record.edge,
        shaper=record.backend,
        rtt_configured_ms=m.configured_rtt_ms if m else spec.expected_rtt_ms(),
        jitter_configured_ms=spec.jitter_ms,
        loss_configured_pct=spec.loss_pct,
        rate_configured_mbit=spec.rate_mbit or 0.0,
        rtt_measured_p50_ms=m.rtt_p50_ms if m else nan,
        rtt_measured_p99_ms=m.rtt_p99_ms if m else nan,
        rtt_measured_stdev_ms=m.rtt_stdev_ms if m else nan,
        loss_measured_pct=m.loss_pct if m else nan,
        distribution_configured=spec.distribution,
        correlation_configured_pct=spec.correlation_pct,
        delay_up_configured_ms=spec.up.delay_ms,
        delay_down_configured_ms=spec.down.delay_ms,
        rtt_expected_p50_ms=m.expected_rtt_p50_ms if m else spec.expected_rtt_p50_ms(),
        rtt_expected_stdev_ms=spec.expected_rtt_stdev_ms,
        loss_expected_pct=spec.expected_rtt_loss_pct,
        rtt_measured_mean_ms=m.rtt_mean_ms if m else nan,
    )


# What points.csv adds per point from links.csv: the median over the point's edges.
LINK_POINT_COLUMNS = {
    "rtt_expected_p50_ms": "rtt_link_expected_p50_ms",
    "rtt_measured_stdev_ms": "rtt_link_stdev_ms",
    "rtt_expected_stdev_ms": "rtt_link_expected_stdev_ms",
    "loss_measured_pct": "loss_link_pct",
    "loss_expected_pct": "loss_link_expected_pct",
    "wire_bytes_per_round_up": "wire_bytes_per_round_up",
    "wire_bytes_per_round_down": "wire_bytes_per_round_down",
}


def add_link_columns(points: pd.DataFrame, links: pd.DataFrame | None, keys: list[str]) -> pd.DataFrame:
    """points.csv with each point's link as configured and measured (links.csv, median over edges)."""
    if links is None or links.empty or points.empty:
        return points
    if "change_index" in links:  # the point's own links, not a schedule's later states
        links = links[links["change_index"].fillna(0) == 0]
    keys = [k for k in keys if k in links.columns and k in points.columns]
    have = [c for c in LINK_POINT_COLUMNS if c in links.columns]
    if not keys or not have:
        return points
    per_point = links.groupby(keys)[have].median().rename(columns=LINK_POINT_COLUMNS).reset_index()
    per_point[keys] = per_point[keys].astype(points[keys].dtypes.to_dict())
    return points.merge(per_point, on=keys, how="left")


def link_state_of(edge: str, shaper: str, spec: LinkSpec) -> LinkState:
    """A links.csv row for a configured link that has no measurement of its own."""
    return LinkState(
        edge=edge,
        shaper=shaper,
        rtt_configured_ms=spec.expected_rtt_ms(),
        jitter_configured_ms=spec.jitter_ms,
        loss_configured_pct=spec.loss_pct,
        rate_configured_mbit=spec.rate_mbit or 0.0,
        distribution_configured=spec.distribution,
        correlation_configured_pct=spec.correlation_pct,
        delay_up_configured_ms=spec.up.delay_ms,
        delay_down_configured_ms=spec.down.delay_ms,
        rtt_expected_p50_ms=spec.expected_rtt_p50_ms(),
        rtt_expected_stdev_ms=spec.expected_rtt_stdev_ms,
        loss_expected_pct=spec.expected_rtt_loss_pct,
    )
