"""The predicted bytes of a round (services/wire_size.py) against real encoded messages: Verify
messages built by the edge's own encoder from blocks a real drafter proposed (greedy ids, dense q,
sparse top-k and top-p q), a Verified and a Tokens as the verifier sends them."""

from __future__ import annotations

import random

import msgpack
import pytest

from dsd.backends.protocol import Proposal, SamplingParams
from dsd.speculation.draws import Draws
from dsd.speculation.drafting import draft_block
from dsd.sequence import prefix_digest
from services import wire, wire_size
from services.edge import _verify_message
from tests.toy_models import BigramLM, random_bigram

GAMMA = 4
BLOCKS = 20
PROMPT_TOKENS = 300  # start_pos in uint16, as the prediction assumes


def encoded_verify_bytes(vocab: int, sampling: SamplingParams) -> tuple[float, float | None]:
    """Mean size of BLOCKS encoded Verify messages, and the mean kept ids per sparse row."""
    drafter = BigramLM(random_bigram(vocab, seed=1, sharpness=3.0))
    sizes, kept = [], []
    for block in range(BLOCKS):
        prefix = [random.Random(block).randrange(vocab) for _ in range(PROMPT_TOKENS)]
        tokens, probs = draft_block(drafter, f"s{block}", prefix, GAMMA, sampling, Draws(block))
        proposal = Proposal(len(prefix), prefix_digest(prefix), tuple(tokens), probs)
        message = _verify_message(1000 + block, 3, proposal, sampling)
        sizes.append(len(wire.encode(message)))
        kept += [len(row) for row in message.probs_ids or []]
    return sum(sizes) / len(sizes), (sum(kept) / len(kept) if kept else None)


@pytest.mark.parametrize("vocab", [300, 1000])
@pytest.mark.parametrize(
    "sampling, encoding",
    [
        (SamplingParams(0.0), "none"),
        (SamplingParams(0.8), "dense"),
        (SamplingParams(0.8, top_k=20), "sparse"),
        (SamplingParams(1.0, top_p=0.9), "sparse"),
    ],
)
def test_predicted_verify_bytes_match_real_encoded_messages(vocab, sampling, encoding):
    assert wire.probs_encoding(sampling.temperature, sampling.top_k, sampling.top_p) == encoding
    measured, kept = encoded_verify_bytes(vocab, sampling)
    if sampling.top_k:
        assert kept == sampling.top_k
    nucleus_kept = kept if sampling.top_p < 1 and not sampling.top_k else None
    predicted = wire_size.verify_bytes(GAMMA, vocab, sampling.temperature, sampling.top_k, sampling.top_p, nucleus_kept)
    assert predicted == pytest.approx(measured, rel=0.01), (encoding, predicted, measured)


def test_what_a_verify_carries_orders_greedy_sparse_dense():
    vocab = 49_152
    greedy = wire_size.verify_bytes(GAMMA, vocab, 0.0)
    sparse = wire_size.verify_bytes(GAMMA, vocab, 0.8, top_k=50)
    dense = wire_size.verify_bytes(GAMMA, vocab, 0.8)
    assert greedy < 150 < sparse < 3_000 < 4 * GAMMA * vocab < dense < 4 * GAMMA * vocab + 200
    # Sparse rows cost ids + float64 values: 3 + 9 bytes a kept token at this vocabulary.
    assert sparse - greedy == pytest.approx(GAMMA * 50 * 12, abs=30)


@pytest.mark.parametrize("vocab", [100, 200, 1000, 70_000])
def test_greedy_verify_holds_at_every_id_width(vocab):
    """Ids of 1, 2, 3 and 5 msgpack bytes: the mean id size is exact over many uniform blocks."""
    rng = random.Random(vocab)
    sizes = [
        len(
            wire.encode(
                wire.Verify(
                    1000 + i, 3, 300, rng.getrandbits(64) | 1 << 63, [rng.randrange(vocab) for _ in range(GAMMA)]
                )
            )
        )
        for i in range(400)
    ]
    assert wire_size.verify_bytes(GAMMA, vocab, 0.0) == pytest.approx(sum(sizes) / len(sizes), abs=0.5)


def test_predicted_verified_and_tokens_bytes_match_encoded_replies():
    vocab, rng = 1000, random.Random(0)
    verified = [
        len(
            wire.encode(
                wire.Verified(
                    1000 + i, 3, 300, GAMMA, rng.randrange(GAMMA + 1), rng.randrange(vocab), False, 0.0012, 0.0034, 1
                )
            )
        )
        for i in range(200)
    ]
    assert wire_size.verified_bytes(vocab, GAMMA) == pytest.approx(sum(verified) / len(verified), abs=0.5)
    for n in (1, 4):
        tokens = [
            len(
                wire.encode(
                    wire.Tokens(
                        1000 + i,
                        3,
                        300 + i,
                        GAMMA,
                        n - 1,
                        [rng.randrange(vocab) for _ in range(n)],
                        False,
                        0.001,
                        0.002,
                        1,
                    )
                )
            )
            for i in range(200)
        ]
        assert wire_size.tokens_bytes(n, vocab, GAMMA) == pytest.approx(sum(tokens) / len(tokens), abs=1.0)


def test_the_float_width_the_prediction_assumes_is_msgpacks():
    assert len(msgpack.packb(0.1)) == wire_size.FLOAT_BYTES


def test_framing_adds_websocket_headers_tcp_segments_and_acks():
    up, down = wire_size.round_wire_bytes(GAMMA, 512, 0.0)
    verify, verified = wire_size.verify_bytes(GAMMA, 512, 0.0), wire_size.verified_bytes(512, GAMMA)
    # One segment each way (+ a pure ACK of the other's); a WebSocket header of 4 bytes (payloads
    # of 126 bytes and more), + a 4-byte mask up.
    assert 126 <= min(verify, verified) and max(verify, verified) < 200
    assert up == pytest.approx(verify + 4 + 4 + 2 * 52)
    assert down == pytest.approx(verified + 4 + 2 * 52)
    assert wire_size.websocket_frame_bytes(100, masked=False) == 102
    assert wire_size.round_wire_bytes(GAMMA, 512, 0.0, acks=False) == (up - 52, down - 52)
    dense_up, dense_down = wire_size.round_wire_bytes(GAMMA, 49_152, 1.0)
    n_segments = -(-(4 * GAMMA * 49_152 + 200) // wire_size.MSS_BYTES)
    assert dense_up == pytest.approx(4 * GAMMA * 49_152 * (1 + 52 / 1448), rel=0.002)
    assert dense_down > n_segments / 2 * 52


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: wire_size.verify_bytes(0, 512, 0.0), "gamma must be"),
        (lambda: wire_size.verify_bytes(4, 1, 0.0), "vocab must be"),
        (lambda: wire_size.verify_bytes(4, 512, 0.8, top_p=0.9), "kept_per_row"),
        (lambda: wire_size.tokens_bytes(0, 512, 4), "n_tokens must be"),
    ],
)
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
