"""This machine, as choices kept per machine are keyed: its CPU model and flags (and any switch
that limits the instructions the libraries use), what this PyTorch runs on it (``CpuCapability``),
a model folder's identity, and where such choices are kept (dsd.backends.precision,
dsd.backends.kernels).

``/proc/cpuinfo`` differs by architecture: x86 names the model in ``model name`` and the
instructions in ``flags``; aarch64 has ``Features`` and, at most, ``CPU implementer`` and
``CPU part``. Both are read here, so nothing downstream assumes x86.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ISA_SWITCHES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
FLAG_FIELDS = ("flags", "Features")  # x86, aarch64
MODEL_FIELDS = ("model name", "Model", "Hardware")
# Arm's part numbers of the server cores a user may rent (Graviton 2/3/4, Ampere Altra, Grace)
ARM_PARTS = {"0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd49": "Neoverse-N2", "0xd4f": "Neoverse-V2"}


def _cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
    """The first value of each field of the first processor block (empty if unreadable)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's instruction-set flags (x86 ``flags``, aarch64 ``Features``)."""
    fields = _cpuinfo_fields(cpuinfo)
    return set(next((fields[f] for f in FLAG_FIELDS if f in fields), "").split())


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) Platinum ...", "Neoverse-N1 (aarch64)"),
    as results name the CPU."""
    fields = _cpuinfo_fields(cpuinfo)
    named = next((fields[f] for f in MODEL_FIELDS if fields.get(f)), "")
    if named:
        return named
    part = fields.get("CPU part", "")
    if part:
        return f"{ARM_PARTS.get(part, 'Arm part ' + part)} ({platform.machine() or 'aarch64'})"
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class CpuCapability:
    """What this PyTorch build runs on this CPU, as PyTorch and oneDNN report it (so a switch that
    holds the libraries to a smaller instruction set counts, as it does for the kernels)."""

    model: str
    arch: str  # platform.machine(): x86_64, aarch64, ...
    aten: str  # ATen's vector capability: AVX512, AVX2, DEFAULT, SVE256, ...
    has_mkl: bool  # MKL built in (x86 builds)
    has_onednn: bool  # oneDNN built in
    onednn_bf16: bool  # oneDNN runs bfloat16 matmuls natively on this CPU
    onednn_fp16: bool

    @classmethod
    def of_this_machine(cls) -> CpuCapability:
        import torch

        mkldnn = torch.ops.mkldnn
        return cls(
            cpu_model(),
            platform.machine(),
            torch.backends.cpu.get_cpu_capability(),
            bool(torch._C.has_mkl),
            bool(torch.backends.mkldnn.is_available()),
            bool(hasattr(mkldnn, "_is_mkldnn_bf16_supported") and mkldnn._is_mkldnn_bf16_supported()),
            bool(hasattr(mkldnn, "_is_mkldnn_fp16_supported") and mkldnn._is_mkldnn_fp16_supported()),
        )

    def native(self, dtype: str) -> bool:
        """Whether this CPU computes ``dtype`` matmuls natively (else PyTorch emulates them)."""
        return {"float32": True, "float64": True, "bfloat16": self.onednn_bf16, "float16": self.onednn_fp16}[dtype]

    def describe(self) -> str:
        """One line: the CPU and what the libraries use of it."""
        lacks = [d for d in ("bfloat16", "float16") if not self.native(d)]
        return (
            f"{self.model} ({self.arch}, ATen {self.aten}" + (f"; no native {', '.join(lacks)}" if lacks else "") + ")"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"isa_switches": {k: os.environ[k] for k in ISA_SWITCHES if os.environ.get(k)}}


def machine_key(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU model and its flags, as the kernels see them."""
    model = cpu_model(cpuinfo)
    flags = " ".join(sorted(cpu_flags(cpuinfo)))
    isa = ",".join(f"{k}={os.environ[k]}" for k in ISA_SWITCHES if os.environ.get(k))
    return f"{model} [{hashlib.sha256(flags.encode()).hexdigest()[:12]}]" + (f" {isa}" if isa else "")


def weights_digest(path: str) -> str:
    """Names, sizes and modification times of a model folder's files: a rebuilt model is new."""
    folder = Path(path)
    parts = sorted(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in folder.glob("*") if p.is_file())
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """Where this machine keeps its choices: $DSD_CACHE_DIR, else the XDG cache's dsd-testbed."""
    return Path(
        os.environ.get("DSD_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dsd-testbed"
    )
