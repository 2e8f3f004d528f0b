"""The edge side of distributed speculative decoding, as a state machine with no I/O.

A driver (the in-process simulator, or the edge service over a socket) asks ``next_draft()``
what to draft, drafts it, hands it to ``add_draft()``, sends what that returns, and feeds every
verdict to ``on_verdict()``, sending what that returns.

Synchronous DSD: draft gamma tokens on the committed prefix, send, wait for the verdict.

Pipelined DSD (up to ``max_in_flight`` blocks in flight): after sending block k, the edge drafts
a guess g of the verdict's bonus token (one draft step) and then block k+1 on ``committed + block k + g``, assuming block k is
accepted whole. The verdict of block k keeps that speculation alive only if all gamma tokens were
accepted and the bonus equals g; otherwise every block drafted on it is dropped (those already
sent come back stale) and drafting restarts from the corrected prefix. ``epoch`` counts such
restarts, so a driver can tell that a draft it was working on has become useless.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsd.backends.protocol import Proposal, Verdict
from dsd.sequence import TokenSequence, chain_digest
from dsd.speculation.stopping import StopRule, round_tokens


@dataclass(frozen=True)
class DraftRequest:
    prefix: list[int]  # draft after these tokens
    n_tokens: int  # how many to draft
    with_guess: bool  # one token: the guess of the bonus of the last block in flight
    epoch: int


class EdgeDecoder:
    def __init__(
        self, prompt: Sequence[int], gamma: int, stop: StopRule, pipelined: bool = False, max_in_flight: int = 1
    ) -> None:
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma!r}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight!r}")
        self.stop = stop
        self.depth = max_in_flight  # blocks in flight when pipelined
        self.set_drafting(gamma, pipelined)
        self.committed = TokenSequence(prompt)
        self.prompt_length = len(prompt)
        self.speculative: list[int] = []  # assumed beyond committed: sent blocks and guesses
        self.in_flight: deque[tuple[Proposal, int | None]] = deque()  # (block, guess drafted after it)
        self.held: Proposal | None = None  # drafted, waiting for a free slot
        self.doomed = 0  # sent blocks that will come back stale
        self.epoch = 0
        self.stale_verdicts = 0

    def set_drafting(self, gamma: int, pipelined: bool) -> None:
        """The gamma and mode of the blocks drafted from now on (dsd.controller.interface). Blocks already
        drafted keep theirs; leaving pipelined mode only stops new speculation (blocks in flight
        are answered as before, a held block waits for its slot), so no token is lost."""
        if not (isinstance(gamma, int) and gamma >= 1):
            raise ValueError(f"gamma must be >= 1, got {gamma!r}")
        self.gamma = gamma
        self.pipelined = pipelined
        self.max_in_flight = self.depth if pipelined else 1

    @property
    def generated(self) -> list[int]:
        return self.committed.tokens[self.prompt_length :]

    @property
    def done(self) -> bool:
        return self.stop.finished_in(self.committed.tokens, self.prompt_length)

    def next_draft(self) -> DraftRequest | None:
        """What to draft now, or None to wait for a verdict."""
        if self.done or self.held is not None:
            return None
        if not self.in_flight:
            return DraftRequest(list(self.committed.tokens), self.gamma, False, self.epoch)
        if not self.pipelined:
            return None
        prefix = self.committed.tokens + self.speculative
        if self.in_flight[-1][1] is None:
            return DraftRequest(prefix, 1, True, self.epoch)
        if len(prefix) - self.prompt_length >= self.stop.max_new_tokens:
            return None  # speculation already reaches the budget
        return DraftRequest(prefix, self.gamma, False, self.epoch)

    def add_draft(
        self, request: DraftRequest, drafted: Sequence[int], draft_probs: torch.Tensor | None
    ) -> list[Proposal]:
        """Take what was drafted for ``request``; returns the blocks to send now (possibly none).

        A guess is registered at once, so that a verdict arriving while the next block is being
        drafted already knows it.
        """
        if request.epoch != self.epoch:
            return []  # drafted on a prefix a verdict has since refuted
        start = len(self.committed) + len(self.speculative)
        if start != len(request.prefix):
            raise AssertionError(f"draft for length {len(request.prefix)} arrived at length {start}")
        if request.with_guess:
            block, _ = self.in_flight[-1]
            self.in_flight[-1] = (block, int(drafted[0]))
            self.speculative.append(int(drafted[0]))
            return []
        digest = self.committed.digest_at(len(self.committed))
        for token in self.speculative:
            digest = chain_digest(digest, token)
        self.held = Proposal(start, digest, tuple(int(t) for t in drafted), draft_probs)
        self.speculative.extend(self.held.draft_tokens)
        return self._send_held()

    def on_verdict(self, verdict: Verdict) -> tuple[list[int], list[Proposal]]:
        """Apply a verdict; returns (tokens emitted, blocks to send now).

        Verdicts come back in the order the blocks were sent, so after a refuted speculation the
        next ``doomed`` verdicts answer blocks that were drafted on it.
        """
        if self.doomed:
            if not verdict.stale:
                raise ValueError(
                    f"a block sent on a refuted prefix (start_pos {verdict.start_pos}) was not answered stale"
                )
            self.doomed -= 1
            self.stale_verdicts += 1
            return [], []
        if not self.in_flight:
            raise ValueError(f"verdict for start_pos {verdict.start_pos} with no block in flight")
        block, guess = self.in_flight.popleft()
        if verdict.start_pos != block.start_pos or verdict.stale:
            raise ValueError(
                f"verdict (start_pos {verdict.start_pos}, stale={verdict.stale}) does not "
                f"answer the block in flight (start_pos {block.start_pos})"
            )
        emitted = self.stop.clip(
            round_tokens(block.draft_tokens, verdict.accepted, verdict.next_token), len(self.generated)
        )
        self.committed.extend(emitted)
        survived = (
            verdict.accepted == block.gamma and guess is not None and verdict.next_token == guess and not self.done
        )
        if survived:
            del self.speculative[: block.gamma + 1]
        else:
            self._drop_speculation()
        return emitted, self._send_held()

    def on_tokens(self, tokens: Sequence[int]) -> list[int]:
        """Tokens the server generated on the committed prefix (a hand-over, dsd.drive.driver); returns
        those emitted. Only with nothing in flight or held: the server owns the prefix meanwhile
        (stale answers to blocks of a refuted speculation may still be on the way: they come first)."""
        if self.in_flight or self.held is not None or self.speculative:
            raise ValueError(
                f"server tokens at length {len(self.committed)} while {len(self.in_flight)} "
                "block(s) are in flight or held: hand over only once they are answered"
            )
        emitted = self.stop.clip([int(t) for t in tokens], len(self.generated))
        self.committed.extend(emitted)
        return emitted

    def _drop_speculation(self) -> None:
        self.doomed += len(self.in_flight)
        self.in_flight.clear()
        self.speculative.clear()
        self.held = None
        self.epoch += 1

    def _send_held(self) -> list[Proposal]:
        if self.held is None or len(self.in_flight) >= self.max_in_flight:
            return []
        proposal, self.held = self.held, None
        self.in_flight.append((proposal, None))
        return [proposal]
