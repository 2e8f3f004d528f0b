"""`dsdbed measure-profile`: a profiles.toml entry measured on this machine, sources included."""

from __future__ import annotations

import json
import time

import torch

from dsd.backends.factory import HfBackendConfig, load_pair
from dsd.backends.machine import cpu_model
from dsd.costs.compute_times import fit_verify_line
from dsd.costs.measurement import batched_verify_times_s, fit_batch_slope, measure_times


def measure_profile_toml(pair_path: str, name: str, threads: int) -> str:
    torch.set_num_threads(threads)
    draft, target = load_pair(HfBackendConfig(pair_path=pair_path))
    gammas = (1, 2, 4, 8)
    measurement = measure_times(draft, target, gammas=gammas)
    measured = measurement.times
    # t_verify(gamma) = base + per_position * (gamma + 1): least squares over the gammas measured.
    base, slope = fit_verify_line(measured.verify_table_s)
    # The batched cost curve: one forward pass verifying b sessions at once (dsd.backends.torch_lm).
    batches = (1, 2, 4, 8, 16)
    curve = batched_verify_times_s(
        target, gammas, batches, measurement.context_tokens, max(5, measurement.repeats // 3)
    )
    slope_b = fit_batch_slope(curve)
    source = (
        f"measured on {cpu_model()} ({threads} torch thread(s)), {time.strftime('%Y-%m-%d')}, "
        f"`dsdbed measure-profile --pair {pair_path} --threads {threads}`, median of "
        f"{measurement.repeats}, context {measurement.context_tokens} tokens"
    )
    values = {
        "t_draft_edge_s": (measured.t_draft_edge_s, source),
        "t_draft_server_s": (measured.t_draft_server_s, source + " (edge and server are the same machine here)"),
        "t_ar_s": (measured.t_ar_s, source),
        "t_verify_base_s": (
            base,
            source
            + f"; least-squares fit over gamma {list(gammas)}: "
            + ", ".join(f"{g}: {1e3 * measured.t_verify_s(g):.3f} ms" for g in gammas),
        ),
        "t_verify_per_position_s": (slope, source + "; same fit"),
        "t_prefill_per_token_s": (measured.t_prefill_per_token_s, source),
        "batch_slope": (
            slope_b,
            source + f"; t_verify(gamma, b) = t_verify(gamma, 1) * (1 + batch_slope * (b - 1)) "
            f"least squares over gamma {list(gammas)} x b {list(batches)}, one batched pass of b "
            f"sessions (ms): "
            + "; ".join(f"gamma {g}: " + ", ".join(f"{1e3 * curve[g, b]:.2f}" for b in batches) for g in gammas),
        ),
    }
    lines = [f"[{name}]"]
    for key, (value, why) in values.items():
        lines.append(f"{key} = {value:.6g}")
        lines.append(f"{key}_source = {json.dumps(why)}")  # a JSON string is a TOML basic string
    return "\n".join(lines)
