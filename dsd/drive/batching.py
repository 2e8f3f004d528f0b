"""How the verifier device groups passes: sequences per pass (1 = serial) and how long a pass that
is not full waits for more. The service's scheduler (services/verifier/scheduler.py) and the
simulation's shared verifier (dsd/simulation/shared_verifier.py) both take it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsd.checks import is_int


@dataclass(frozen=True)
class BatchingConfig:
    max_batch: int = 1
    batch_window_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (is_int(self.max_batch) and self.max_batch >= 1):
            raise ValueError(f"max_batch must be a whole number >= 1, got {self.max_batch!r}")
        if not (
            isinstance(self.batch_window_ms, (int, float))
            and math.isfinite(self.batch_window_ms)
            and self.batch_window_ms >= 0
        ):
            raise ValueError(f"batch_window_ms must be a finite number >= 0, got {self.batch_window_ms!r}")
