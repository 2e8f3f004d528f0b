"""Build a (draft, target) pair from a backend config: the one place that knows every backend."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsd.backends.acceptance_trace import AcceptanceTrace, read_rounds_csv
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM, parse_alpha_classes

BACKEND_KINDS = ("synthetic", "hf")
DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")   # dsd.backends.torch_lm.DTYPES
DEFAULT_PAIR = Path(__file__).resolve().parents[2] / "models" / "default-pair"


@dataclass(frozen=True)
class BackendConfig:
    kind: str = "synthetic"
    # hf: a folder with target/ and draft/ (Hugging Face model folders) and a manifest.json, or
    # two explicit model paths that share a tokenizer.
    pair_path: str = str(DEFAULT_PAIR)
    target_path: str = ""
    draft_path: str = ""
    dtype: str = "float32"
    device: str = "cpu"
    # synthetic
    alpha: float = 0.8
    vocab_size: int = 512
    seed: int = 0
    eos_prob: float = 0.0
    # synthetic: replay a real pair's per-round acceptance instead of i.i.d. alpha
    # (dsd/backends/acceptance_trace.py): a rounds.csv path, or the rounds inline as
    # "proposed:accepted,..." (what the launchers send the services)
    acceptance_trace: str = ""
    acceptance_rounds: str = ""
    acceptance: str = "iid"     # or "stratified": every request realises alpha (dsd.backends.acceptance)
    # synthetic: alpha per prompt class, "token:alpha,..." (a prompt's first token says its class)
    alpha_classes: str = ""

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise ValueError(f"backend kind must be one of {BACKEND_KINDS}, got {self.kind!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if bool(self.target_path) != bool(self.draft_path):
            raise ValueError("target_path and draft_path go together: give both or neither")
        if self.acceptance_trace and self.acceptance_rounds:
            raise ValueError("acceptance_trace and acceptance_rounds: give one (a rounds.csv, or its rounds inline)")
        if (self.acceptance_trace or self.acceptance_rounds) and self.kind != "synthetic":
            raise ValueError(f"acceptance_trace is for the synthetic backend (a real pair has its own acceptance), "
                             f"got kind={self.kind!r}")
        if (self.acceptance_trace or self.acceptance_rounds) and self.acceptance != "iid":
            raise ValueError(f"acceptance_trace replaces acceptance={self.acceptance!r}: the trace decides acceptance")
        if self.kind == "synthetic":
            self.synthetic()          # validates alpha, vocab_size, eos_prob, acceptance, the trace

    def trace(self) -> AcceptanceTrace | None:
        """The acceptance trace to replay, or None (acceptance by alpha)."""
        if self.acceptance_rounds:
            return AcceptanceTrace.from_text(self.acceptance_rounds)
        if self.acceptance_trace:
            return read_rounds_csv(self.acceptance_trace)
        return None

    def synthetic(self) -> SyntheticConfig:
        return SyntheticConfig(alpha=self.alpha, vocab_size=self.vocab_size, seed=self.seed,
                               eos_prob=self.eos_prob, acceptance=self.acceptance, acceptance_trace=self.trace(),
                               alpha_classes=parse_alpha_classes(self.alpha_classes))


def load_pair(config: BackendConfig):
    """Returns (draft, target), both LanguageModels."""
    if config.kind == "synthetic":
        synthetic = config.synthetic()
        return SyntheticLM(synthetic, "draft"), SyntheticLM(synthetic, "target")
    # transformers is imported only here: a synthetic-only service starts in a second, not five.
    from dsd.backends.torch_lm import TorchLM, TorchLMConfig

    if config.target_path:
        target_path, draft_path = config.target_path, config.draft_path
    else:
        pair = Path(config.pair_path).expanduser()
        if not (pair / "manifest.json").is_file():
            raise FileNotFoundError(
                f"no model pair at {pair} (manifest.json missing); build it with "
                f"`dsdbed build-pair --out {pair}`")
        _verify_pair(pair)
        target_path, draft_path = str(pair / "target"), str(pair / "draft")
    target = TorchLM.load(TorchLMConfig(target_path, config.dtype, config.device))
    draft = TorchLM.load(TorchLMConfig(draft_path, config.dtype, config.device))
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft vocab {draft.vocab_size} != target vocab {target.vocab_size}: "
                         "the pair must share a tokenizer")
    return draft, target


def _verify_pair(pair: Path) -> dict:
    from dsd.pair_build import verify_pair     # imported late: it pulls in the training stack
    return verify_pair(pair)
