"""The batched cost curve t_verify(gamma, b) and the batch_slope fitted to it."""

import pytest

from dsd.costs.measurement import batched_verify_times_s, fit_batch_slope
from tests.torch_pairs import tiny_pair
from tests.checks import every


def test_fit_recovers_the_slope_of_an_exact_linear_curve():
    times = {(g, b): (0.004 + 0.001 * g) * (1 + 0.3 * (b - 1)) for g in (1, 4) for b in (1, 2, 8)}
    assert fit_batch_slope(times) == pytest.approx(0.3)


def test_fit_is_one_for_sequences_run_one_after_another_and_never_negative():
    assert fit_batch_slope({(4, b): 0.01 * b for b in (1, 2, 4)}) == pytest.approx(1.0)
    assert fit_batch_slope({(4, 1): 0.01, (4, 2): 0.009}) == 0.0


def test_fit_needs_batch_one_and_more():
    with pytest.raises(ValueError, match="batch sizes 1 and > 1"):
        fit_batch_slope({(4, 2): 0.01})


def test_the_curve_is_measured_for_every_gamma_and_batch_and_leaves_no_cache_behind():
    _, target = tiny_pair(seed=2)
    times = batched_verify_times_s(target, gammas=(1, 3), batch_sizes=(1, 4), context_tokens=16, repeats=3)
    assert set(times) == {(1, 1), (1, 4), (3, 1), (3, 4)}
    assert every(t > 0 for t in times.values())
    assert not target._caches
    # Each timed pass feeds only the block: gamma + 1 positions per sequence after the warm-up.
    assert target.stats.positions_fed == 4 * 16 + 4 * sum((g + 1) * b for g, b in times)
