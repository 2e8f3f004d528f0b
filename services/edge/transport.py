"""dsd.drive.driver's transport and device on the edge: a DSD session on the verifier channel
(``SessionTransport``) and the draft device (``DraftDevice``, emulated or real)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from dsd.drive.arrivals import (
    AcknowledgedArrival,
    Arrival,
    ServedArrival,
    ServerRound,
    VerdictArrival,
    WithdrawnArrival,
)
from dsd.backends.protocol import SamplingParams, Verdict
from dsd.features import FeatureBlock, decode as decode_features
from dsd.modes import get_mode
from services import spinwait, wire
from services.compute import ThreadDevice
from services.edge.config import Request, RunError
from services.edge.verifier_channel import VerifierChannel


class SessionTransport:
    """A DSD session on the verifier channel, as dsd.drive.driver's transport: blocks go out as Verify
    frames, Verified replies come back as arrivals; a hand-over goes out as a Generate with
    max_tokens on the open session, its Tokens come back as server rounds. The draft device may
    start a pass once the last message it depends on had arrived (``ready_s``)."""

    hands_over = True
    withdraws = True

    def __init__(
        self, channel: VerifierChannel, session: int, inbox: asyncio.Queue, request: Request, sampling: SamplingParams
    ) -> None:
        self.channel, self.session, self.inbox, self.request, self.sampling = channel, session, inbox, request, sampling
        self.ready_s = time.perf_counter()
        self.opened = False  # the verifier's Opened is in
        self.in_flight = 0  # blocks sent and not yet answered
        # services.spinwait (None: the loop never polls, and nothing below is tracked)
        self._selector = spinwait.selector_of()
        self._sent_s: list[float] = []  # when each block in flight went out, oldest first
        self._segments_sent_s: dict[int, float] = {}  # a hand-over Generate's seq -> its send, until Queued
        self._segments: list[int] = []  # the seqs of the segments asked, oldest first
        self._withdrawing = False  # a Withdraw waits for its Withdrawn

    @property
    def quiet(self) -> bool:
        """Nothing can arrive for this session or its channel until it sends again: its Opened and
        every verdict and segment acknowledgement are in, and no ping waits for its answer."""
        return (
            self.opened
            and self.in_flight == 0
            and not self._segments_sent_s
            and not self._withdrawing
            and not self.channel.awaiting_reply
        )

    def prepare(self, proposals) -> list[bytes]:
        return [
            wire.encode(_verify_message(self.channel.next_seq(), self.session, p, self.sampling)) for p in proposals
        ]

    async def send(self, frames: list[bytes], after=None) -> list[float]:
        self.in_flight += len(frames)
        sent = [await self.channel.send_encoded(data) for data in frames]
        if self._selector is not None:
            self._sent_s += sent
            expected_s = self.channel.verdict_gaps.expected_s()
            if (
                expected_s is not None
                and self.in_flight == 1
                and self.channel.alone()
                and not self.channel.shared_lately()
            ):
                self._selector.expect(sent[-1] + expected_s)  # a sync block: poll for its verdict when due
        return sent

    async def generate(self, mode: str, gamma: int, max_tokens: int, after=None) -> float:
        seq = self.channel.next_seq()
        t_send_s = await self.channel.send(
            wire.Generate(seq, self.session, mode, gamma if get_mode(mode).speculative else 0, max_tokens)
        )
        self._segments_sent_s[seq] = t_send_s
        self._segments.append(seq)
        return t_send_s

    async def withdraw(self, drop: int, after=None) -> float:
        """Ask the verifier to drop the last ``drop`` segments asked, those of them not yet
        started (answered by a Withdrawn)."""
        self._withdrawing = True
        keep_through = self._segments[-drop - 1] if len(self._segments) > drop else -1
        return await self.channel.send(wire.Withdraw(self.channel.next_seq(), self.session, keep_through))

    async def poll(self) -> list[Arrival]:
        arrivals = []
        while not self.inbox.empty():
            arrival = self.arrival(*self.inbox.get_nowait())
            if arrival is not None:
                arrivals.append(arrival)
        return arrivals

    async def wait(self) -> Arrival:
        while True:
            arrival = self.arrival(*await self.inbox.get())
            if arrival is not None:
                return arrival

    def arrival(self, t_receive_s: float, m) -> Arrival | None:
        """The verdict a message carries (None for the session's Opened); a verifier error ends
        the request."""
        if isinstance(m, wire.Queued):  # a segment's acknowledgement: the link's round trip
            t_send_s = self._segments_sent_s.pop(m.seq, None)  # (no draft pass waits for it)
            if t_send_s is None:
                raise RunError(f"request {self.request.index}: Queued for seq {m.seq}, no segment sent as it")
            return AcknowledgedArrival(max(t_receive_s - t_send_s - m.held_s, 0.0), t_receive_s, message=m)
        if isinstance(m, wire.Withdrawn):  # the last segments asked, dropped before they started
            if not self._withdrawing or m.segments != self._segments[len(self._segments) - len(m.segments) :]:
                raise RunError(
                    f"request {self.request.index}: Withdrawn {m.segments} is not the tail of the "
                    f"segments asked ({self._segments})"
                )
            self._withdrawing = False
            del self._segments[len(self._segments) - len(m.segments) :]
            return WithdrawnArrival(len(m.segments), t_receive_s, message=m)
        self.ready_s = max(self.ready_s, t_receive_s)
        if isinstance(m, wire.Error):
            raise RunError(f"request {self.request.index}: verifier error {m.code} (field {m.field}): {m.message}")
        if isinstance(m, wire.Opened):
            self.opened = True
            return None
        if isinstance(m, wire.Tokens):
            return ServedArrival(
                ServerRound(m.proposed, m.accepted, tuple(m.tokens), m.done, self.features(m.features)),
                t_receive_s,
                m.queue_s,
                m.compute_s,
                m,
            )
        if not isinstance(m, wire.Verified):
            raise RunError(f"unexpected {type(m).__name__} in a DSD session")
        self.in_flight -= 1
        if self._selector is not None:
            if self._sent_s:
                self.channel.verdict_gaps.add(t_receive_s - self._sent_s.pop(0))
            if not m.stale:
                self.channel.note_verdict(m.queue_s, m.batch_size)
            self._selector.cancel()
        return VerdictArrival(
            Verdict(m.start_pos, m.proposed, m.accepted, m.next_token, m.stale, self.features(m.features)),
            t_receive_s,
            m.queue_s,
            m.compute_s,
            m,
        )

    def features(self, data: bytes | None) -> FeatureBlock | None:
        """A reply's features field as a FeatureBlock (None when it carries none)."""
        if data is None:
            return None
        try:
            return decode_features(data)[0]
        except ValueError as exc:
            raise RunError(f"request {self.request.index}: verifier sent unreadable features: {exc}") from None


Result = TypeVar("Result")


class DraftDevice:
    """The edge's device as dsd.drive.driver's device: emulated (charged t_draft_s a step, starting when
    its input was ready) or real (the device thread). A block is one pass: one wait instead of a
    wake-up per step, and its frames are built while that time runs.

    A real pass runs on the event loop's own thread when nothing can arrive meanwhile (the only
    run on the device, and its transport quiet: a sync edge's block after its verdict), which
    saves the two thread wake-ups of the hand-off (more than the Python work around the pass)."""

    def __init__(self, device, t_draft_s: float, transport: SessionTransport) -> None:
        self.device, self.t_draft_s, self.transport = device, t_draft_s, transport

    async def draft(self, work: Callable[[], None], n_steps: float, then: Callable[[], Result]) -> tuple[Result, float]:
        if isinstance(self.device, ThreadDevice) and self.device.runs == 1 and self.transport.quiet:
            result, start_s, _ = self.device.run_here(work, lambda *_: then())
            return result, start_s
        result, start_s, _ = await self.device.run(
            work, n_steps * self.t_draft_s, self.transport.ready_s, lambda *_: then()
        )
        return result, start_s


def _verify_message(seq: int, session: int, proposal, sampling: SamplingParams) -> wire.Verify:
    dense = ids = values = None
    if proposal.draft_probs is not None:
        q = proposal.draft_probs.float()  # [gamma, vocab]
        if wire.probs_encoding(sampling.temperature, sampling.top_k, sampling.top_p) == "sparse":
            ids = [row.nonzero().flatten().tolist() for row in q]
            values = [q[i, row].tolist() for i, row in enumerate(ids)]
        else:
            dense = q.contiguous().numpy().astype("<f4").tobytes()
    return wire.Verify(
        seq, session, proposal.start_pos, proposal.base_digest, list(proposal.draft_tokens), dense, ids, values
    )
