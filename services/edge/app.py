"""The edge's HTTP control API (``Edge``): runs started, read back and stopped, the link probed
and shaped."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from pathlib import Path

from aiohttp import web

from dsd.backends.protocol import LanguageModel
from dsd.controller.interface import Decision, RequestController, RequestOutcome, ShadowDraft, request_cycle
from dsd.modes import edge_modes
from dsd.speculation.stopping import StopRule
from services import access, frames, spinwait
from services.shaping_api import ShapingApi
from services.compute import EmulatedDevice, PreciseTimer, ThreadDevice
from services.traces import EdgeClock, TraceWriter
from services.edge.client import Client
from services.edge.openai_api import routes
from services.edge.openai_api.serving import OpenAIServing
from services.edge.runs import Run, error_rows, probe_loop, request_row
from services.edge.config import Request, RunConfig, RunError, ws_url
from services.edge.verifier_channel import VerifierChannel, probe_for_request_s


log = logging.getLogger("services.edge")


class Edge:
    def __init__(
        self,
        draft: LanguageModel,
        emulated: bool,
        t_draft_s: float,
        out_dir: Path,
        backend_info: dict,
        token: str | None = None,
        shape_link: bool = False,
        spin: spinwait.SpinConfig = spinwait.SpinConfig(),
        tokenizer=None,
        model_name: str = "",
    ) -> None:
        self.draft = draft
        self.spin = spin  # services.spinwait: the loop polls for a lone run's verdicts
        self.shaping = ShapingApi(shape_link, self.probe_rtts)  # GET/PUT/DELETE /link, POST /link/probe
        self.token = token  # sent to the verifier, and required on /runs
        self.t_draft_s = t_draft_s
        self.out_dir = out_dir
        self.backend_info = backend_info
        self.runs: dict[str, Run] = {}
        self._thread_device = None if emulated else ThreadDevice()
        self._timer = PreciseTimer()  # every run's emulated device waits on it
        self.tokenizer, self.model_name = tokenizer, model_name  # the OpenAI-compatible API's (None: none)
        self.openai: OpenAIServing | None = None

    def app(self) -> web.Application:
        @web.middleware
        async def require_token(request: web.Request, handler):
            """A run names the verifier this edge connects to: only a holder of the token may post
            or read one. /health stays open for readiness polls; /v1/ checks the token itself, answering
            in the OpenAI-compatible API's own error shape."""
            if (
                request.path != "/health"
                and not request.path.startswith("/v1/")
                and (refused := access.refusal(request, self.token, log)) is not None
            ):
                return refused
            return await handler(request)

        app = web.Application(middlewares=[require_token])
        app.router.add_get("/health", self.health)
        app.router.add_post("/runs", self.post_run)
        app.router.add_get("/runs/{run_id}", self.get_run)
        app.router.add_get("/runs/{run_id}/{name:(rounds|requests)\\.csv}", self.get_csv)
        self.shaping.add_routes(app)
        if self.tokenizer is not None:
            self._add_openai(app)

        async def stop(_app):
            tasks = [r.task for r in self.runs.values() if r.task and not r.task.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.openai is not None:
                await self.openai.close()

        app.on_cleanup.append(stop)
        return app

    def _add_openai(self, app: web.Application) -> None:
        """/v1/ (the OpenAI-compatible API) and GET/PUT /openai (its settings), decoding on this
        edge's draft and device."""
        self.openai = openai = OpenAIServing(
            self.draft,
            self._thread_device or EmulatedDevice(self._timer),
            self.t_draft_s,
            self._timer,
            self.token,
            self.out_dir,
            self.backend_info,
            self.tokenizer,
            self.model_name,
            lambda: sum(r.status == "running" for r in self.runs.values()),
        )
        routes.add_routes(app, openai, self.token)

    async def health(self, _request: web.Request) -> web.Response:
        statuses = [r.status for r in self.runs.values()]
        return web.json_response(
            {
                "status": "ok",
                "role": "edge",
                "draft": self.draft.name,
                "runs": {s: statuses.count(s) for s in set(statuses)},
            }
        )

    async def probe_rtts(self, verifier_url: str, count: int, interval_s: float, app_delay_ms: float) -> list[float]:
        """RTTs (ms) of `count` Ping/Pong probes on a WebSocket of their own, as a run measures."""
        channel = VerifierChannel(
            ws_url(verifier_url), app_delay_ms / 1000, self._timer, self.token, frames.DEFAULT_TRANSPORT
        )
        try:
            await channel.connect("link-probe")
            rtts_ms = []
            for i in range(count):
                if i:
                    await asyncio.sleep(interval_s)
                rtts_ms.append(await channel.probe_ms())
            return rtts_ms
        finally:
            await channel.close()

    async def post_run(self, request: web.Request) -> web.Response:
        try:
            config = RunConfig.from_json(await request.json())
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        folder = self.out_dir / config.run_id
        if config.run_id in self.runs or folder.exists():
            return web.json_response({"error": f"run_id {config.run_id!r} exists"}, status=409)
        run = Run(config, folder)
        self.runs[config.run_id] = run
        run.task = asyncio.create_task(self._run(run), name=f"run-{config.run_id}")
        return web.json_response(run.summary(), status=201)

    async def get_run(self, request: web.Request) -> web.Response:
        run = self.runs.get(request.match_info["run_id"])
        if run is None:
            return web.json_response({"error": "no such run"}, status=404)
        selector = spinwait.selector_of()  # what the loop's polling did so far (the process's)
        return web.json_response({**run.summary(), "spin": selector.stats() if selector else asdict(self.spin)})

    async def get_csv(self, request: web.Request) -> web.StreamResponse:
        run = self.runs.get(request.match_info["run_id"])
        folder = run.folder if run else self.openai and self.openai.folder_of(request.match_info["run_id"])
        path = folder / request.match_info["name"] if folder else None
        if path is None or not path.is_file():
            return web.json_response({"error": "no such run"}, status=404)
        return web.Response(body=path.read_bytes(), content_type="text/csv")

    async def _run(self, run: Run) -> None:
        config = run.config
        clock = EdgeClock()
        writer = TraceWriter(
            run.folder,
            {
                "run": asdict(config),
                "backend": self.backend_info,
                "t_draft_edge_s": self.t_draft_s,
                "spin": asdict(self.spin),
            },
        )
        channel = VerifierChannel(config.ws_url, config.app_delay_ms / 1000, self._timer, self.token, config.transport)
        channel.rto_max_ms = config.tcp_rto_max_ms
        channel.alone = lambda: sum(r.status == "running" for r in self.runs.values()) == 1
        device = self._thread_device or EmulatedDevice(self._timer)
        request = None
        probing = None
        device.runs += 1
        try:
            welcome = await channel.connect(config.client_id)
            if welcome.vocab_size != self.draft.vocab_size:
                raise RunError(f"draft vocabulary {self.draft.vocab_size} != target vocabulary {welcome.vocab_size}")
            for _ in range(config.probe_count):
                run.rtt_before_ms.append(await channel.probe_ms())
            if config.start_at_unix_s:
                await asyncio.sleep(max(0.0, config.start_at_unix_s - time.time()))
            probing = asyncio.create_task(probe_loop(channel, config.probe_interval_ms / 1000))
            client = Client(config, channel, self.draft, device, self.t_draft_s, writer, clock)
            stop = StopRule(config.max_new_tokens, welcome.eos_token_id if config.stop_at_eos else None)
            for index, prompt in enumerate(config.prompts):
                request = Request(index, list(prompt), config, stop, t_start_s=time.perf_counter())
                await self._within_deadline(client, channel, request)
                request_row(writer, clock, channel, request)
                run.requests_done += 1
                run.tokens += request.n_emitted if request.gave_up else len(request.tokens or ())
                request = None
            run.status = "done"
        except Exception as exc:  # any failure ends the run and is recorded as rows
            log.exception("run %s failed", config.run_id)
            run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"
            error_rows(writer, channel, run, request)
        finally:
            if probing is not None:
                probing.cancel()
                await asyncio.gather(probing, return_exceptions=True)
            device.runs -= 1
            await channel.close()
            writer.close()

    async def _within_deadline(self, client: Client, channel: VerifierChannel, request: Request) -> None:
        """Past request_deadline_s a request is given up (its row says why) and the run goes on;
        past request_timeout_s the run fails."""
        config = request.config
        deadline = asyncio.timeout(config.request_deadline_s or config.request_timeout_s)
        try:
            async with deadline:
                await self._dispatch(client, channel, request)
        except TimeoutError:
            if not deadline.expired():
                raise
            if not config.request_deadline_s:
                raise RunError(
                    f"request {request.index}: not done within request_timeout_s {config.request_timeout_s}"
                ) from None
            if request.tokens is None:  # else only the session's Close was still on its way
                request.gave_up = (
                    f"deadline: not done within request_deadline_s "
                    f"{config.request_deadline_s:g} ({request.n_emitted} tokens received, "
                    f"link {channel.closed_reason or 'up'})"
                )
            if request.session is not None:
                await channel.abandon(request.session)

    @staticmethod
    async def _dispatch(client: Client, channel: VerifierChannel, request: Request) -> None:
        """One request in the run's mode; with an adaptive controller, in the mode it picks for
        this request at the link's last probed RTT (it then sees how the request went)."""
        config = request.config
        if config.controller == "static":
            await (client.dsd(request) if config.mode in edge_modes() else client.on_server(request))
            return
        controller = client.controller
        if not isinstance(controller, RequestController):
            raise RunError(f"controller {config.controller!r} does not plan requests")
        rtt_s = probe_for_request_s(channel.rtt_probe_ms, channel.rtt_probe_sent_s, client.last_request_end_s)

        async def run(decision: Decision) -> RequestOutcome:
            if decision.mode in edge_modes():
                await client.dsd(request)
            else:
                await client.on_server(request, (decision.gamma, decision.mode))
            client.last_request_end_s = request.t_last_s or client.last_request_end_s
            return RequestOutcome(
                request.tokens or [],
                _since_start_s(request, request.t_last_s),
                _since_start_s(request, request.t_first_s),
                request.first_emitted,
            )

        shadow = (
            ShadowDraft(client.draft, f"{config.run_id}/{request.index}", request.prompt)
            if config.temperature == 0
            else None
        )
        await request_cycle(controller, rtt_s, run, shadow)


def _since_start_s(request: Request, t_s: float | None) -> float | None:
    return None if t_s is None else t_s - request.t_start_s
