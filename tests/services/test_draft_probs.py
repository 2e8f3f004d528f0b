"""A sampled Verify's q as the verifier reads it (services.verifier.limits._draft_probs): the dense
and the sparse encodings of one q give the same tensor, and each bad q is refused naming what is
wrong, as a check over the whole [gamma, vocab] q would."""

import math
import random
import struct

import pytest
import torch

from services import wire
from services.verifier.limits import _draft_probs

VOCAB = 40


def whole_q_verdict(ids: list[list[int]], values: list[list[float]], draft: list[int]) -> str | None:
    """What is wrong with a sparse q, judged on the dense q its ids and values make (None: nothing)."""
    q = torch.zeros(len(draft), VOCAB)
    for row, (row_ids, row_values) in enumerate(zip(ids, values)):
        for token, value in zip(row_ids, row_values):  # one by one: a repeated id's last value
            q[row, token] = torch.tensor([value], dtype=torch.float32)[0]
    if not bool(torch.isfinite(q).all()) or not bool((q >= 0).all()):
        return "must be finite and non-negative"
    if not bool((q.sum(dim=-1) > 0).all()):
        return "every row must have a positive sum"
    if not all(q[row, token] > 0 for row, token in enumerate(draft)):
        return "a draft token must have q > 0"
    return None


def outcome(m: wire.Verify):
    try:
        return _draft_probs(m, VOCAB)
    except wire.WireError as error:
        assert (error.code, error.field) == (wire.OUT_OF_RANGE, "probs"), error
        return error.message


def test_dense_and_sparse_q_read_the_same():
    rng = random.Random(3)
    for _ in range(50):
        draft = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
        rows = [
            {token: rng.random() + 0.01 for token in rng.sample(range(VOCAB), rng.randint(1, 6)) + [draft[r]]}
            for r in range(len(draft))
        ]
        sparse = wire.Verify(
            1, 1, 0, 0, draft, probs_ids=[list(r) for r in rows], probs_values=[list(r.values()) for r in rows]
        )
        dense_q = torch.zeros(len(draft), VOCAB)
        for r, row in enumerate(rows):
            for token, value in row.items():
                dense_q[r, token] = value
        dense = wire.Verify(1, 1, 0, 0, draft, probs_dense=dense_q.numpy().astype("<f4").tobytes())
        assert torch.equal(_draft_probs(sparse, VOCAB), dense_q)
        assert torch.equal(_draft_probs(dense, VOCAB), dense_q)


@pytest.mark.parametrize(
    "ids, values, draft",
    [
        ([[1, 2]], [[0.5, math.nan]], [1]),
        ([[1, 2]], [[0.5, math.inf]], [1]),
        ([[1, 2]], [[0.5, 1e300]], [1]),  # finite as a double, infinite as float32
        ([[1, 2]], [[0.5, -0.1]], [1]),
        ([[1], []], [[1.0], []], [1, 3]),  # an empty row
        ([[1], [3]], [[1.0], [0.0]], [1, 3]),  # a row of zeros
        ([[1], [3]], [[1.0], [1e-46]], [1, 3]),  # positive as a double, zero as float32
        ([[1, 2]], [[0.5, 0.5]], [3]),  # the draft token has q = 0
        ([[1, 1]], [[0.5, 0.0]], [1]),  # a repeated id: its last value is what q holds
        ([[1, 1]], [[math.nan, 0.5]], [1]),
        ([[1, 2]], [[0.5, -0.0]], [1]),  # -0.0 is not negative
    ],
)
def test_each_bad_q_is_refused_as_the_whole_q_check_refuses_it(ids, values, draft):
    expected = whole_q_verdict(ids, values, draft)
    got = outcome(wire.Verify(1, 1, 0, 0, draft, probs_ids=ids, probs_values=values))
    if expected is None:
        assert isinstance(got, torch.Tensor)
    else:
        assert isinstance(got, str) and expected in got, (got, expected)
    # the dense encoding of the same q (where float32 can carry it) is judged alike
    q = [[0.0] * VOCAB for _ in draft]
    for row, (row_ids, row_values) in enumerate(zip(ids, values)):
        for token, value in zip(row_ids, row_values):
            q[row][token] = value if abs(value) < 3e38 or math.isnan(value) else math.copysign(math.inf, value)
    dense = outcome(
        wire.Verify(
            1, 1, 0, 0, draft, probs_dense=struct.pack(f"<{len(draft) * VOCAB}f", *[v for row in q for v in row])
        )
    )
    assert isinstance(dense, torch.Tensor) if expected is None else expected in dense
