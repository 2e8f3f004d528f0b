"""Measure a model pair's compute times on this machine (wall clock, median of repeats).

What the latency model calls t_draft_s, t_verify_s (gamma+1 positions), t_ar_s and the prefill
cost, measured with a warm KV cache at a realistic context length.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from dsd.backends.protocol import LanguageModel, LogitsRequest
from dsd.costs.compute_times import ComputeTimes


@dataclass(frozen=True)
class MeasuredTimes:
    t_draft_s: float
    t_ar_s: float
    t_verify_s: dict[int, float]  # gamma -> one target pass over gamma+1 positions
    t_prefill_per_token_s: float
    context_tokens: int
    repeats: int

    @property
    def times(self) -> ComputeTimes:
        """As the one compute-times type: t_verify as the measured table, one machine drafting for
        edge and server alike."""
        return ComputeTimes(
            t_draft_edge_s=self.t_draft_s,
            t_draft_server_s=self.t_draft_s,
            t_ar_s=self.t_ar_s,
            t_prefill_per_token_s=self.t_prefill_per_token_s,
            t_verify_by_gamma_s=tuple(self.t_verify_s.items()),
        )


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def step_time_s(model: LanguageModel, context: list[int], n_positions: int, repeats: int) -> float:
    """Time of one pass over n_positions new positions after a cached ``context``."""
    seq_id = f"timing-{n_positions}"
    extra = [(t * 7 + 3) % model.vocab_size for t in range(n_positions)]
    model.logits(seq_id, context, 1)  # warm the cache with the context

    def one_pass() -> None:
        model.logits(seq_id, context + extra, n_positions)  # crops back to the context each time

    one_pass()
    result = _median_s(one_pass, repeats)
    model.release(seq_id)
    return result


def measure_times(
    draft: LanguageModel,
    target: LanguageModel,
    gammas: tuple[int, ...] = (1, 2, 4, 8),
    context_tokens: int = 128,
    repeats: int = 30,
) -> MeasuredTimes:
    vocab = min(draft.vocab_size, target.vocab_size)
    context = [(i * 31 + 11) % vocab for i in range(context_tokens)]

    def prefill() -> None:
        target.logits("timing-prefill", context, 1)
        target.release("timing-prefill")

    prefill_s = _median_s(prefill, max(3, repeats // 5))
    return MeasuredTimes(
        t_draft_s=step_time_s(draft, context, 1, repeats),
        t_ar_s=step_time_s(target, context, 1, repeats),
        t_verify_s={g: step_time_s(target, context, g + 1, repeats) for g in gammas},
        t_prefill_per_token_s=prefill_s / context_tokens,
        context_tokens=context_tokens,
        repeats=repeats,
    )


def batched_verify_times_s(
    target: LanguageModel,
    gammas: tuple[int, ...] = (1, 2, 4, 8),
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
    context_tokens: int = 128,
    repeats: int = 10,
) -> dict[tuple[int, int], float]:
    """t_verify(gamma, b): one pass verifying b sequences' blocks of gamma tokens at once, each on
    its own cached context of context_tokens (median of repeats; the pairs interleaved, so a host
    whose speed drifts meets every pair alike). Keys (gamma, b)."""
    vocab = target.vocab_size
    width = max(batch_sizes)
    contexts = [[(i * 31 + 11 + 7 * row) % vocab for i in range(context_tokens)] for row in range(width)]
    for row, context in enumerate(contexts):
        target.logits(f"timing-batch-{row}", context, 1)  # warm each row's cache

    def requests(gamma: int, batch: int) -> list[LogitsRequest]:
        extra = [(t * 7 + 3) % vocab for t in range(gamma + 1)]
        return [LogitsRequest(f"timing-batch-{row}", contexts[row] + extra, gamma + 1) for row in range(batch)]

    samples: dict[tuple[int, int], list[float]] = {(g, b): [] for g in gammas for b in batch_sizes}
    for key in samples:  # once unmeasured: first passes are slow
        target.logits_batch(requests(*key))
    for _ in range(repeats):
        for key in samples:
            batch = requests(*key)
            start = time.perf_counter()
            target.logits_batch(batch)  # crops back to the context each time
            samples[key].append(time.perf_counter() - start)
    for row in range(width):
        target.release(f"timing-batch-{row}")
    return {key: statistics.median(values) for key, values in samples.items()}


def fit_batch_slope(times_s: dict[tuple[int, int], float]) -> float:
    """The profile's batch_slope s in t(gamma, b) = t(gamma, 1) * (1 + s * (b - 1)): least squares
    through the origin over every measured (gamma, b > 1), each against its own gamma's b = 1."""
    pairs = [(b - 1, t / times_s[g, 1] - 1) for (g, b), t in times_s.items() if b > 1 and (g, 1) in times_s]
    if not pairs:
        raise ValueError(f"times_s needs batch sizes 1 and > 1 of one gamma, got {sorted(times_s)}")
    return max(0.0, sum(x * y for x, y in pairs) / sum(x * x for x, _ in pairs))
