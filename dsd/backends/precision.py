"""``dtype = "auto"``: the precision a model pair runs in, chosen by timing it on this machine.

Speculative decoding pays only where a verification pass over a few positions costs about one
decode step. Whether it does in a given precision depends on the CPU's kernels, not on one
flag: bfloat16 is fast with AMX and with AVX512-BF16 alone, emulated and slow elsewhere;
float32's small-batch GEMM doubles on some CPUs. So every candidate precision that is exact for
speculative decoding (the target's own passes decide every committed token) is loaded with its
kernel paths chosen (dsd.backends.kernels) and timed:

- the target: one position (t_ar) and passes of ``VERIFY_POSITIONS`` (gamma 2 and 4);
- the draft: one position (t_draft), a layer draft or a feature draft (on its own features).

A candidate is timed only where it runs: one whose load or first pass fails on this CPU is
dropped with a line saying so (float32, the reference, always runs). A precision forced by hand
that this CPU cannot run is refused before anything loads (``check_runs``).

``choose`` picks the target's precision: the one whose verification passes are fastest, if they
beat float32's by more than ``tie_margin`` while its decode step is at most ``ar_slack`` slower
than float32's; else float32. The draft's: its fastest step, a tie keeping the target's. The
CPU-flag rule (``first_guess``) is recorded beside the measurement, never used in its place.
Both run on one torch thread, as the services do by default and the main job pins them. A choice
is kept on disk per (CPU, PyTorch, pair), so the services and the orchestrator of one machine
resolve "auto" alike and the timing runs once.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsd.backends.protocol import LanguageModel
from dsd.backends.machine import CpuCapability, cache_dir, cpu_flags, machine_key, weights_digest

CANDIDATES = ("float32", "bfloat16")
VERIFY_POSITIONS = (3, 5)
CONTEXT_TOKENS = 100
TIMED_PASSES = 12


@dataclass(frozen=True)
class PrecisionTimes:
    """One candidate's measured times (medians, seconds)."""

    dtype: str
    t_ar_s: float
    t_verify_s: dict[int, float]  # positions -> one target pass over that many new positions
    t_draft_s: float
    kernels: str = ""  # the kernel paths chosen (KernelChoice.summary)

    @property
    def verify_s(self) -> float:
        """The mean of the verification passes: what the target's choice minimises."""
        return statistics.fmean(self.t_verify_s.values())

    def ratios(self) -> dict[str, float]:
        return {f"verify{n}_over_ar": round(t / self.t_ar_s, 4) for n, t in self.t_verify_s.items()} | {
            "draft_step_over_ar": round(self.t_draft_s / self.t_ar_s, 4)
        }


@dataclass(frozen=True)
class PrecisionChoice:
    target_dtype: str
    draft_dtype: str
    first_guess: str  # what the CPU-flag rule would have said
    times: tuple[PrecisionTimes, ...]
    machine: str
    cpu: dict[str, Any] = field(default_factory=dict)  # CpuCapability.to_dict(): the CPU and what runs on it
    dropped: dict[str, Any] = field(default_factory=dict)  # candidate -> why it could not be timed here

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_dtype": self.target_dtype,
            "draft_dtype": self.draft_dtype,
            "first_guess": self.first_guess,
            "machine": self.machine,
            "cpu": self.cpu,
            "dropped": self.dropped,
            "candidates": [asdict(t) | {"ratios": t.ratios()} for t in self.times],
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PrecisionChoice:
        times = tuple(
            PrecisionTimes(
                c["dtype"],
                c["t_ar_s"],
                {int(n): t for n, t in c["t_verify_s"].items()},
                c["t_draft_s"],
                c.get("kernels", ""),
            )
            for c in values["candidates"]
        )
        return cls(
            values["target_dtype"],
            values["draft_dtype"],
            values["first_guess"],
            times,
            values["machine"],
            values.get("cpu", {}),
            values.get("dropped", {}),
        )


def choose(times: list[PrecisionTimes], tie_margin: float = 0.03, ar_slack: float = 0.05) -> tuple[str, str]:
    """(target dtype, draft dtype) from the measured table; float32 must be in it."""
    by_dtype = {t.dtype: t for t in times}
    if "float32" not in by_dtype:
        raise ValueError(f"the table must hold float32 (the reference), got {sorted(by_dtype)}")
    base = by_dtype["float32"]
    better = [
        t
        for t in times
        if t.verify_s < (1.0 - tie_margin) * base.verify_s and t.t_ar_s <= (1.0 + ar_slack) * base.t_ar_s
    ]
    target = min(better, key=lambda t: t.verify_s).dtype if better else "float32"
    fastest = min(times, key=lambda t: t.t_draft_s)
    draft = fastest.dtype if fastest.t_draft_s < (1.0 - tie_margin) * by_dtype[target].t_draft_s else target
    return target, draft


def first_guess(device: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The flag rule: bfloat16 on a GPU or where the CPU has bfloat16 instructions (AMX or
    AVX512-BF16 on x86, BF16 on aarch64), else float32. A guess to record beside the measurement."""
    if device.startswith("cuda"):
        return "bfloat16"
    return "bfloat16" if cpu_flags(cpuinfo) & {"amx_bf16", "avx512_bf16", "bf16"} else "float32"


def check_runs(
    setting: str, dtype: str, capability: CpuCapability | None = None, log: Callable[[str], object] | None = None
) -> None:
    """Refuse a precision set by hand that this CPU cannot run (a probe pass of the operations a
    decoder layer uses fails), naming the setting, the CPU and what it lacks; say so where it runs
    only emulated (bfloat16 without AVX512-BF16, AMX or an aarch64 BF16 unit is several times slower)."""
    cpu = capability or CpuCapability.of_this_machine()
    why = _probe_fails(dtype)
    if why:
        raise ValueError(
            f"{setting} = {dtype!r}: this CPU cannot run it ({cpu.describe()}): {why}; "
            f"use 'auto' (timed here) or 'float32'"
        )
    if not cpu.native(dtype) and log is not None:
        log(
            f"{setting} = {dtype!r} runs emulated on {cpu.describe()}: expect it slower than float32; 'auto' times both"
        )


def _probe_fails(dtype: str) -> str:
    """'' if a small pass of linear, matmul, softmax and RMS norm runs in ``dtype`` here, else the error."""
    import torch
    import torch.nn.functional as F

    from dsd.backends.torch_lm import DTYPES

    kind = DTYPES[dtype]
    try:
        x = torch.randn(1, 3, 64).to(kind)
        h = F.linear(x, torch.randn(64, 64).to(kind))
        scores = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
        (scores @ h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).float().sum().item()
    except (RuntimeError, NotImplementedError, TypeError) as error:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return ""


def measure(
    target_path: str,
    draft_path: str,
    candidates: tuple[str, ...] = CANDIDATES,
    threads: int = 1,
    kernel_paths: tuple[str, ...] | None = None,
    dropped: dict[str, str] | None = None,
    log: Callable[[str], object] | None = None,
) -> list[PrecisionTimes]:
    """Time every candidate precision of the pair that runs on this machine on ``threads`` torch
    threads, the passes interleaved across candidates so that a drift of the machine's speed meets
    all; a candidate that fails to load or to pass is left out, its reason put in ``dropped``."""
    import torch

    from dsd.backends.kernels import PATHS
    from dsd.backends.torch_lm import TorchLM, TorchLMConfig

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        paths = PATHS if kernel_paths is None else kernel_paths
        models = {}
        for dtype in candidates:
            try:
                pair = (
                    TorchLM.load(TorchLMConfig(target_path, dtype, kernel_paths=paths)),
                    _load_draft(draft_path, dtype, paths),
                )
                for model in pair:  # a path or kernel this CPU refuses fails here
                    model.logits("precision-probe", [1, 2, 3], 3)
                    model.release("precision-probe")
                models[dtype] = pair
            except (RuntimeError, NotImplementedError) as error:
                if dtype == "float32":
                    raise
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                if dropped is not None:
                    dropped[dtype] = reason
                if log is not None:
                    log(f"dtype auto: {dtype} left out on this CPU: {reason}")
        samples = _interleaved_samples(models)
        out = []
        for dtype, (target, _) in models.items():
            choice = target.kernel_choice
            out.append(
                PrecisionTimes(
                    dtype,
                    samples[(dtype, "target", 1)],
                    {n: samples[(dtype, "target", n)] for n in VERIFY_POSITIONS},
                    samples[(dtype, "draft", 1)],
                    choice.summary() if choice else "aten",
                )
            )
        return out
    finally:
        torch.set_num_threads(old)


def _load_draft(draft_path: str, dtype: str, paths: tuple[str, ...]) -> LanguageModel:
    """The draft as the services load it: a feature draft (timed on its own features, as it drafts
    past the last true one) or a layer draft."""
    from dsd.backends.eagle_model import is_eagle_folder

    if is_eagle_folder(draft_path):
        from dsd.backends.eagle_lm import EagleLM

        return EagleLM.load(draft_path, dtype, kernel_paths=paths)
    from dsd.backends.torch_lm import TorchLM, TorchLMConfig

    return TorchLM.load(TorchLMConfig(draft_path, dtype, kernel_paths=paths))


def _interleaved_samples(models: dict[str, Any]) -> dict[tuple[str, str, int], float]:
    """Median seconds per (dtype, role, positions), every candidate's passes in turn per round."""
    vocab = min(m.vocab_size for pair in models.values() for m in pair)
    context = [(7 * i + 11) % vocab for i in range(CONTEXT_TOKENS)]
    jobs = [
        (d, role, n)
        for d in models
        for role, n in [("target", 1), *[("target", n) for n in VERIFY_POSITIONS], ("draft", 1)]
    ]
    samples: dict[tuple[str, str, int], list[float]] = {job: [] for job in jobs}
    for dtype, (target, draft) in models.items():
        for model in (target, draft):
            model.logits("precision", context, 1)
    for round_index in range(TIMED_PASSES + 1):  # the first round warms up
        for dtype, role, n in jobs:
            model = models[dtype][0 if role == "target" else 1]
            extra = [(3 * j + round_index) % vocab for j in range(n)]
            start = time.perf_counter()
            model.logits("precision", context + extra, n)
            if round_index:
                samples[(dtype, role, n)].append(time.perf_counter() - start)
    return {job: statistics.median(values) for job, values in samples.items()}


def cache_path(target_path: str, draft_path: str) -> Path:
    """Where this machine keeps the choice for this pair (XDG cache, or DSD_CACHE_DIR)."""
    import torch

    key = json.dumps(
        [
            machine_key(),
            torch.__version__,
            weights_digest(target_path),
            weights_digest(draft_path),
            CANDIDATES,
            VERIFY_POSITIONS,
        ]
    )
    return cache_dir() / "precision" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def cached_choice(target_path: str, draft_path: str) -> PrecisionChoice | None:
    """The choice this machine keeps for the pair, if it made one (no timing here)."""
    path = cache_path(target_path, draft_path)
    try:
        return PrecisionChoice.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve(
    target_path: str, draft_path: str, device: str = "cpu", log: Callable[[str], object] | None = None
) -> PrecisionChoice:
    """The pair's precision choice on this machine: from the disk cache, else measured and kept."""
    if device.startswith("cuda"):
        guess = first_guess(device)
        return PrecisionChoice(guess, guess, guess, (), device)
    path = cache_path(target_path, draft_path)
    kept = cached_choice(target_path, draft_path)
    if kept is not None:
        return kept
    cpu = CpuCapability.of_this_machine()
    if log is not None:
        log(f"dtype auto: timing the pair in {', '.join(CANDIDATES)} on {cpu.describe()} (once; kept in {path})")
    dropped: dict[str, str] = {}
    times = measure(target_path, draft_path, dropped=dropped, log=log)
    target, draft = choose(times)
    choice = PrecisionChoice(target, draft, first_guess(device), tuple(times), machine_key(), cpu.to_dict(), dropped)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(choice.to_dict(), indent=1))
    tmp.replace(path)
    return choice
