"""A built pair's compute times through the backend the services run (dsd.backends.torch_lm):
the target's decode step, its verification pass over gamma + 1 positions, and the draft's step,
each the median of repeated passes at a chat-sized context, one thread each (the placement the
main job pins: the verifier and the edge on a core of their own)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsd.backends.torch_lm import TorchLM, TorchLMConfig
from dsd.costs.measurement import step_time_s


@dataclass(frozen=True)
class StepTimes:
    t_ar_s: float  # target, one new position
    t_verify_s: float  # target, gamma + 1 new positions
    t_draft_s: float  # draft, one new position
    gamma: int
    context_tokens: int
    threads: int
    dtype: str = "float32"

    def ratios(self) -> dict:
        return {
            "t_verify_over_t_ar": round(self.t_verify_s / self.t_ar_s, 4),
            "t_draft_over_t_ar": round(self.t_draft_s / self.t_ar_s, 4),
        }


def measure_step_times(
    target_path: str,
    draft_path: str,
    context: list[int],
    gamma: int,
    passes: int = 30,
    threads: int = 1,
    dtype: str = "float32",
) -> StepTimes:
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        target = TorchLM.load(TorchLMConfig(target_path, dtype))
        draft = TorchLM.load(TorchLMConfig(draft_path, dtype))
        return StepTimes(
            t_ar_s=step_time_s(target, context, 1, passes),
            t_verify_s=step_time_s(target, context, gamma + 1, passes),
            t_draft_s=step_time_s(draft, context, 1, passes),
            gamma=gamma,
            context_tokens=len(context),
            threads=threads,
            dtype=dtype,
        )
    finally:
        torch.set_num_threads(old)
