"""This machine, as choices kept per machine are keyed: its CPU model and flags (and any switch
that limits the instructions the libraries use), a model folder's identity, and where such
choices are kept (dsd.backends.precision, dsd.backends.kernels)."""
from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

ISA_SWITCHES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) Platinum ..."), as results name the CPU."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    return next((line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("model name")),
                platform.processor() or platform.machine())


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
    return Path(os.environ.get("DSD_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                / "dsd-testbed")
