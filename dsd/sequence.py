"""The committed token sequence, with a rolling digest of every prefix.

A pipelined edge drafts on a prefix it only assumes; the verifier compares the digest of that
assumed prefix with the digest of its committed prefix of the same length in O(1). The digest is
a 64-bit FNV-1a-style hash chained over token ids, identical in every language that implements it
the same way (it travels on the wire).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def chain_digest(digest: int, token: int) -> int:
    """Extend a prefix digest by one token id (8 bytes, little endian, folded in one by one)."""
    # Unrolled: the edge chains every drafted and committed token between a verdict and its next
    # block, and the loop's own steps cost as much as the arithmetic.
    p, m = _FNV_PRIME, _MASK64
    digest = ((digest ^ (token & 0xFF)) * p) & m
    digest = ((digest ^ ((token >> 8) & 0xFF)) * p) & m
    digest = ((digest ^ ((token >> 16) & 0xFF)) * p) & m
    digest = ((digest ^ ((token >> 24) & 0xFF)) * p) & m
    digest = ((digest ^ ((token >> 32) & 0xFF)) * p) & m
    digest = ((digest ^ ((token >> 40) & 0xFF)) * p) & m
    digest = ((digest ^ ((token >> 48) & 0xFF)) * p) & m
    return ((digest ^ ((token >> 56) & 0xFF)) * p) & m


def prefix_digest(tokens: Iterable[int]) -> int:
    digest = _FNV_OFFSET
    for token in tokens:
        digest = chain_digest(digest, token)
    return digest


class TokenSequence:
    """Token ids plus ``digests[i]`` = digest of ``tokens[:i]``."""

    def __init__(self, tokens: Sequence[int] = ()):
        self.tokens: list[int] = []
        self.digests: list[int] = [_FNV_OFFSET]
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.tokens.append(int(token))
            self.digests.append(chain_digest(self.digests[-1], int(token)))

    def digest_at(self, length: int) -> int:
        return self.digests[length]

    def matches(self, length: int, digest: int) -> bool:
        """True if this sequence has at least ``length`` tokens and that prefix has ``digest``."""
        return 0 <= length <= len(self.tokens) and self.digests[length] == digest


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix; one C-level comparison in the usual case where the
    shorter list is a prefix of the longer."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] holds, a[:hi] == b[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid
    return lo
