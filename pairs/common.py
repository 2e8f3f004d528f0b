"""What every pair family's build shares: the edges (log, CPU flags, versions, clocks, the
output folder) and loading a built pair back.

Imported by pairs.stdlib_gpt2 and pairs.smollm2, importing neither: the command line
(pairs.build) is the one module that knows both families.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from collections.abc import Iterator

import numpy as np
import tokenizers
import torch
import transformers

from dsd.pair_manifest import sha256_file, verify_pair


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_bf16(precision: str, flags: set[str]) -> bool:
    # Without AMX (or at least AVX512-BF16) bf16 matmuls are emulated: 20-40x slower here.
    return precision == "bf16" or (precision == "auto" and "amx_bf16" in flags)


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def warmup_steps(steps: int, warmup_pct: float) -> int:
    return max(1, round(steps * warmup_pct / 100))


@contextlib.contextmanager
def torch_settings(threads: int) -> Iterator[None]:
    """Deterministic kernels and a fixed thread count for the build, restored afterwards (the
    caller may be a test process with its own settings)."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


class PhaseTimer:
    """Wall time per phase, and this process's CPU time beside it: on a shared machine a wall
    time well above cpu_s / threads means the build was waiting for other work."""

    def __init__(self) -> None:
        self.t0_s = time.perf_counter()
        self.phases_s: dict[str, float] = {}
        self.phases_cpu_s: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start_s, start_cpu_s = time.perf_counter(), time.process_time()
        log(f"[{name}] start, elapsed {start_s - self.t0_s:.1f}s")
        yield
        self.phases_s[name] = round(time.perf_counter() - start_s, 3)
        self.phases_cpu_s[name] = round(time.process_time() - start_cpu_s, 3)
        log(f"[{name}] done in {self.phases_s[name]:.1f}s (cpu {self.phases_cpu_s[name]:.1f}s)")

    def total_s(self) -> float:
        return round(time.perf_counter() - self.t0_s, 3)

    def manifest_fields(self) -> dict:
        return {"phases_s": self.phases_s, "phases_cpu_s": self.phases_cpu_s, "build_s": self.total_s()}


# ---- the output folder -------------------------------------------------------------------------


def prepare_out_dir(out_dir: Path, overwrite: bool) -> Path:
    """Build into a sibling work folder and rename at the end: a crash never leaves a half pair
    under the real name."""
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass --force to replace it")
    work_dir = out_dir.with_name(out_dir.name + ".building")
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    return work_dir


def finish_out_dir(work_dir: Path, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    work_dir.rename(out_dir)


@contextlib.contextmanager
def building(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """The work folder to build in: renamed to out_dir when the body returns, removed when it
    raises."""
    work_dir = prepare_out_dir(out_dir, overwrite)
    try:
        yield work_dir
        finish_out_dir(work_dir, out_dir)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise


def load_pair(folder: Path | str):
    """verify_pair, then (tokenizer, target, draft, manifest), both models in eval mode."""
    folder = Path(folder)
    manifest = verify_pair(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    target = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "target")).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "draft")).eval()
    return tokenizer, target, draft, manifest


def is_heldout(key: str, heldout_pct: float) -> bool:
    """Whether a build holds out the item named ``key`` (a corpus file's path, a rendered prompt's
    token ids): by a hash of the key, so an item stays on its side from build to build."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % 10_000
    return bucket < heldout_pct * 100


def manifest_field(pair_dir: Path, name: str):
    """A field of the pair's manifest.json, None when there is none."""
    path = pair_dir / "manifest.json"
    return json.loads(path.read_text()).get(name) if path.is_file() else None


def continued_from(init_draft: Path | None, weights_file: str, alpha_before: dict) -> dict:
    """The manifest's continued_from field when a build trained on from init_draft (else none):
    the start's weights hash, its pair's commit and its held-out acceptance before training."""
    if init_draft is None:
        return {}
    return {
        "continued_from": {
            "draft_sha256": sha256_file(init_draft / weights_file),
            "manifest_git_commit": manifest_field(init_draft.parent, "git_commit"),
            "heldout_alpha_before": alpha_before,
        }
    }
