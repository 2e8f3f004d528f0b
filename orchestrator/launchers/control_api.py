"""Run one sweep point on a network testbed through the edges' control API; return trace rows.

Each client is one run on an edge (client c on edge c mod N). Warm-up requests run first in
every run and are dropped here, so that cold caches and first connections stay out of the
results. Every call (every attempt of a point) uses run ids of its own, so the rows of an earlier
attempt can never be fetched into a later one. While the runs go on, the testbed's shaping is
checked: a dead NFQUEUE daemon fails the point at once, with its reason, instead of stalling it
until the timeout. A partial last row of an edge's trace (an edge killed mid-write) is dropped
and counted in the point's record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time

import pandas as pd

from netem.spec import LinkSpec
from orchestrator.common.csv_rows import read_whole_rows
from orchestrator.common.http_client import call
from orchestrator.links.keys import edge_specs
from orchestrator.links.scheduled_point import ScheduledPoint
from orchestrator.launchers.base import LinkState, PointSettings, Testbed
from orchestrator.records.request_stats import finish_point
from orchestrator.spec.plan import Point


def run_point_on_edges(
    point: Point, testbed: Testbed, prompts: list[list[int]], settings: PointSettings, timeout_s: float = 900.0
) -> tuple[list[dict], list[dict], list[LinkState], dict]:
    """One point, its clients' runs on the testbed's edges, everything of it as ``settings`` says;
    settings.after_shape(testbed) is called once the links are shaped (and any shaping daemon
    runs), before the runs start: the CPU pinning uses it (orchestrator/common/cpus.py)."""
    link_options = settings.link_options
    specs = edge_specs(link_options, point, len(testbed.edges))
    links = testbed.shape(specs)
    masks = settings.after_shape(testbed) if settings.after_shape is not None else None
    runs: list = []
    scheduled = None
    if link_options is not None and link_options.schedule:
        scheduled = ScheduledPoint(
            testbed.link_shaper, specs, link_options.schedule, keep_order=link_options.schedule_order == "queue"
        )
    wire_before = _wire_counters(testbed)
    start_at_unix_s = time.time() + start_lead_s(specs, point.clients) if point.clients > 1 else 0.0
    with scheduled or contextlib.nullcontext():
        _run_clients(point, testbed, prompts, settings, timeout_s, runs, start_at_unix_s)
    wire_after = _wire_counters(testbed)
    testbed.check()
    round_frames, request_frames, dropped = [], [], 0
    for edge, run_id in runs:
        for name, frames in (("rounds", round_frames), ("requests", request_frames)):
            frame, n_dropped = read_whole_rows(
                call("GET", f"{edge.control_url}/runs/{run_id}/{name}.csv", token=edge.token)
            )
            frames.append(frame)
            dropped += n_dropped
    rounds = pd.concat(round_frames, ignore_index=True)
    requests = pd.concat(request_frames, ignore_index=True)
    failed = requests["error"].notna() & (requests["error"].astype(str) != "") if "error" in requests else None
    if failed is not None and failed.any():
        raise RuntimeError(f"a request of {point.key} failed: {requests.loc[failed, 'error'].iloc[0]}")
    link_rows = [dataclasses.asdict(link) for link in links]
    if wire_before and wire_after:
        add_wire_bytes(link_rows, wire_before, wire_after, rounds, len(testbed.edges))
    start = _start_spread(requests, start_at_unix_s)
    # Each client's own link (per-edge links differ): client c ran on edge c mod N.
    rounds, requests = finish_point(rounds, requests, settings.warmup, testbed.shaper, links)
    if scheduled is not None:
        rounds = scheduled.annotate_rounds(rounds, len(testbed.edges))
        link_rows += scheduled.rows(links)
    extra = {"partial_rows_dropped": dropped, **start, **({"cpu_masks": masks} if masks else {})}
    return rounds.to_dict("records"), requests.to_dict("records"), link_rows, extra


PROBES_BEFORE_RUN = 5
POST_LEAD_S = 0.3  # posting the runs one after the other, and slack
POST_LEAD_PER_CLIENT_S = 0.02


def start_lead_s(specs: list[LinkSpec], clients: int) -> float:
    """How far ahead the clients of one point are given their common start: each edge connects
    and probes its link (a round trip each) before it waits for the start, and the runs are
    posted one after the other. Without a common start the first client's requests can run alone
    while the last is still probing, so a point would measure fewer clients than it names (the
    sim starts every client at t = 0)."""
    rtt_s = max(round_trip_ms(spec) for spec in specs) / 1000
    return (PROBES_BEFORE_RUN + 2) * rtt_s + POST_LEAD_S + POST_LEAD_PER_CLIENT_S * clients


def round_trip_ms(spec: LinkSpec) -> float:
    """The link's configured round trip with each direction's jitter at its widest."""
    return spec.expected_rtt_ms() + spec.up.jitter_ms + spec.down.jitter_ms


def _start_spread(requests: pd.DataFrame, start_at_unix_s: float) -> dict:
    """When the clients' first requests started, against the common start they were given: a
    spread of a few ms says they started together; a late start says the lead was too short."""
    if not start_at_unix_s or requests.empty or "t_start_s" not in requests:
        return {}
    first = requests.groupby("client_id")["t_start_s"].min()
    return {
        "start_at_unix_s": start_at_unix_s,
        "start_spread_ms": 1000 * float(first.max() - first.min()),
        "start_late_ms": 1000 * max(0.0, float(first.max()) - start_at_unix_s),
    }


def _wire_counters(testbed) -> list[dict] | None:
    """Packets and bytes that crossed each edge's link so far (NFQUEUE rules' counters)."""
    shaper = testbed.local_shaper()
    return shaper.wire_counters() if shaper is not None else None


def add_wire_bytes(
    link_rows: list[dict], before: list[dict], after: list[dict], rounds: pd.DataFrame, n_edges: int
) -> None:
    """Each edge's bytes on the wire during the point's runs (warm-up included, and whatever the
    schedule's probes sent: 84 bytes each way per 10 ms), and per round its clients ran."""
    per_edge = rounds["client_id"].astype(int) % n_edges if len(rounds) else pd.Series(dtype=int)
    for i, (row, b, a) in enumerate(zip(link_rows, before, after)):
        n_rounds = int((per_edge == i).sum())
        for key in a:
            row[key] = a[key] - b[key]
        for direction in ("up", "down"):
            row[f"wire_bytes_per_round_{direction}"] = (
                row[f"wire_bytes_{direction}"] / n_rounds if n_rounds else float("nan")
            )


def _run_clients(
    point: Point,
    testbed: Testbed,
    prompts,
    settings: PointSettings,
    timeout_s: float,
    runs: list,
    start_at_unix_s: float,
) -> None:
    """Start one run per client on its edge, their first requests at start_at_unix_s (0: at once),
    and wait for all of them; `runs` gets (edge, run id)."""
    attempt_id = os.urandom(3).hex()
    for client in range(point.clients):
        edge = testbed.edges[client % len(testbed.edges)]
        run_id = f"{settings.run_prefix}-{point.key}-{attempt_id}-c{client}"
        call(
            "POST",
            f"{edge.control_url}/runs",
            token=edge.token,
            body=run_body(
                settings,
                run_id=run_id,
                client_id=str(client),
                mode=point.mode,
                gamma=point.gamma,
                sampling=point.sampling.run_fields(),
                prompts=prompts,
                max_new_tokens=settings.max_new_tokens,
                verifier_url=testbed.verifier_url,
                app_delay_ms=testbed.app_delay_ms(client),
                probe_count=PROBES_BEFORE_RUN,
                probe_interval_ms=200.0,
                start_at_unix_s=start_at_unix_s,
            ),
        )
        runs.append((edge, run_id))
    deadline = time.monotonic() + timeout_s
    pending = list(runs)
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} run(s) of {point.key} unfinished after {timeout_s:.0f} s")
        time.sleep(0.2)
        testbed.check()
        for edge, run_id in list(pending):
            status = json.loads(call("GET", f"{edge.control_url}/runs/{run_id}", token=edge.token))
            if status["status"] == "failed":
                raise RuntimeError(f"run {run_id} on {edge.name} failed: {status.get('error')}")
            if status["status"] == "done":
                pending.remove((edge, run_id))


def run_body(
    settings: PointSettings, *, run_id: str, client_id: str, mode: str, gamma: int, sampling: dict, **run
) -> dict:
    """The body of an edge's POST /runs (services/edge/config.py RunConfig): the run, its sampling
    (a Setting's run_fields), and every key of the point's settings the edge takes."""
    return {
        "run_id": run_id,
        "client_id": client_id,
        "mode": mode,
        "gamma": gamma,
        **sampling,
        **settings.run_fields(),
        **run,
    }


class ControlApiTestbed:
    """Base of the network testbeds: a point's clients are runs on the edges, started and read
    back through each edge's control API."""

    def run_point(self, point, prompts: list[list[int]], settings: PointSettings) -> tuple:
        return run_point_on_edges(point, self, prompts, settings)

    def local_shaper(self):
        """None: a launcher that shapes links on this host (netns, compose) gives its Shaper."""
        return None

    def local_processes(self) -> list:
        """Empty: a launcher that starts services on this host (netns, loopback) gives them."""
        return []
