"""One request in each mode (``Client``): DSD through dsd.drive.driver, cloud AR and co-located SD
asked of the verifier, each recorded as trace rows."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from dsd.backends.protocol import LanguageModel, SamplingParams
from dsd.cache.filler import CacheMemory
from dsd.controller.policies import make_controller
from dsd.drive.driver import DrivePorts, DriveRequest, DriverConfig, DsdDriver, Round
from dsd.features import FeatureBlock, TakesFeatures
from dsd.modes import get_mode
from services import wire
from services.traces import EdgeClock, RoundRow, TraceWriter, cache_columns
from services.edge.config import Request, RunConfig, RunError
from services.edge.transport import DraftDevice, SessionTransport
from services.edge.verifier_channel import VerifierChannel


@dataclass(frozen=True)
class EdgeRound:
    """One round as the edge saw it: the verifier's message that answered it (Verified, or Tokens
    of a server round: its proposed, accepted and the server's measures), what it emitted, and the
    edge's times (its clock's seconds; no draft times where the server drafted); ``plan`` (gamma,
    mode) where a controller chose them, ``cache`` the speculation cache's record."""

    index: int
    message: wire.Verified | wire.Tokens
    emitted: int
    stale: bool
    t_send_s: float
    t_receive_s: float
    t_draft_start_s: float | None = None
    t_draft_end_s: float | None = None
    plan: tuple[int, str] | None = None
    cache: object = None


class Client:
    """A run's requests, one after another, over one channel to the verifier."""

    def __init__(
        self,
        config: RunConfig,
        channel: VerifierChannel,
        draft: LanguageModel,
        device,
        t_draft_s: float,
        writer: TraceWriter,
        clock: EdgeClock,
    ) -> None:
        self.config, self.channel, self.draft, self.device = config, channel, draft, device
        self.t_draft_s = t_draft_s
        self.writer, self.clock = writer, clock
        # One controller per run: what it learnt in one request carries over to the next.
        self.controller = make_controller(config.controller_config())
        # ... and what the cached mode's fills learnt (pass times, the ranking's calibration)
        self.cache_memory = CacheMemory()
        self.last_request_end_s: float | None = None  # the previous request's last arrival

    def open_message(self, request: Request, session: int, feature_dtype: str | None = None) -> wire.Open:
        c = self.config
        return wire.Open(
            self.channel.next_seq(),
            session,
            request.prompt,
            c.max_new_tokens,
            c.temperature,
            c.top_k,
            request.sampling_seed,
            c.stop_at_eos,
            c.top_p,
            feature_dtype,
        )

    async def next_message(self, inbox: asyncio.Queue, request: Request):
        """The session's next message (the request's deadline is set once, around it all: a
        timeout per wait cost ~30 us between sending a block and falling idle, every round)."""
        t_receive_s, message = await inbox.get()
        if isinstance(message, wire.Error):
            raise RunError(
                f"request {request.index}: verifier error {message.code} (field {message.field}): {message.message}"
            )
        return t_receive_s, message

    def round_row(self, request: Request, r: EdgeRound) -> None:
        e, c, rtt_probe_ms, m = self.clock.epoch_s, self.config, self.channel.rtt_probe_ms, r.message
        round_gamma, round_mode = r.plan or (None, "")
        self.writer.round(
            lambda: RoundRow(  # built when written: after the next block is out
                run_id=c.run_id,
                client_id=c.client_id,
                mode=c.mode,
                gamma=c.gamma,
                request_index=request.index,
                round_index=r.index,
                proposed=m.proposed,
                accepted=m.accepted,
                emitted=r.emitted,
                stale=r.stale,
                t_draft_start_s=e(r.t_draft_start_s),
                t_draft_end_s=e(r.t_draft_end_s),
                t_send_s=e(r.t_send_s),
                t_receive_s=e(r.t_receive_s),
                server_queue_s=m.queue_s,
                server_compute_s=m.compute_s,
                server_batch_size=m.batch_size,
                rtt_probe_ms=rtt_probe_ms,
                app_delay_ms=c.app_delay_ms,
                round_gamma=round_gamma,
                round_mode=round_mode,
                feature_bytes=len(m.features or b""),
                **cache_columns(r.cache),
            )
        )

    async def close_session(self, session: int, inbox: asyncio.Queue, request: Request, on_message) -> None:
        await self.channel.send(wire.Close(self.channel.next_seq(), session))
        while True:
            t_receive_s, message = await self.next_message(inbox, request)
            if isinstance(message, wire.Closed):
                break
            await on_message(t_receive_s, message)
        self.channel.close_inbox(session)

    async def prefill_features(
        self, inbox: asyncio.Queue, request: Request, transport: SessionTransport
    ) -> FeatureBlock | None:
        """The features of the session's Opened (the prompt's, rows 0..len(prompt) - 2)."""
        t_receive_s, m = await self.next_message(inbox, request)
        if not isinstance(m, wire.Opened):
            raise RunError(f"request {request.index}: expected Opened first, got {type(m).__name__}")
        transport.arrival(t_receive_s, m)
        return transport.features(m.features)

    async def on_server(self, request: Request, plan: tuple[int, str] | None = None) -> None:
        """Cloud AR and co-located SD: the verifier generates; every streamed round is a row.
        ``plan`` (gamma, mode): a controller's choice for this request (default: the run's)."""
        session, inbox = self.channel.open_inbox()
        request.session = session
        gamma, mode = plan or (self.config.gamma, self.config.mode)
        await self.channel.send(self.open_message(request, session))
        t_send_s = await self.channel.send(
            wire.Generate(self.channel.next_seq(), session, mode, gamma if get_mode(mode).speculative else 0)
        )
        tokens: list[int] = []
        while True:
            t_receive_s, m = await self.next_message(inbox, request)
            if isinstance(m, wire.Tokens):
                tokens += m.tokens
                request.emitted(t_receive_s, m.tokens)
                if m.tokens or not m.done:
                    self.round_row(
                        request, EdgeRound(m.round_index, m, len(m.tokens), False, t_send_s, t_receive_s, plan=plan)
                    )
                    request.rounds += 1
                if m.done:
                    break
        request.tokens = tokens

        async def unexpected(_t, message):
            raise RunError(f"unexpected {type(message).__name__} after the stream ended")

        await self.close_session(session, inbox, request, unexpected)

    async def dsd(self, request: Request) -> None:
        """Sync and pipelined DSD: the edge drafts (dsd.drive.driver, on this process's clock and device),
        the verifier verifies."""
        c = self.config
        session, inbox = self.channel.open_inbox()
        request.session = session
        sampling = SamplingParams(c.temperature, c.top_k, request.sampling_seed, c.top_p)
        transport = SessionTransport(self.channel, session, inbox, request, sampling)
        device = DraftDevice(self.device, self.t_draft_s, transport)

        def on_round(r: Round) -> None:
            m = r.arrival.message  # Verified, or Tokens of a hand-over
            stale = isinstance(m, wire.Verified) and m.stale
            request.emitted(r.arrival.t_receive_s, r.emitted)
            self.round_row(
                request,
                EdgeRound(
                    r.index,
                    m,
                    len(r.emitted),
                    stale,
                    r.t_send_s,
                    r.arrival.t_receive_s,
                    r.t_draft_start_s,
                    r.t_draft_end_s,
                    (r.gamma, r.mode),
                    r.cache,
                ),
            )
            request.rounds += 1
            request.stale_rounds += stale

        # A feature draft drafts on the target's features over the prompt: it waits for the Opened
        # that carries them (the prefill and a round trip before the first block).
        takes_features = isinstance(self.draft, TakesFeatures)
        await self.channel.send(self.open_message(request, session, c.feature_dtype if takes_features else None))
        prefill = await self.prefill_features(inbox, request, transport) if takes_features else None
        config = DriverConfig(c.gamma, c.mode, c.max_in_flight, c.gamma_max, cache=c.cache)
        driver = DsdDriver(
            self.draft,
            DriveRequest(f"{c.run_id}/{request.index}", request.prompt, request.stop, sampling, prefill),
            DrivePorts(device, transport, time.perf_counter, on_round),
            config,
            self.controller,
            self.cache_memory,
        )
        try:
            request.tokens = await driver.run()
        except RuntimeError as exc:
            if isinstance(exc, RunError):
                raise
            raise RunError(f"request {request.index}: {exc}") from None

        async def drain(t_receive_s, m) -> None:  # stale answers to blocks sent before the end
            arrival = transport.arrival(t_receive_s, m)
            if arrival is not None:
                await driver.handle(arrival)

        await self.close_session(session, inbox, request, drain)
