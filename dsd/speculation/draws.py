"""Random draws keyed by where they are used: (request seed, block start position, role).

A request's sampling draws come from a generator seeded afresh for every block: the draft's
block that starts at position n draws from ``Draws(seed).at(n, DRAFT)``, its verification from
``.at(n, VERIFY)``, an AR step at position n from ``.at(n, TARGET)``. Co-located SD, synchronous
and pipelined DSD lay their blocks out at the same positions whenever they commit the same
tokens, so with one seed they draw the same numbers and commit the same tokens: the modes are
compared on common random numbers, not on sample paths of their own. (Pipelined DSD drafts
ahead on a guess of the bonus token; a block drafted on a right guess starts where the
synchronous one does and draws what it draws, and one on a wrong guess is dropped unverified.)

Exactness: a block's draws condition the committed tokens once at most. A rejection at position
j commits up to j and the next block starts at j + 1, so no start position is verified twice;
a draft block redrafted at a start after its first drafting was dropped had no say in what was
committed. Different roles and positions get independent streams (splitmix64 of the key).
"""

from __future__ import annotations

import torch

DRAFT, VERIFY, TARGET = "draft", "verify", "target"
ROLE_IDS = {DRAFT: 1, VERIFY: 2, TARGET: 3}
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def draw_key(seed: int, position: int, role: str) -> int:
    """The 64-bit generator seed for (seed, position, role)."""
    if role not in ROLE_IDS:
        raise ValueError(f"role must be one of {tuple(ROLE_IDS)}, got {role!r}")
    if position < 0:
        raise ValueError(f"position must be >= 0, got {position!r}")
    return _splitmix64(_splitmix64(_splitmix64(int(seed) & _MASK64) ^ position) ^ ROLE_IDS[role])


class Draws:
    """One request's draws: ``at(position, role)`` is a new generator for the block there."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def at(self, position: int, role: str) -> torch.Generator:
        return torch.Generator().manual_seed(draw_key(self.seed, position, role))
