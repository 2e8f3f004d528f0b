"""The prefix digest travels on the wire: it is 64-bit FNV-1a over each token id's 8 little-endian
bytes, whatever the implementation (dsd.sequence unrolls the byte loop for speed)."""

import random

from dsd.sequence import TokenSequence, chain_digest, prefix_digest


def fnv1a_64(data: bytes) -> int:
    digest = 0xCBF29CE484222325
    for byte in data:
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return digest


def test_prefix_digest_is_fnv1a_over_little_endian_token_bytes():
    rng = random.Random(3)
    for _ in range(200):
        tokens = [
            rng.choice([rng.randrange(4096), rng.getrandbits(40), rng.getrandbits(64)])
            for _ in range(rng.randrange(0, 6))
        ]
        expected = fnv1a_64(b"".join(t.to_bytes(8, "little") for t in tokens))
        assert prefix_digest(tokens) == expected
        sequence = TokenSequence(tokens)
        assert sequence.digest_at(len(tokens)) == expected and sequence.matches(len(tokens), expected)


def test_known_answer():
    assert prefix_digest([]) == 0xCBF29CE484222325
    assert chain_digest(0xCBF29CE484222325, 0) == fnv1a_64(bytes(8))
    assert prefix_digest([1, 2]) == fnv1a_64(b"\x01" + bytes(7) + b"\x02" + bytes(7))
