"""When a request stops: at the end-of-sequence token (kept) or at the token budget.

Edge and verifier apply the same rule to the same verdict, so they agree on the output without
another message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRule:
    max_new_tokens: int
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a whole number >= 1, got {self.max_new_tokens!r}")

    def clip(self, new_tokens: Sequence[int], already_generated: int) -> list[int]:
        """The part of ``new_tokens`` that is emitted after ``already_generated`` tokens."""
        room = self.max_new_tokens - already_generated
        kept = list(new_tokens[: max(room, 0)])
        if self.eos_token_id is not None and self.eos_token_id in kept:
            kept = kept[: kept.index(self.eos_token_id) + 1]
        return kept

    def finished(self, generated: Sequence[int]) -> bool:
        return self._finished(len(generated), generated[-1] if generated else None)

    def finished_in(self, tokens: Sequence[int], prompt_length: int) -> bool:
        """``finished`` for what follows the prompt in ``tokens``, without copying it out (the
        decoders ask several times a round)."""
        n_generated = len(tokens) - prompt_length
        return self._finished(n_generated, tokens[-1] if n_generated > 0 else None)

    def _finished(self, n_generated: int, last_token: int | None) -> bool:
        return n_generated >= self.max_new_tokens or (
            self.eos_token_id is not None and n_generated > 0 and last_token == self.eos_token_id
        )


def round_tokens(draft_tokens: Sequence[int], accepted: int, next_token: int) -> list[int]:
    """The tokens a verdict emits before clipping: the accepted drafts, then the next token."""
    return list(draft_tokens[:accepted]) + [next_token]
