"""The open-loop serving sim's queue (orchestrator/open_loop/sim.py): a synchronous DSD block joins
the verifier's queue when it reaches the verifier, so no request waits a negative time and no
pass starts before its block is there, however the prefill and the edge's drafting interleave."""

import numpy as np
import pytest

from dsd.costs.compute_times import ComputeTimes
from orchestrator.open_loop.sim import ServingSetup, simulate_serving
from orchestrator.spec.arrivals import OpenLoopRequest

# the edge drafts its first block (4 x 10 ms) for longer than the prompt's prefill takes (4 x 0.5 ms)
TIMES = ComputeTimes(0.010, 0.002, 0.020, t_prefill_per_token_s=0.0005, t_verify_by_gamma_s={4: 0.025}, batch_slope=0.3)


@pytest.mark.parametrize("rtt_ms", [0.0, 20.0, 120.0])
def test_a_lone_synchronous_request_never_waits_at_the_verifier(rtt_ms):
    [row] = simulate_serving(
        ServingSetup("sync", 4, 0.7, TIMES, (rtt_ms,), prompt_tokens=4), [OpenLoopRequest(0, 0.0, 0, 24, False)], seed=1
    )
    assert row["tokens"] == 24 and row["queue_s"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("max_batch", [1, 4])
def test_no_synchronous_block_waits_a_negative_time_under_load(max_batch):
    rng = np.random.default_rng(3)
    arrivals = [
        OpenLoopRequest(i, float(t), i % 4, 24, False) for i, t in enumerate(np.cumsum(rng.exponential(0.4, 40)))
    ]
    rows = simulate_serving(
        ServingSetup("sync", 4, 0.7, TIMES, (120.0,), prompt_tokens=4, max_batch=max_batch), arrivals, seed=1
    )
    queues = [r["queue_s"] for r in rows]
    assert len(queues) == 40 and min(queues) >= -1e-12, min(queues)
    assert max(queues) > 0, "at this load some block must wait for another request's pass"
