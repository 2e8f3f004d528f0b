"""The Hugging Face backend (``kind = "hf"``): a built model pair, or two model folders that share
a tokenizer, run with torch (dsd/backends/torch_lm.py)."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from dsd.backends.protocol import BackendConfig, LanguageModel

if TYPE_CHECKING:
    from dsd.backends.precision import PrecisionChoice

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")  # dsd.backends.torch_lm.DTYPES
AUTO = "auto"  # timed on this machine (dsd.backends.precision)
KERNEL_CHOICES = ("auto", "aten")  # dsd.backends.kernels: measured paths, or PyTorch's default
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
    # "auto" is resolved here, by timing the pair on this machine, so that every service gets the
    # same precision (the launchers pass the resolved config on); draft_dtype "" follows dtype
    dtype: str = "float32"
    draft_dtype: str = ""
    device: str = "cpu"
    kernels: str = "auto"  # "auto": each linear layer's fastest path, timed at load; "aten"

    def __post_init__(self) -> None:
        pair = Path(self.pair_path).expanduser()
        if self.pair_path and not pair.is_absolute():
            object.__setattr__(self, "pair_path", str(REPO / pair))
        if bool(self.target_path) != bool(self.draft_path):
            raise ValueError("target_path and draft_path go together: give both or neither")
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {self.kernels!r}")
        for key in ("dtype", "draft_dtype"):
            value = getattr(self, key)
            if value not in (*DTYPE_NAMES, AUTO) and not (key == "draft_dtype" and value == ""):
                raise ValueError(f"{key} must be one of {DTYPE_NAMES} or {AUTO!r}, got {value!r}")
        draft_dtype = self.draft_dtype or self.dtype
        if self.device == "cpu":
            _check_forced(("dtype", self.dtype), ("draft_dtype", draft_dtype))
        if AUTO in (self.dtype, draft_dtype):
            choice = self.precision_choice()
            object.__setattr__(self, "dtype", choice.target_dtype if self.dtype == AUTO else self.dtype)
            draft_dtype = choice.draft_dtype if draft_dtype == AUTO else draft_dtype
        object.__setattr__(self, "draft_dtype", draft_dtype)

    def model_paths(self) -> tuple[str, str]:
        """(target folder, draft folder)."""
        if self.target_path:
            return self.target_path, self.draft_path
        pair = Path(self.pair_path).expanduser()
        return str(pair / "target"), str(pair / "draft")

    def precision_choice(self) -> PrecisionChoice:
        """What "auto" resolves to here, with the timings behind it (dsd.backends.precision)."""
        from dsd.backends.eagle_model import is_eagle_folder
        from dsd.backends.precision import resolve

        target, draft = self.model_paths()
        for folder in (target, draft):
            model = (Path(folder).expanduser() / "config.json").is_file() or (
                folder == draft and is_eagle_folder(draft)
            )
            if not model:
                raise ValueError(
                    f"dtype/draft_dtype 'auto' times the pair on this machine, but {folder} holds no "
                    "model (build it first, e.g. `python -m pairs.build`), or give a dtype"
                )
        return resolve(target, draft, self.device, log=_log)

    def check_files(self) -> None:
        if not self.target_path:
            if not (Path(self.pair_path).expanduser() / "manifest.json").is_file():
                raise ValueError(
                    f"'backend.pair_path': expected a model pair folder with a manifest.json "
                    f"(`dsdbed build-pair`), got {self.pair_path!r}"
                )
            return
        for key in ("target_path", "draft_path"):
            value = getattr(self, key)
            if not Path(value).expanduser().is_dir():
                raise ValueError(f"'backend.{key}': expected an existing model folder, got {value!r}")

    def load(self) -> tuple[LanguageModel, LanguageModel]:
        # transformers is imported only here: a synthetic-only service starts in a second, not five.
        from dsd.backends.kernels import ATEN, PATHS
        from dsd.backends.torch_lm import TorchLM, TorchLMConfig
        from dsd.pair_manifest import DRAFT_KINDS, draft_kind, verify_pair

        kind = DRAFT_KINDS[0]
        if not self.target_path:
            pair = Path(self.pair_path).expanduser()
            if not (pair / "manifest.json").is_file():
                raise FileNotFoundError(
                    f"no model pair at {pair} (manifest.json missing); build it with `dsdbed build-pair --out {pair}`"
                )
            kind = draft_kind(verify_pair(pair))
        target_path, draft_path = self.model_paths()
        paths = PATHS if self.kernels == "auto" else (ATEN,)
        if kind == "eagle":
            if self.device != "cpu":
                raise ValueError(f"backend.device: a feature draft's pair runs on 'cpu' only, got {self.device!r}")
            from dsd.backends.eagle_lm import EagleLM
            from dsd.backends.feature_target import FeatureTorchLM

            target: TorchLM = FeatureTorchLM.load_for_draft(
                TorchLMConfig(target_path, self.dtype, self.device, paths), draft_path
            )
            draft: LanguageModel = EagleLM.load(draft_path, self.draft_dtype, target.eos_token_id, paths)
        else:
            target = TorchLM.load(TorchLMConfig(target_path, self.dtype, self.device, paths))
            draft = TorchLM.load(TorchLMConfig(draft_path, self.draft_dtype, self.device, paths))
        if draft.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft vocab {draft.vocab_size} != target vocab {target.vocab_size}: the pair must share a tokenizer"
            )
        return draft, target


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@functools.cache
def _check_forced(*settings: tuple[str, str]) -> None:
    """Refuse a precision set by hand that this CPU cannot run, once per process and setting."""
    from dsd.backends.precision import check_runs

    for key, dtype in settings:
        if dtype != AUTO:
            check_runs(f"backend.{key}", dtype, log=_log)
