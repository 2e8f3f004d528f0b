"""The Hugging Face backend (``kind = "hf"``): a built model pair, or two model folders that share
a tokenizer, run with torch (dsd/backends/torch_lm.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dsd.backends.protocol import BackendConfig

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")   # dsd.backends.torch_lm.DTYPES
AUTO = "auto"        # bfloat16 where it is fast (a GPU, or a CPU with AMX), else float32
REPO = Path(__file__).resolve().parents[2]
DEFAULT_PAIR = REPO / "models" / "default-pair"


@dataclass(frozen=True)
class HfBackendConfig(BackendConfig):
    kind: ClassVar[str] = "hf"
    # a folder with target/ and draft/ (Hugging Face model folders) and a manifest.json, or two
    # explicit model paths that share a tokenizer; a relative pair_path is relative to the
    # repository (models/...), so every launcher's services find the same folder
    pair_path: str = str(DEFAULT_PAIR)
    target_path: str = ""
    draft_path: str = ""
    dtype: str = "float32"          # or "auto", resolved here so that every service gets the same
    device: str = "cpu"

    def __post_init__(self) -> None:
        pair = Path(self.pair_path).expanduser()
        if self.pair_path and not pair.is_absolute():
            object.__setattr__(self, "pair_path", str(REPO / pair))
        if self.dtype == AUTO:
            object.__setattr__(self, "dtype", fast_dtype(self.device))
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES} or {AUTO!r}, got {self.dtype!r}")
        if bool(self.target_path) != bool(self.draft_path):
            raise ValueError("target_path and draft_path go together: give both or neither")

    def check_files(self) -> None:
        if not self.target_path:
            if not (Path(self.pair_path).expanduser() / "manifest.json").is_file():
                raise ValueError(f"'backend.pair_path': expected a model pair folder with a manifest.json "
                                 f"(`dsdbed build-pair`), got {self.pair_path!r}")
            return
        for key in ("target_path", "draft_path"):
            value = getattr(self, key)
            if not Path(value).expanduser().is_dir():
                raise ValueError(f"'backend.{key}': expected an existing model folder, got {value!r}")

    def load(self):
        # transformers is imported only here: a synthetic-only service starts in a second, not five.
        from dsd.backends.torch_lm import TorchLM, TorchLMConfig

        from dsd.pair_manifest import DRAFT_KINDS, draft_kind, verify_pair

        if self.target_path:
            target_path, draft_path = self.target_path, self.draft_path
            kind = DRAFT_KINDS[0]
        else:
            pair = Path(self.pair_path).expanduser()
            if not (pair / "manifest.json").is_file():
                raise FileNotFoundError(
                    f"no model pair at {pair} (manifest.json missing); build it with "
                    f"`dsdbed build-pair --out {pair}`")
            kind = draft_kind(verify_pair(pair))
            target_path, draft_path = str(pair / "target"), str(pair / "draft")
        if kind == "eagle":
            if self.device != "cpu":
                raise ValueError(f"backend.device: a feature draft's pair runs on 'cpu' only, got {self.device!r}")
            from dsd.backends.eagle_lm import EagleLM
            from dsd.backends.feature_target import FeatureTorchLM
            target = FeatureTorchLM.load_for_draft(TorchLMConfig(target_path, self.dtype, self.device), draft_path)
            draft = EagleLM.load(draft_path, self.dtype, target.eos_token_id)
        else:
            target = TorchLM.load(TorchLMConfig(target_path, self.dtype, self.device))
            draft = TorchLM.load(TorchLMConfig(draft_path, self.dtype, self.device))
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"draft vocab {draft.vocab_size} != target vocab {target.vocab_size}: "
                             "the pair must share a tokenizer")
        return draft, target


def fast_dtype(device: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """bfloat16 on a GPU or on a CPU with AMX tiles for it (there a pass over a few positions
    costs about one decode step); float32 on other CPUs, where bfloat16 matmuls are emulated and
    slower than float32."""
    if device.startswith("cuda"):
        return "bfloat16"
    try:
        flags = Path(cpuinfo).read_text()
    except OSError:
        return "float32"
    return "bfloat16" if " amx_bf16" in flags else "float32"
