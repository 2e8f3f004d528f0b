"""Matrix-product paths for a model's linear layers, chosen per pass size by measurement.

A decode step multiplies one row by every weight matrix; a verification multiplies a few rows.
Both should cost about one read of the weights (the memory-bound regime). Which library call
gets there depends on the CPU and the precision: on some CPUs the default float32 GEMM for 2-8
rows repacks every weight matrix on every call and costs twice a one-row pass. So each linear
layer keeps its weights in the forms the candidate paths want:

- ``aten``: ``torch.nn.functional.linear`` (MKL or oneDNN chosen by PyTorch per call);
- ``mkl_packed``: MKL's GEMM on weights packed once at load (float32 only);
- ``onednn_packed``: oneDNN's matmul on weights reordered once at load to its blocked layout;

and ``choose_paths`` times every path on the model's own weights, per group of equally shaped
matrices and per bucket of row counts, and keeps the fastest (``aten`` unless another is faster
by more than ``KernelConfig.margin``). Passes of more rows than the largest bucket (a prefill)
stay on ``aten``. All paths compute the same products up to float rounding.

Timing is only as good as the moment it runs in: two services loading their models at once on
a 2-core machine time each other's load. So a choice is kept on disk per (CPU, PyTorch, model
folder, precision) (``stored_choice``), made once where nothing else runs (the orchestrator's
``dtype = "auto"`` timing, or the first load), and every later load of that model here takes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dsd.backends.machine import CpuCapability, cache_dir, machine_key, weights_digest

ATEN, MKL_PACKED, ONEDNN_PACKED = "aten", "mkl_packed", "onednn_packed"
PATHS = (ATEN, MKL_PACKED, ONEDNN_PACKED)
BUCKETS = (1, 2, 3, 4, 8, 16)  # a pass of n rows runs as the smallest bucket >= n
# oneDNN lays packed weights out for an expected row count: 4 serves 1-16 rows within a few
# percent of the best layout for each, where a layout for 1 row costs up to 1.5x at 2-3 rows
ONEDNN_ROWS_HINT = 4


@dataclass(frozen=True)
class KernelConfig:
    paths: tuple[str, ...] = PATHS  # the candidates; ("aten",) keeps PyTorch's default
    repeats: int = 5  # timings per (group, bucket, path); the minimum counts
    margin: float = 0.03  # another path must beat aten by this share to be chosen

    def __post_init__(self) -> None:
        unknown = [p for p in self.paths if p not in PATHS]
        if unknown or ATEN not in self.paths:
            raise ValueError(f"paths must be a subset of {PATHS} that holds {ATEN!r}, got {self.paths!r}")
        if not (isinstance(self.repeats, int) and self.repeats >= 1):
            raise ValueError(f"repeats must be a whole number >= 1, got {self.repeats!r}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin!r}")


def bucket_of(rows: int) -> int | None:
    """The bucket a pass of ``rows`` rows runs in; None beyond the largest (aten)."""
    return next((b for b in BUCKETS if rows <= b), None)


def available_paths(
    dtype: torch.dtype, wanted: tuple[str, ...] = PATHS, capability: CpuCapability | None = None
) -> tuple[str, ...]:
    """The paths this PyTorch build runs for weights of ``dtype`` on this CPU (or on the CPU that
    ``capability`` describes): MKL's packed GEMM where MKL is built in (x86) and the weights are
    float32; oneDNN's where oneDNN is built in and runs the precision natively (its bfloat16
    path refuses a CPU without AVX512-BF16/AVX-NE-CONVERT instead of emulating)."""
    cpu = capability or _this_cpu()
    found = [ATEN]
    if MKL_PACKED in wanted and dtype == torch.float32 and cpu.has_mkl:
        found.append(MKL_PACKED)
    onednn_runs = {torch.float32: True, torch.bfloat16: cpu.onednn_bf16}.get(dtype, False)
    if ONEDNN_PACKED in wanted and cpu.has_onednn and onednn_runs:
        found.append(ONEDNN_PACKED)
    return tuple(found)


@functools.cache
def _this_cpu() -> CpuCapability:
    return CpuCapability.of_this_machine()


def report_dropped(path: str, dtype: torch.dtype, why: str) -> None:
    """A path that this CPU refused is dropped with a line on stderr, never a crash."""
    print(
        f"kernels: {path} dropped for {str(dtype).removeprefix('torch.')} on {_this_cpu().describe()}: {why}",
        file=sys.stderr,
        flush=True,
    )


class PathLinear(nn.Module):
    """A linear layer that runs each pass on the path chosen for its row count."""

    def __init__(self, linear: nn.Linear, paths: tuple[str, ...]) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # shared: tied weights stay tied
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.forms: dict[str, torch.Tensor] = {}
        self.dropped: dict[str, str] = {}  # path -> why this CPU refused it
        self.choice: dict[int, str] = {}  # bucket -> path
        weight = linear.weight.detach()
        packers = {
            MKL_PACKED: lambda: torch.ops.mkl._mkl_reorder_linear_weight(weight, 1),
            ONEDNN_PACKED: lambda: torch.ops.mkldnn._reorder_linear_weight(weight, ONEDNN_ROWS_HINT),
        }
        for path in (p for p in paths if p in packers):
            try:
                self.forms[path] = packers[path]()
            except (RuntimeError, AttributeError, NotImplementedError) as error:
                self.drop(path, error)

    def drop(self, path: str, error: BaseException) -> None:
        """Forget a path this CPU or build refused (its packing or its first pass failed)."""
        self.forms.pop(path, None)
        self.dropped[path] = str(error).splitlines()[0] if str(error) else type(error).__name__
        self.choice = {b: (ATEN if p == path else p) for b, p in self.choice.items()}

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features] on the given path."""
        if path == MKL_PACKED:
            rows = x.reshape(-1, self.in_features)
            out = torch.ops.mkl._mkl_linear(rows, self.forms[MKL_PACKED], self.weight, self.bias, rows.shape[0])
            shaped: torch.Tensor = out.reshape(*x.shape[:-1], self.out_features)
            return shaped
        if path == ONEDNN_PACKED:
            packed: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, self.forms[ONEDNN_PACKED], self.bias, "none", [], ""
            )
            return packed
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bucket = bucket_of(x.numel() // self.in_features)
        path = self.choice.get(bucket, ATEN) if bucket is not None else ATEN
        try:
            return self.run(path, x)
        except (RuntimeError, NotImplementedError) as error:
            if path == ATEN:
                raise
            self.drop(path, error)  # a kept choice this CPU cannot run after all
            report_dropped(path, x.dtype, f"a pass failed: {self.dropped[path]}")
            return self.run(ATEN, x)

    def keep(self, choice: dict[int, str]) -> None:
        """Take the chosen paths (aten where a path has no form here) and free the forms no bucket uses."""
        self.choice = {b: (p if p == ATEN or p in self.forms else ATEN) for b, p in choice.items()}
        for path in [p for p in self.forms if p not in self.choice.values()]:
            del self.forms[path]


@dataclass
class KernelChoice:
    """What ``choose_paths`` measured and chose: per shape group 'out x in', per bucket, the
    path and every candidate's time (milliseconds for the whole group)."""

    dtype: str
    choice: dict[str, dict[int, str]] = field(default_factory=dict)
    times_ms: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "choice": {g: {str(b): p for b, p in c.items()} for g, c in self.choice.items()},
            "times_ms": {
                g: {str(b): {p: round(t, 4) for p, t in ts.items()} for b, ts in by.items()}
                for g, by in self.times_ms.items()
            },
        }

    def summary(self) -> str:
        """One line: per bucket, how many shape groups use each non-default path."""
        used = sorted({(b, p) for c in self.choice.values() for b, p in c.items() if p != ATEN})
        return ", ".join(f"{b} rows: {p}" for b, p in used) or "aten everywhere"


def install_paths(model: nn.Module, config: KernelConfig) -> list[PathLinear]:
    """Replace every nn.Linear of ``model`` by a PathLinear (aten for every bucket until chosen)
    holding the forms of ``config.paths`` this build can run."""
    dtype = next(model.parameters()).dtype
    paths = available_paths(dtype, config.paths)
    installed = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                layer = PathLinear(child, paths)
                setattr(parent, name, layer)
                installed.append(layer)
    _report_dropped(installed, dtype)
    return installed


def _report_dropped(layers: list[PathLinear], dtype: torch.dtype) -> None:
    """One line per path that some layer dropped, naming the CPU and the library's reason."""
    reasons: dict[str, str] = {}
    for layer in layers:
        for path, why in layer.dropped.items():
            reasons.setdefault(path, why)
    for path, why in reasons.items():
        report_dropped(path, dtype, why)


def install_kept_paths(
    model: nn.Module, folder: str, dtype: str, paths: tuple[str, ...], store: bool = True
) -> KernelChoice | None:
    """Put ``model`` (loaded from ``folder`` in ``dtype``) on the paths this machine keeps for it,
    else on the ones timed now (and keep them, with ``store``); None where ``paths`` is aten only."""
    if paths == (ATEN,):
        return None
    kept = stored_choice(folder, dtype) if store else None
    used = tuple({ATEN, *(p for c in (kept or {}).values() for p in c.values())} & set(paths))
    layers = install_paths(model, KernelConfig(used if kept is not None else paths))
    if kept is not None:
        apply_choice(layers, kept)
        return KernelChoice(dtype, kept)
    choice = choose_paths(layers, KernelConfig(paths), dtype)
    if store:
        store_choice(folder, choice)
    return choice


def group_of(layer: PathLinear) -> str:
    return f"{layer.out_features}x{layer.in_features}"


def apply_choice(layers: list[PathLinear], choice: dict[str, dict[int, str]]) -> None:
    """Take a stored choice (group -> bucket -> path); a group it does not name stays on aten."""
    for layer in layers:
        layer.keep(choice.get(group_of(layer), {}))


def choose_paths(
    layers: list[PathLinear], config: KernelConfig, dtype: str, clock: Callable[[], float] = time.perf_counter
) -> KernelChoice:
    """Time every path on each group of equally shaped layers (all of them in a row, as a pass
    streams them) for every bucket, keep the fastest per (group, bucket), free the rest."""
    groups: dict[str, list[PathLinear]] = {}
    for layer in layers:
        groups.setdefault(group_of(layer), []).append(layer)
    result = KernelChoice(dtype)
    with torch.inference_mode():
        for name, group in groups.items():
            # a group's layers hold the same forms; a path dropped at one bucket is gone for the next
            times = {b: _time_paths(group, [ATEN, *group[0].forms], b, config.repeats, clock) for b in BUCKETS}
            choice = {b: _fastest(t, config.margin) for b, t in times.items()}
            for layer in group:
                layer.keep(choice)
            result.choice[name], result.times_ms[name] = choice, times
    return result


def _time_paths(
    group: list[PathLinear], paths: list[str], rows: int, repeats: int, clock: Callable[[], float]
) -> dict[str, float]:
    """Milliseconds for the whole group at ``rows`` rows per path: the minimum over repeats,
    the paths interleaved so that a drift of the machine's speed meets them all alike."""
    x = torch.randn(1, rows, group[0].in_features, dtype=group[0].weight.dtype)  # as a pass feeds it
    best = {p: float("inf") for p in paths}
    for _ in range(repeats + 1):  # the first round warms caches and packs
        for path in [p for p in paths if p in best]:
            start = clock()
            try:
                for layer in group:
                    layer.run(path, x)
            except (RuntimeError, NotImplementedError) as error:
                if path == ATEN:
                    raise
                for layer in group:
                    layer.drop(path, error)
                report_dropped(path, x.dtype, f"its first pass failed: {group[0].dropped[path]}")
                del best[path]
                continue
            best[path] = min(best[path], clock() - start)
    return {p: 1e3 * t for p, t in best.items()}


def _fastest(times_ms: dict[str, float], margin: float) -> str:
    """aten unless another path beats it by more than ``margin``."""
    path = min(times_ms, key=lambda p: times_ms[p])
    return path if times_ms[path] < (1.0 - margin) * times_ms[ATEN] else ATEN


def stored_choice_path(model_folder: str, dtype: str) -> Path:
    """Where this machine keeps the kernel choice of a model folder in a precision (XDG cache, or
    DSD_CACHE_DIR); keyed by the CPU, PyTorch, the folder's files and the precision."""
    key = json.dumps([machine_key(), torch.__version__, weights_digest(model_folder), dtype, PATHS, BUCKETS])
    return cache_dir() / "kernels" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def stored_choice(model_folder: str, dtype: str) -> dict[str, dict[int, str]] | None:
    """The kept choice (group -> bucket -> path), or None."""
    try:
        data = json.loads(stored_choice_path(model_folder, dtype).read_text())
        return {g: {int(b): p for b, p in c.items() if p in PATHS} for g, c in data["choice"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store_choice(model_folder: str, choice: KernelChoice) -> None:
    path = stored_choice_path(model_folder, choice.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(choice.to_dict(), indent=1))
    tmp.replace(path)
