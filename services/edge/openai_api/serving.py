"""The engine side of the OpenAI-compatible API (``OpenAIServing``): requests admitted (up to
``max_concurrent`` decoding, ``max_queue`` waiting, one more refused), decoded by the edge's own
client (services/edge/client.py: DSD, cloud AR or co-located SD) on one channel to the
verifier, their committed tokens handed out as they arrive (``Generation``), and each one a row
of the serving run's requests.csv and rounds.csv like any run's. Nothing here knows HTTP; what
fails is an ``ApiError`` for the routes to answer with.

A request ended early (its client went away, a stop string reached, its timeout) is given up as
a run's request past its deadline is: its verifier session closed without waiting, its draft
cache freed on the device after any pass still running, and its row says why (``gave_up``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path

import aiohttp

from dsd.backends.protocol import LanguageModel
from dsd.modes import edge_modes
from dsd.speculation.stopping import StopRule
from services.compute import PreciseTimer
from services.traces import EdgeClock, TraceWriter
from services.edge.runs import Run, error_rows, probe_loop, request_row
from services.edge.client import Client
from services.edge.config import Request, RunConfig, RunError, ws_url
from services.edge.openai_api.config import ServeConfig
from services.edge.openai_api.protocol import ApiError, GenerateRequest
from services.edge.verifier_channel import VerifierChannel

log = logging.getLogger("services.edge")
CONNECT_TIMEOUT_S = 10.0
_VERIFIER_CODE = re.compile(r"verifier error (\w+)")
# the verifier's refusals of a request as the API answers them (else 500: a fault of ours or its)
_STATUS_OF_CODE = {
    "limit": (400, "invalid_request_error"),
    "out_of_range": (400, "invalid_request_error"),
    "busy": (429, "rate_limit_error"),
    "link_down": (503, "service_unavailable_error"),
}


def unavailable(message: str, code: str) -> ApiError:
    return ApiError(503, message, "service_unavailable_error", None, code)


class _Serving:
    """One settings' state: the channel to the verifier, the rows' folder, the request counter."""

    def __init__(self, config: ServeConfig, writer: TraceWriter) -> None:
        self.config = config
        self.writer = writer
        self.clock = EdgeClock()
        self.channel: VerifierChannel | None = None
        self.probing: asyncio.Task | None = None
        self.indices = itertools.count()
        self.lock = asyncio.Lock()

    async def close(self) -> None:
        await self.drop_channel()
        self.writer.close()

    async def drop_channel(self) -> None:
        if self.probing is not None:
            self.probing.cancel()
            await asyncio.gather(self.probing, return_exceptions=True)
        if self.channel is not None:
            await self.channel.close()
        self.channel = self.probing = None


class OpenAIServing:
    def __init__(
        self,
        draft: LanguageModel,
        device,
        t_draft_s: float,
        timer: PreciseTimer,
        token: str | None,
        out_dir: Path,
        sidecar: dict,
        tokenizer,
        model_name: str,
        runs_running: Callable[[], int],
    ) -> None:
        self.draft, self.device, self.t_draft_s, self.timer = draft, device, t_draft_s, timer
        self.token, self.out_dir, self.sidecar = token, out_dir, sidecar
        self.tokenizer = tokenizer
        self.default_model = model_name
        self.runs_running = runs_running
        limit = getattr(tokenizer, "model_max_length", None)
        self.model_context = limit if isinstance(limit, int) and limit < 1 << 40 else math.inf
        self.serving: _Serving | None = None
        self.active = 0  # requests decoding now
        self.waiting = 0  # admitted, waiting for a decoding slot
        self.done = 0  # requests ended, whatever the end
        self._slots: asyncio.Semaphore | None = None

    @property
    def config(self) -> ServeConfig | None:
        return self.serving.config if self.serving else None

    @property
    def model(self) -> str:
        return (self.config.model if self.config else "") or self.default_model

    def folder_of(self, run_id: str) -> Path | None:
        return self.serving.writer.folder if self.serving and self.serving.config.run_id == run_id else None

    def status(self) -> dict:
        return {
            "settings": asdict(self.config) if self.config else None,
            "model": self.model,
            "folder": str(self.serving.writer.folder) if self.serving else None,
            "active": self.active,
            "waiting": self.waiting,
            "done": self.done,
            "link": (self.serving.channel.closed_reason or "up") if self.serving and self.serving.channel else None,
        }

    async def configure(self, config: ServeConfig) -> None:
        """New settings: a new run folder for the rows (RuntimeError if it exists, or while requests
        run)."""
        if self.active or self.waiting:
            raise RuntimeError(
                f"{self.active + self.waiting} requests are being served: change the settings when they are done"
            )
        folder = self.out_dir / config.run_id
        if folder.exists():
            raise RuntimeError(f"run_id {config.run_id!r} exists (its rows are never overwritten): pick another")
        old, self.serving = (
            self.serving,
            _Serving(
                config,
                TraceWriter(
                    folder, {"openai": asdict(config), "backend": self.sidecar, "t_draft_edge_s": self.t_draft_s}
                ),
            ),
        )
        self._slots = asyncio.Semaphore(config.max_concurrent)
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self.serving is not None:
            await self.serving.close()

    def check_model(self, model: str) -> None:
        if model != self.model:
            raise ApiError(
                404,
                f"the model {model!r} does not exist: this edge serves {self.model!r}",
                param="model",
                code="model_not_found",
            )

    async def generate(
        self, request: GenerateRequest, prompt: list[int], t_start_s: float, request_id: str = ""
    ) -> Generation:
        """Admit, connect, check the request against the context; then it decodes. Raises
        ApiError: 429 queue full, 503 no settings or verifier unreachable, 400/422 out of range."""
        serving = self.serving
        if serving is None:
            raise unavailable(
                'this edge has no serving settings: PUT /openai {"verifier_url": ...} or start it with --openai-json',
                "not_configured",
            )
        config = serving.config
        if self.active + self.waiting >= config.max_concurrent + config.max_queue:
            raise ApiError(
                429,
                f"the edge's admission queue is full ({self.active} decoding, {self.waiting} "
                f"waiting; max_concurrent {config.max_concurrent}, max_queue {config.max_queue})",
                "rate_limit_error",
                None,
                "queue_full",
            )
        self.waiting += 1
        try:
            await self.slots().acquire()
        finally:
            self.waiting -= 1
        try:
            channel = await self._channel(serving)
            return Generation(
                self,
                serving,
                channel,
                self._run_config(serving, request, prompt, channel),
                request,
                t_start_s,
                request_id,
            )
        except BaseException:
            self.slots().release()
            raise

    def slots(self) -> asyncio.Semaphore:
        """The decoding slots (max_concurrent; made when the API is configured)."""
        if self._slots is None:
            raise ApiError(503, "the OpenAI-compatible API is not configured", "not_configured")
        return self._slots

    def _run_config(
        self, serving: _Serving, request: GenerateRequest, prompt: list[int], channel: VerifierChannel
    ) -> RunConfig:
        config, welcome = serving.config, channel.welcomed()
        gamma = request.gamma or config.gamma
        if gamma > welcome.max_gamma:
            raise ApiError(
                422,
                f"dsd.gamma: {gamma} is over the verifier's max_gamma {welcome.max_gamma}",
                param="dsd.gamma",
                code="invalid_value",
            )
        # the model's positions hold the prompt, the output and a block of gamma drafts past it
        context = min(welcome.max_tokens_per_session, self.model_context - gamma)
        param = "messages" if request.kind == "chat" else "prompt"
        if len(prompt) >= context:
            raise ApiError(
                400,
                f"the prompt is {len(prompt)} tokens; this edge's context leaves room for "
                f"{context} tokens at gamma {gamma}",
                param=param,
                code="context_length_exceeded",
            )
        max_tokens = request.max_tokens or min(config.default_max_tokens, context - len(prompt))
        if len(prompt) + max_tokens > context:
            raise ApiError(
                400,
                f"the prompt ({len(prompt)} tokens) and max_tokens ({max_tokens}) exceed this "
                f"edge's context: room for {context} tokens at gamma {gamma}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return RunConfig(
            run_id=config.run_id,
            client_id=config.client_id,
            mode=request.mode or config.mode,
            gamma=gamma,
            prompts=(tuple(prompt),),
            max_new_tokens=int(max_tokens),
            verifier_url=config.verifier_url,
            max_in_flight=config.max_in_flight,
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            app_delay_ms=config.app_delay_ms,
            stop_at_eos=not request.ignore_eos,
            probe_count=0,
            request_timeout_s=config.request_timeout_s,
            transport=config.transport,
            tcp_rto_max_ms=config.tcp_rto_max_ms,
        )

    async def _channel(self, serving: _Serving) -> VerifierChannel:
        """The settings' channel to the verifier, opened again if it is down."""
        async with serving.lock:
            if serving.channel is not None and not serving.channel.closed_reason:
                return serving.channel
            await serving.drop_channel()
            config = serving.config
            channel = VerifierChannel(
                ws_url(config.verifier_url), config.app_delay_ms / 1000, self.timer, self.token, config.transport
            )
            channel.rto_max_ms = config.tcp_rto_max_ms
            channel.alone = lambda: self.active + self.runs_running() == 1
            try:
                welcome = await channel.connect(config.client_id, CONNECT_TIMEOUT_S)
            except (RunError, OSError, TimeoutError, aiohttp.ClientError) as exc:
                await channel.close()
                raise unavailable(
                    f"the verifier at {config.verifier_url} is unreachable: {exc}", "verifier_unreachable"
                ) from None
            if welcome.vocab_size != self.draft.vocab_size:
                await channel.close()
                raise unavailable(
                    f"the verifier's vocabulary ({welcome.vocab_size}) is not the draft's "
                    f"({self.draft.vocab_size}): it serves another pair",
                    "wrong_pair",
                )
            serving.channel = channel
            await channel.probe_ms()  # the rows' rtt_probe_ms from the first request on
            if config.probe_interval_ms > 0:
                serving.probing = asyncio.create_task(probe_loop(channel, config.probe_interval_ms / 1000))
                serving.probing.add_done_callback(_quiet)
            return channel


def _quiet(task: asyncio.Task) -> None:
    """A probe loop ends with its channel; what ended it is in the channel's closed_reason."""
    if not task.cancelled():
        task.exception()


class Generation:
    """One admitted request: ``tokens()`` yields its committed tokens as they arrive (a list per
    arrival); ``close(reason)`` ends it, early if it still runs (why: the row's gave_up), writes
    its row and frees its slot. Always close it."""

    def __init__(
        self,
        owner: OpenAIServing,
        serving: _Serving,
        channel: VerifierChannel,
        config: RunConfig,
        request: GenerateRequest,
        t_start_s: float,
        request_id: str,
    ) -> None:
        self.owner, self.serving, self.channel = owner, serving, channel
        self.index = next(serving.indices)
        seed = request.seed if request.seed is not None else secrets.randbelow(1 << 31)
        eos = channel.welcomed().eos_token_id if config.stop_at_eos else None
        self.record = Request(
            self.index,
            list(config.prompts[0]),
            config,
            StopRule(config.max_new_tokens, eos),
            t_start_s=t_start_s,
            seed=seed,
            request_id=request_id,
        )
        self.eos_token_id = channel.welcomed().eos_token_id
        self._arrivals: asyncio.Queue = asyncio.Queue()
        self.record.on_tokens = lambda _t, tokens: self._arrivals.put_nowait(list(tokens))
        self.tokens: list[int] = []
        self.error: ApiError | None = None
        self._closed = False
        owner.active += 1
        # two users of the device: its decoding, and its stream, which writes between passes; so no
        # pass runs on the event loop's own thread (DraftDevice's shortcut for a lone run), where it
        # would hold a chunk back for a whole draft block
        owner.device.runs += 2
        client = Client(config, channel, owner.draft, owner.device, owner.t_draft_s, serving.writer, serving.clock)
        self.task = asyncio.create_task(self._decode(client), name=f"openai-{config.run_id}-{self.index}")

    @property
    def mode(self) -> str:
        return self.record.config.mode

    @property
    def gamma(self) -> int:
        return self.record.config.gamma

    @property
    def finish_reason(self) -> str:
        return (
            "stop"
            if self.tokens and self.tokens[-1] == self.eos_token_id and self.record.stop.eos_token_id is not None
            else "length"
        )

    async def _decode(self, client: Client) -> None:
        config = self.record.config
        try:
            async with asyncio.timeout(config.request_timeout_s):
                await (client.dsd(self.record) if config.mode in edge_modes() else client.on_server(self.record))
        except TimeoutError:
            self.error = ApiError(
                504 if not self.tokens else 500,
                f"not done within the edge's request_timeout_s {config.request_timeout_s:g}",
                "server_error",
                None,
                "timeout",
            )
        except RunError as exc:
            self.error = _api_error(str(exc), self.channel)
        except Exception as exc:  # a fault of ours: the request ends, the edge serves on
            log.exception("openai request %s/%s failed", config.run_id, self.index)
            self.error = ApiError(500, f"{type(exc).__name__}: {exc}", "server_error", None, "internal")
        finally:
            self._arrivals.put_nowait(None)

    async def arrivals(self) -> AsyncIterator[list[int]]:
        """The committed tokens of each arrival; raises the request's ApiError if it failed."""
        while (tokens := await self._arrivals.get()) is not None:
            self.tokens += tokens
            yield tokens
        if self.error is not None:
            raise self.error

    async def close(self, reason: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        record, owner = self.record, self.owner
        try:
            if not self.task.done():
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
                record.gave_up = reason or "ended before its end"
            if record.tokens is None and record.session is not None:  # its session was still open
                await self.channel.abandon(record.session)
            # after any draft pass still running on the device (one worker: in order)
            await owner.device.run(lambda: owner.draft.release(f"{record.config.run_id}/{record.index}"), 0.0)
            self._write_row()
        finally:
            owner.device.runs -= 2
            owner.active -= 1
            owner.done += 1
            owner.slots().release()

    def _write_row(self) -> None:
        record, serving = self.record, self.serving
        if self.error is not None and not record.gave_up:
            run = Run(record.config, serving.writer.folder)
            run.error, run.requests_done = f"{self.error.code}: {self.error.message}", self.index
            error_rows(serving.writer, self.channel, run, record)
        else:
            request_row(serving.writer, serving.clock, self.channel, record)


def _api_error(message: str, channel: VerifierChannel) -> ApiError:
    """A RunError of the edge's client as the API answers it: by the verifier's error code."""
    if channel.closed_reason:
        return unavailable(f"the link to the verifier went down: {channel.closed_reason}", "verifier_unreachable")
    match = _VERIFIER_CODE.search(message)
    status, type_ = _STATUS_OF_CODE.get(match.group(1) if match else "", (500, "server_error"))
    return ApiError(status, message, type_, None, match.group(1) if match else "internal")
