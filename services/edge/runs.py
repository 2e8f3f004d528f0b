"""An edge run's record and what it writes: a run (``Run``), the probe of the link while it runs,
and its requests' rows (``request_row``, and the rows of an error, ``error_rows``); shared by the
control API's runs (services/edge/app.py) and the OpenAI-compatible API's requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from services.edge.config import Request, RunConfig
from services.edge.verifier_channel import VerifierChannel
from dsd.costs.compute_times import steady_per_token_s
from services.traces import EdgeClock, RequestRow, RoundRow, TraceWriter


class Run:
    """One run posted to the edge's control API: its config, folder and progress."""

    def __init__(self, config: RunConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.status = "running"
        self.error: str | None = None
        self.requests_done = 0
        self.tokens = 0
        self.rtt_before_ms: list[float] = []
        self.task: asyncio.Task | None = None

    def summary(self) -> dict:
        return {
            "run_id": self.config.run_id,
            "client_id": self.config.client_id,
            "mode": self.config.mode,
            "status": self.status,
            "error": self.error,
            "requests_done": self.requests_done,
            "requests_total": len(self.config.prompts),
            "tokens": self.tokens,
            "rtt_before_ms": self.rtt_before_ms,
            "folder": str(self.folder),
        }


async def probe_loop(channel: VerifierChannel, interval_s: float) -> None:
    """Probe the link's RTT every interval while a run goes on (cancelled at its end)."""
    while True:
        await asyncio.sleep(interval_s)
        await channel.probe_ms()


def request_row(writer: TraceWriter, clock: EdgeClock, channel: VerifierChannel, r: Request) -> None:
    c = r.config
    n_tokens = r.n_emitted if r.gave_up else len(r.tokens or ())
    writer.request(
        RequestRow(
            run_id=c.run_id,
            client_id=c.client_id,
            mode=c.mode,
            gamma=c.gamma,
            request_index=r.index,
            prompt_tokens=len(r.prompt),
            tokens=n_tokens,
            rounds=r.rounds,
            stale_rounds=r.stale_rounds,
            wall_s=None if r.t_last_s is None else r.t_last_s - r.t_start_s,
            ttft_s=None if r.t_first_s is None else r.t_first_s - r.t_start_s,
            steady_per_token_s=steady_per_token_s(r.t_first_s, r.t_last_s, n_tokens - r.first_emitted),
            t_start_s=clock.epoch_s(r.t_start_s),
            t_end_s=clock.epoch_s(r.t_last_s),
            rtt_probe_ms=channel.rtt_probe_ms,
            app_delay_ms=c.app_delay_ms,
            token_ids=" ".join(map(str, r.tokens or [])),
            gave_up=r.gave_up,
            request_id=r.request_id,
            category=category_of(c, r.index),
        )
    )


def error_rows(writer: TraceWriter, channel: VerifierChannel, run: Run, request: Request | None) -> None:
    c = run.config
    keys: dict[str, Any] = {
        "run_id": c.run_id,
        "client_id": c.client_id,
        "mode": c.mode,
        "gamma": c.gamma,
        "request_index": request.index if request else run.requests_done,
        "rtt_probe_ms": channel.rtt_probe_ms,
        "app_delay_ms": c.app_delay_ms,
        "error": run.error,
    }
    rounds = request.rounds if request else 0
    writer.round(RoundRow(**keys, round_index=rounds, proposed=0, accepted=0, emitted=0, stale=False))
    writer.request(
        RequestRow(
            **keys,
            prompt_tokens=len(request.prompt) if request else 0,
            tokens=0,
            rounds=rounds,
            stale_rounds=0,
            category=category_of(c, keys["request_index"]),
        )
    )


def category_of(config: RunConfig, index: int) -> str:
    """The category of the run's index-th prompt; empty without categories (an OpenAI-compatible
    API request's index counts the edge's requests, not its one prompt)."""
    return config.categories[index] if index < len(config.categories) else ""
