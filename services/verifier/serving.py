"""One session's requests served in order: prefill, verification, generation on the server
(part of ``Verifier``, services/verifier/server.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from dsd.backends.protocol import Proposal
from dsd.speculation.drafting import DraftJob, begin_request
from dsd.features import hand_features
from dsd.modes import AR, NOWHERE, SERVER, get_mode
from services import wire
import services.verifier.frame_stamps as frame_stamps
from services.verifier.scheduler import PassTiming
from services.verifier.connection import Connection, Served, _settle
from services.verifier.state import VerifierState


log = logging.getLogger("services.verifier")


class VerifierServing(VerifierState):
    """Serving one session's messages through the scheduler."""

    async def _serve(self, served: Served) -> None:
        try:
            while True:
                t_arrival_s, m = await served.inbox.get()
                if m is None or served.closed:
                    _settle(served.conn, m)
                    break
                if not await self._serve_one(served, m, t_arrival_s):
                    break
        finally:
            served.closed = True
            while not served.inbox.empty():  # requests it will never serve leave the count
                _settle(served.conn, served.inbox.get_nowait()[1])
            if served.conn.sessions.get(served.session) is served:
                del served.conn.sessions[served.session]
            self.target.release(served.seq_id)
            self.draft.release(served.seq_id)
            self.sessions_open -= 1
            served.conn.sessions_live -= 1
            served.conn.tokens_live -= served.tokens

    async def _serve_one(self, served: Served, m, t_arrival_s: float) -> bool:
        """One request of the session; False if the session ends with it (a Close, or a failure)."""
        served.busy = True
        try:
            if isinstance(m, wire.Open):
                await self._prefill(served, m, t_arrival_s)
            elif isinstance(m, wire.Verify):
                await self._verify(served, m, t_arrival_s)
            elif isinstance(m, wire.Generate):
                await self._generate(served, m, t_arrival_s)
            else:
                await served.conn.send(wire.Closed(m.seq, m.session, len(served.state.generated)))
                return False
        except wire.WireError as error:
            error.seq, error.session = m.seq, served.session
            await self._reply_error(served.conn, error)
        except Exception as exc:  # a bug or a model failure: end this session only
            log.exception("session %s failed", served.seq_id)
            await self._reply_error(
                served.conn,
                wire.WireError(
                    wire.INTERNAL, f"{type(exc).__name__}: {exc}; session closed", None, m.seq, served.session
                ),
            )
            return False
        finally:
            served.busy = False
            _settle(served.conn, m)
        return True

    async def _serve_inline(self, served: Served, m: wire.Verify, t_arrival_s: float) -> None:
        """A Verify served by the connection's reader itself, not handed to the session's task:
        the hand-over is a queue put and a loop turn before the pass (0.03-0.1 ms a round here,
        all of it between the block's arrival and its verdict). Only for a session that is idle
        and alone (``_alone``): its task waits on an empty inbox, and the reader would read
        nothing during the pass anyway (it runs on the loop's thread). Same replies and errors as
        the task; a failure that ends the session hands the ending to its task."""
        self.counts["inline"] += 1
        if not await self._serve_one(served, m, t_arrival_s):
            served.closed = True
            served.inbox.put_nowait((time.perf_counter(), None))  # the task frees the session
            return
        if self.selector is not None:
            conn = served.conn
            conn.replied_s = time.perf_counter()
            expected_s = conn.block_gaps.expected_s()
            if expected_s is not None:
                self.selector.expect(conn.replied_s + expected_s)  # poll for the next block when it is due

    async def _prefill(self, served: Served, m: wire.Open, t_arrival_s: float) -> None:
        positions, timing = await self.scheduler.submit(
            "prefill",
            len(m.prompt) - 1,
            served.state.prefill,
            served.conn.number,
            t_arrival_s,
            arrived_s=served.conn.held.get(m.seq),
        )
        await served.conn.send(
            wire.Opened(
                m.seq,
                m.session,
                positions,
                timing.queue_s,
                timing.compute_s,
                served.features(served.state.decided_features(1)),
            )
        )

    async def _verify(self, served: Served, m: wire.Verify, t_arrival_s: float) -> None:
        state = served.state
        q = None if state.sampling.greedy else served.draft_probs.pop(id(m))  # read by _check
        proposal = Proposal(m.start_pos, m.base_digest, tuple(m.draft_tokens), q)
        live = (
            not state.finished
            and m.start_pos == len(state.committed)
            and state.committed.matches(m.start_pos, m.base_digest)
        )

        def reply(verdict, timing: PassTiming) -> bytes | None:
            """The verdict, encoded while the pass's modelled time runs; after a pass on the loop's
            own thread, sent at once (None), before the scheduler's bookkeeping."""
            data = wire.encode(
                wire.Verified(
                    m.seq,
                    m.session,
                    verdict.start_pos,
                    verdict.proposed,
                    verdict.accepted,
                    verdict.next_token,
                    verdict.stale,
                    timing.queue_s,
                    timing.compute_s,
                    timing.batch_size,
                    served.features(verdict.features),
                )
            )
            return served.conn.send_if_on_loop(data, timing.on_loop)

        job = state.verify_job(proposal) if live else None
        if live:
            if job is None:
                raise RuntimeError(f"session {served.seq_id!r}: a live block without a verification job")
            data, _ = await self.scheduler.submit(
                "verify",
                proposal.gamma,
                job,
                served.conn.number,
                t_arrival_s,
                reply,
                self._alone(served),
                served.conn.held.get(m.seq),
            )
        else:
            data = reply(state.verify(proposal), PassTiming(0.0, 0.0, 0))  # stale: no compute
        self.counts["verify" if live else "stale"] += 1
        if data is not None:
            await served.conn.send_encoded(data)

    async def _generate(self, served: Served, m: wire.Generate, t_arrival_s: float) -> None:
        """Passes back to back: each is ready when the one before it ended (the first, when the
        request arrived), so sending a round's tokens overlaps the next pass, as on a real server."""
        state = served.state
        round_index = 0
        ready_s, arrived_s = t_arrival_s, served.conn.held.get(m.seq)
        drafts = get_mode(m.mode).drafts
        if drafts == SERVER:
            begin_request(self.draft, served.seq_id, state.committed.tokens, m.gamma)
            hand_features(self.draft, served.seq_id, state.decided_features(1))  # the draft's, on the server
        end = math.inf if m.max_tokens is None else len(state.committed) + m.max_tokens  # a hand-over's segment
        while not state.finished and not served.closed and len(state.committed) < end:
            reply = self._round_reply(served, m, round_index)
            before = len(state.committed)
            if drafts == NOWHERE:
                data, timing = await self.scheduler.submit(
                    AR, 1, state.ar_job(), served.conn.number, ready_s, reply(None), self._alone(served), arrived_s
                )
            else:
                (drafted, q), drafting = await self.scheduler.submit(
                    "draft",
                    m.gamma,
                    DraftJob(self.draft, served.seq_id, state.committed.tokens, m.gamma, state.sampling, state.draws),
                    served.conn.number,
                    ready_s,
                    on_loop=self._alone(served),
                    arrived_s=arrived_s,
                )
                job = state.verify_job(state.proposal_for(drafted, q))
                if job is None:
                    raise RuntimeError(f"session {served.seq_id!r}: its own draft block went stale")
                data, timing = await self.scheduler.submit(
                    "verify", m.gamma, job, served.conn.number, drafting.end_s, reply(drafting), self._alone(served)
                )
            ready_s, arrived_s = timing.end_s, None
            if drafts == SERVER:
                hand_features(self.draft, served.seq_id, state.decided_features(before))
            self.counts[m.mode] += 1
            if data is not None:
                await served.conn.send_encoded(data)
            if timing.on_loop:
                await asyncio.sleep(0)  # a loop turn: read what came in during the passes (a ping, a Close)
            round_index += 1
        if round_index == 0:  # nothing left to generate: still end the stream
            await served.conn.send(wire.Tokens(m.seq, m.session, 0, 0, 0, [], True, 0.0, 0.0, 0))

    @staticmethod
    def _round_reply(served: Served, m: wire.Generate, round_index: int):
        """For a Generate's round: ``reply(drafting)`` is the prepare of the round's last pass (its
        draft pass's timing, None for AR), which encodes the round's Tokens (the pass's times plus
        the draft's) and, after a pass on the loop's own thread, sends them at once (None)."""
        state, before = served.state, len(served.state.committed)

        def reply(drafting: PassTiming | None):
            def prepare(result, timing: PassTiming) -> bytes | None:
                queue_s, compute_s, proposed, accepted = timing.queue_s, timing.compute_s, 0, 0
                if drafting is not None:
                    queue_s, compute_s = queue_s + drafting.queue_s, compute_s + drafting.compute_s
                    proposed, accepted = m.gamma, result.accepted
                data = wire.encode(
                    wire.Tokens(
                        m.seq,
                        m.session,
                        round_index,
                        proposed,
                        accepted,
                        state.committed.tokens[before:],
                        state.finished,
                        queue_s,
                        compute_s,
                        timing.batch_size,
                        served.features(state.decided_features(before)),
                    )
                )
                return served.conn.send_if_on_loop(data, timing.on_loop)

            return prepare

        return reply

    def _alone(self, served: Served) -> bool:
        """Whether this session's next pass may run on the loop's own thread (Scheduler.submit's
        on_loop; the scheduler also wants the device free and nothing queued), checked before
        every pass: no other session is open, and its connection has not sent a Verify during
        such a pass (a pipelined edge's next block; it would be read only after the pass).
        A Generate stream's client sends nothing while it runs but a Close or a ping, and a sync
        edge nothing while its block is verified. What does come in during the pass is stamped
        with when it arrived (after_loop_pass), and a ping's answer says how long it was held."""
        return self.sessions_open == 1 and not served.conn.overlapped

    def after_loop_pass(self, start_s: float) -> None:
        """Right after a pass on the loop's thread: note when what came in meanwhile arrived."""
        for conn in self._connections.values():
            if conn.held_since_s is None:
                conn.held_since_s = frame_stamps.pending_since_s(conn.watched, start_s)

    def _drop(self, conn: Connection) -> None:
        """The client is gone: every session ends after its current pass and frees its caches."""
        self._connections.pop(conn.number, None)
        for served in conn.sessions.values():
            served.closed = True
            served.inbox.put_nowait((time.perf_counter(), None))
        conn.sessions.clear()
