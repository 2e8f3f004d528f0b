"""The run's compute regime, printed and recorded before its first point (dsd.analytic.regime): the
precision, t_verify/t_ar and t_draft/t_ar as measured here, the acceptance rate at which
synchronous DSD breaks even, and a one-line warning where no DSD mode can beat cloud AR."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsd.backends.precision import cached_choice
from dsd.analytic.regime import regime
from dsd.costs.compute_times import ComputeTimes
from orchestrator.spec.experiment import Experiment


def heldout_alpha(experiment: Experiment) -> tuple[float | None, str]:
    """The pair's held-out acceptance (its manifest) at the sweep's first sampling setting."""
    pair = getattr(experiment.backend, "pair_path", "")
    manifest = Path(pair) / "manifest.json" if pair else None
    if manifest is None or not manifest.is_file():
        return None, ""
    held_out = json.loads(manifest.read_text()).get("heldout_alpha") or {}
    greedy = experiment.sampling.settings(experiment.seed)[0].temperature == 0
    value = held_out.get("greedy" if greedy else "sampled")
    return (float(value), f"the pair's held-out {'greedy' if greedy else 'sampled'} alpha") if value else (None, "")


def announce_regime(experiment: Experiment, times: ComputeTimes) -> dict | None:
    """Print the regime lines and return sweep.json's record of them (None for emulated models,
    whose times are a profile's, not this machine's)."""
    backend = experiment.backend
    if backend.emulated:
        return None
    alpha, source = heldout_alpha(experiment)
    dtype = getattr(backend, "dtype", "the backend's own")  # a backend kind may have no dtype
    found = regime(times, tuple(experiment.gamma), dtype, getattr(backend, "draft_dtype", dtype), alpha, source)
    for line in found.lines():
        print(line, file=sys.stderr, flush=True)
    record = found.to_dict()
    if hasattr(backend, "model_paths"):
        choice = cached_choice(*backend.model_paths())
        if choice is not None:  # what dtype = "auto" measured on this machine, if it ran here
            record["precision_choice"] = choice.to_dict()
    return record
