"""A run's traces: rounds.csv (one row per round) and requests.csv (one row per request).

Rows are written and flushed as rounds happen, so a crashed run keeps what it measured; a
failure is a row too, with the ``error`` column set. Inside an event loop a round's row is
built and written at the loop's next turn (all rows due then, one flush): not between a verdict
and the next block, where it would count as the harness's overhead, but while the edge waits (a
request row, and closing, write the rounds due first). ``run.json`` beside them records the run's
config, the backend, package versions and the git commit.

Words of docs/concepts.md: ``proposed`` draft tokens sent, ``accepted`` of them, ``emitted`` =
accepted + 1 (0 for a stale block); cloud AR rows have proposed = accepted = 0 and emitted = 1.

Times ``t_*_s`` are on the edge's clock: epoch seconds carried forward by ``perf_counter``, so
they are precise within a run and comparable between edge processes on one host.
On the synthetic backend ``t_draft_start_s`` is the emulated draft device's start of the block
(services/compute.py: it starts once the device is free and the verdict it depends on arrived).
``server_*`` are the verifier's own measures of the round (queue wait, compute, batch size);
``rtt_probe_ms`` is the latest application-level ping, ``app_delay_ms`` the delay added to each
message in each direction. ``feature_bytes``: the encoded size of the target's features the reply
carried to a feature draft (dsd.features; 0 without one).

requests.csv: ``wall_s`` from the request's start (before its Open is sent) to its last token;
``ttft_s`` to the first emitted token; ``steady_per_token_s`` the steady-state time per token,
after the first emission (``steady_per_token_s`` below), empty if undefined. ``token_ids`` are
the generated ids, space-separated. ``gave_up``: why the client gave the request up before it
ended (``deadline: ...``, RunConfig.request_deadline_s), else empty; such a row is not an error
(the run goes on), its ``tokens`` are those received by then and ``token_ids`` is empty.
``request_id``: the ``X-Request-ID`` header of a request through the OpenAI-compatible API
(services/edge/openai_api), so a load generator's records join ours; else empty. ``category``:
the prompt's category where the workload file gives one (a run's ``categories``), else empty.

These two row types are the columns of every launcher's traces: the sim launcher
(orchestrator/launchers/sim.py) builds the same rows on virtual time and leaves empty what it
does not measure (clocks, server measures, ``rtt_probe_ms``, ``app_delay_ms``). Rows are built
with keywords only.
"""

from __future__ import annotations

import asyncio
import csv
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from dsd.backends.machine import cpu_model
from dsd.provenance import git_commit


@dataclass(frozen=True, kw_only=True)
class RoundRow:
    run_id: str
    client_id: str
    mode: str
    gamma: int
    request_index: int
    round_index: int
    proposed: int
    accepted: int
    emitted: int
    stale: bool
    t_draft_start_s: float | None = None
    t_draft_end_s: float | None = None
    t_send_s: float | None = None
    t_receive_s: float | None = None
    server_queue_s: float | None = None
    server_compute_s: float | None = None
    server_batch_size: int | None = None
    rtt_probe_ms: float | None = None
    app_delay_ms: float | None = None
    error: str = ""
    round_gamma: int | None = None  # the gamma and mode the block was drafted in (dsd.controller.interface);
    round_mode: str = ""  # empty for the modes the server runs alone
    feature_bytes: int = 0  # the target's features the reply carried (dsd.features), encoded
    # the cached mode (dsd.cache.filler.CacheRecord): what the verdict met in the speculation cache;
    # empty for the other modes
    cache_hit: bool | None = None
    cache_depth: int | None = None
    cache_rank: int | None = None
    cache_branches: int | None = None
    cache_fill_s: float | None = None
    cache_hit_predicted: float | None = None
    cache_filled: bool | None = None


def cache_columns(record) -> dict:
    """A CacheRecord (or None) as RoundRow's cache_* fields."""
    if record is None:
        return {}
    return {
        "cache_hit": record.hit,
        "cache_depth": record.depth,
        "cache_rank": record.rank,
        "cache_branches": record.branches,
        "cache_fill_s": record.fill_s,
        "cache_hit_predicted": record.predicted_hit,
        "cache_filled": record.filled,
    }


@dataclass(frozen=True, kw_only=True)
class RequestRow:
    run_id: str
    client_id: str
    mode: str
    gamma: int
    request_index: int
    prompt_tokens: int
    tokens: int
    rounds: int
    stale_rounds: int
    wall_s: float | None = None
    ttft_s: float | None = None
    steady_per_token_s: float | None = None
    t_start_s: float | None = None
    t_end_s: float | None = None
    rtt_probe_ms: float | None = None
    app_delay_ms: float | None = None
    token_ids: str = ""
    error: str = ""
    gave_up: str = ""  # why the client gave the request up (its deadline; tokens = those received)
    request_id: str = ""  # the HTTP client's X-Request-ID, for requests through the OpenAI-compatible API
    category: str = ""  # the prompt's category in a categorized workload (workloads/README.md), else empty


def as_dict(row: RoundRow | RequestRow) -> dict:
    """A row as a dict of its columns (not asdict: it deep-copies every value)."""
    return {name: getattr(row, name) for name in _COLUMNS[type(row)]}


ROUND_COLUMNS = tuple(f.name for f in fields(RoundRow))
REQUEST_COLUMNS = tuple(f.name for f in fields(RequestRow))
_COLUMNS = {RoundRow: ROUND_COLUMNS, RequestRow: REQUEST_COLUMNS}


class EdgeClock:
    """perf_counter readings as epoch seconds."""

    def __init__(self) -> None:
        self.epoch0_s = time.time()
        self.perf0_s = time.perf_counter()

    def epoch_s(self, perf_s: float | None) -> float | None:
        return None if perf_s is None else self.epoch0_s + (perf_s - self.perf0_s)


class TraceWriter:
    def __init__(self, folder: Path, sidecar: dict) -> None:
        folder.mkdir(parents=True, exist_ok=False)  # never overwrite another run's traces
        self.folder = folder
        (folder / "run.json").write_text(json.dumps({**sidecar, "environment": environment()}, indent=2))
        self._rounds = self._open("rounds.csv", ROUND_COLUMNS)
        self._requests = self._open("requests.csv", REQUEST_COLUMNS)
        self._due: list = []  # round rows (or what builds them) to write at the loop's next turn

    def _open(self, name: str, columns: tuple[str, ...]):
        handle = open(self.folder / name, "w", newline="")
        writer = csv.writer(handle)
        writer.writerow(columns)
        handle.flush()
        return handle, writer

    def round(self, row: RoundRow | Callable[[], RoundRow]) -> None:
        """A round's row, or what builds it (called when the row is written, at the loop's next
        turn: building a row of 22 fields also costs tens of microseconds right after a verdict)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a script): write it now
            self._write(self._rounds, [row])
            return
        if not self._due:
            loop.call_soon(self.write_due)
        self._due.append(row)

    def request(self, row: RequestRow) -> None:
        self.write_due()
        self._write(self._requests, [row])

    def write_due(self) -> None:
        if self._due and not self._rounds[0].closed:
            self._write(self._rounds, self._due)
        self._due = []

    @staticmethod
    def _write(target, rows: list) -> None:
        handle, writer = target
        # Not astuple: it deep-copies every value, 40 us a row here, paid on every round.
        rows = [row() if callable(row) else row for row in rows]
        writer.writerows([_cell(getattr(row, name)) for name in _COLUMNS[type(row)]] for row in rows)
        handle.flush()

    def close(self) -> None:
        self.write_due()
        for handle, _ in (self._rounds, self._requests):
            handle.close()


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value)


def environment() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for package in ("torch", "transformers", "aiohttp", "msgpack"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "packages": versions,
        "git_commit": git_commit(),
    }
