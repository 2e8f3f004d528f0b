"""A client's connection and its sessions (``Connection``, ``Served``): what each holds, its
sends, and the bookkeeping of requests in flight and withdrawn segments."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field

import torch

from dsd.features import encode as encode_features
from dsd.drive.verifier_session import VerifierSession
from services import frames, spinwait, wire
from services.verifier.limits import INFLIGHT


@dataclass
class Served:
    """One session: the target's side of one request, and the queue of its messages."""

    number: int  # unique in this process: the models' sequence id
    conn: Connection
    session: int  # the client's id for it
    state: VerifierSession
    tokens: int  # prompt + max_new_tokens: what it counts against its connection
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)  # (t_arrival_s, message or None)
    task: asyncio.Task | None = None  # kept here: the event loop holds tasks only weakly
    busy: bool = False
    closed: bool = False
    feature_dtype: str | None = None  # the Open's: the target's features go out in it (dsd.features)
    # a sampled Verify's q [gamma, vocab], read and checked on its arrival, by id() of the message
    # (alive in the inbox until served): its pass takes it from here
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)

    def features(self, block) -> bytes | None:
        """A FeatureBlock as the replies carry it, if the session asked for features."""
        return None if self.feature_dtype is None or block is None else encode_features(block, self.feature_dtype)

    @property
    def seq_id(self) -> str:
        return f"v{self.number}"


class Connection:
    def __init__(self, number: int, channel, transport: str = "ws") -> None:
        self.number = number
        # the WebSocket (aiohttp's) or a frames.FrameProtocol: both have .closed and send_bytes()
        self.channel = channel
        self.transport = transport
        self.sessions: dict[int, Served] = {}  # open, by the client's id
        self.sessions_live = 0  # not yet freed (closing ones too)
        self.tokens_live = 0  # their Served.tokens
        self.inflight = 0  # INFLIGHT requests queued or being served
        self.watched: socket.socket | None = None  # services.verifier.frame_stamps's handle on its socket
        self.held_since_s: float | None = None  # bytes came in during a pass on the loop's thread
        self._unhold_due = False
        self.held: dict[int, float] = {}  # seq -> arrival of a request read late that way
        # A request came in during a pass on the loop's thread (a pipelined edge's next block):
        # its passes go to the device thread from then on, so that it is read when it arrives.
        self.overlapped = False
        # services.spinwait: when its last verdict went out, and the gaps to the next block
        self.replied_s: float | None = None
        self.block_gaps = spinwait.Gaps()
        self.last_message_s = 0.0  # loop.time() of its last frame (the frame transport's idle check)
        self.sending: set[asyncio.Task] = set()  # sends started by send_now that wait for the kernel

    @property
    def busy(self) -> bool:
        return any(s.busy or not s.inbox.empty() for s in self.sessions.values())

    def stamp(self) -> tuple[float, float]:
        """(t_arrival_s, held_s) of a frame just read. After a pass on the loop's thread, every
        frame read before the loop turns (one read from the socket: what came in during the pass)
        arrived when the first waiting byte did, and was held unread for held_s."""
        t_read_s = time.perf_counter()
        if self.held_since_s is None:
            return t_read_s, 0.0
        if not self._unhold_due:
            self._unhold_due = True
            asyncio.get_running_loop().call_soon(self._unhold)
        return self.held_since_s, t_read_s - self.held_since_s

    def _unhold(self) -> None:
        self.held_since_s, self._unhold_due = None, False

    async def send(self, message) -> None:
        await self.send_encoded(wire.encode(message))

    async def send_encoded(self, data: bytes) -> None:
        if self.channel.closed:
            return
        try:
            await self.channel.send_bytes(data)
        except (ConnectionError, RuntimeError):
            pass  # the client went away; its sessions are being dropped

    def send_now(self, data: bytes) -> None:
        """send_encoded from synchronous code (a reply written from inside its pass on the loop's
        thread): the bytes are written before this returns; a send that then waits for room in
        the kernel's buffer finishes in a task (held here: the loop holds tasks only weakly)."""
        task = frames.start_now(self.send_encoded(data))
        if task is not None:
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)

    def send_if_on_loop(self, data: bytes, on_loop: bool) -> bytes | None:
        """A pass's encoded reply (its prepare): after a pass on the loop's own thread sent at once,
        before the scheduler's bookkeeping (None: nothing left for the caller to send); else
        returned for the caller to send."""
        if not on_loop:
            return data
        self.send_now(data)
        return None


def _withdraw(served: Served, keep_through: int) -> list[int]:
    """Drop the session's queued hand-over segments (Generates with max_tokens; the one being
    served is not queued) asked after seq ``keep_through`` and return their seqs; everything else
    stays queued, in order."""
    kept, dropped = [], []
    while not served.inbox.empty():
        item = served.inbox.get_nowait()
        m = item[1]
        if isinstance(m, wire.Generate) and m.max_tokens is not None and m.seq > keep_through:
            dropped.append(m.seq)
            _settle(served.conn, m)
        else:
            kept.append(item)
    for item in kept:
        served.inbox.put_nowait(item)
    return dropped


def _settle(conn: Connection, m) -> None:
    """A request counted by _admit is done (answered, or never to be served)."""
    if isinstance(m, INFLIGHT):
        conn.inflight -= 1
        conn.held.pop(m.seq, None)
