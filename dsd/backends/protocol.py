"""The one interface every backend implements, and the messages built on it.

A backend is a causal language model that keeps one KV cache per sequence id. Drafting,
verification and autoregressive steps are all ``logits`` calls; the model itself decides what it
can reuse from the cache (the longest common prefix) and crops the rest, so a rejected draft is
thrown away and the accepted prefix is never recomputed. ``logits_batch`` answers several
sequences' calls in one forward pass (the verifier's scheduler batches sessions with it); a
``ForwardJob`` is one sequence's share of such a pass and what to do with its logits.

``BackendConfig`` is what every backend kind's settings are: one frozen dataclass per kind, of
JSON values, that loads its (draft, target) pair; dsd/backends/factory.py registers the kinds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # the annotations only: a backend config is read without torch
    import torch

    from dsd.features import FeatureBlock


@dataclass
class ForwardStats:
    """What a model has computed, to show that nothing is computed twice."""

    passes: int = 0  # forward calls
    positions_fed: int = 0  # input positions processed, summed over calls


@dataclass(frozen=True)
class LogitsRequest:
    """One sequence's share of a forward pass: the arguments of ``LanguageModel.logits``."""

    seq_id: str
    tokens: Sequence[int]
    n_last: int


class LanguageModel(Protocol):
    name: str
    vocab_size: int
    stats: ForwardStats

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token, if the model has one (read only: a model may fix it)."""

    # optional: the longest sequence the model can read (None or absent: no limit of its own)
    @property
    def max_positions(self) -> int | None: ...

    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        """Logits [n_last, vocab] at the last n_last positions of ``tokens``: row j predicts the
        token that follows ``tokens[:len(tokens) - n_last + 1 + j]``."""

    def logits_batch(self, requests: Sequence[LogitsRequest]) -> list[torch.Tensor]:
        """``logits`` for several distinct sequences at once (one forward pass where the backend
        can batch), answers in order; each sequence's cache ends as after its own call."""

    def cached_length(self, seq_id: str) -> int:
        """How many tokens of this sequence the KV cache holds."""

    def crop(self, seq_id: str, length: int) -> None:
        """Drop cached positions from ``length`` on (no-op if the cache is shorter)."""

    def release(self, seq_id: str) -> None:
        """Forget the sequence and free its cache."""


@runtime_checkable
class ForksCaches(Protocol):
    """An optional ability: start a sequence from another's cached prefix without recomputing it
    (the branches of a speculation cache, dsd.cache.speculation_cache), and hand a sequence's cache to another
    id (the branch that hit becomes the request's)."""

    def fork(self, seq_id: str, new_seq_id: str, length: int) -> None:
        """``new_seq_id`` starts with the first ``length`` cached positions of ``seq_id`` (fewer if
        fewer are cached); whatever ``new_seq_id`` held is dropped."""

    def move(self, seq_id: str, new_seq_id: str) -> None:
        """``new_seq_id`` takes over ``seq_id``'s cache (whatever it held is dropped); ``seq_id`` is
        forgotten."""


class BackendConfig:
    """A backend kind's settings. Subclass it with a frozen dataclass whose fields are JSON values
    (str, int, float, bool), set ``kind`` (and ``emulated``), implement ``load``, and add the class
    to factory.BACKEND_CONFIGS (or ``factory.register_backend``): the services take it whole as
    ``--backend-json``, the launchers pass it on unchanged, and an experiment's [backend] table
    holds its fields beside ``kind``."""

    kind: ClassVar[str] = ""
    # True: the models answer at once and the services charge each pass its time from a
    # HardwareProfile (services/compute.py EmulatedDevice); False: passes compute for real.
    emulated: ClassVar[bool] = False

    def to_dict(self) -> dict[str, Any]:
        if not is_dataclass(self):
            raise TypeError(f"{type(self).__name__}: a backend config is a dataclass")
        return {"kind": self.kind, **asdict(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def portable(self) -> BackendConfig:
        """The same backend for a service that cannot read this host's files (a container,
        another machine); what the launchers send."""
        return self

    def check_files(self) -> None:
        """Raise ValueError naming the field of a file this host lacks (before a sweep starts)."""

    def load(self) -> tuple[LanguageModel, LanguageModel]:
        """(draft, target)."""
        raise NotImplementedError(f"{type(self).__name__}.load")


Result = TypeVar("Result")


@dataclass(frozen=True)
class ForwardJob(Generic[Result]):
    """A model call whose logits ``finish`` turns into a result (a verdict, an AR token): run
    alone with ``run()``, or with other jobs on the same model in one pass (``run_jobs``)."""

    model: LanguageModel
    request: LogitsRequest
    finish: Callable[[torch.Tensor], Result]  # logits [n_last, vocab] -> the result

    def run(self) -> Result:
        r = self.request
        return self.finish(self.model.logits(r.seq_id, r.tokens, r.n_last))

    __call__ = run


def run_jobs(jobs: Sequence[ForwardJob[object]]) -> list[tuple[bool, object]]:
    """Run jobs on one model in one batched pass; each as (ok, result or the exception it raised).

    If the batched pass itself fails (one job's sequence too long for the model, say), every job
    runs alone instead, so only the job at fault fails; a failed pass leaves the caches of its
    sequences as valid as before it (a cache's tokens are extended only after the pass).
    """
    model = jobs[0].model
    if any(job.model is not model for job in jobs):
        raise ValueError("a batched pass runs one model; these jobs name several")
    try:
        all_logits = model.logits_batch([job.request for job in jobs])
    except Exception:
        return [_capture(job.run) for job in jobs]
    return [_capture(lambda: job.finish(logits)) for job, logits in zip(jobs, all_logits)]


def _capture(work: Callable[[], object]) -> tuple[bool, object]:
    try:
        return True, work()
    except Exception as exc:  # handed to that job's caller
        return False, exc


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int | None = None
    seed: int = 0
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens holding top_p of the mass

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Proposal:
    """A draft block sent for verification: what the edge assumed and what it drafted."""

    start_pos: int  # position of the first draft token in the sequence
    base_digest: int  # dsd.sequence digest of the assumed tokens[:start_pos]
    draft_tokens: tuple[int, ...]  # [gamma]
    draft_probs: torch.Tensor | None = field(default=None, compare=False)  # [gamma, vocab] q

    @property
    def gamma(self) -> int:
        return len(self.draft_tokens)


@dataclass(frozen=True)
class Verdict:
    """The target's answer to a Proposal."""

    start_pos: int
    proposed: int
    accepted: int  # 0..proposed; 0 if stale
    next_token: int  # corrected or bonus token; -1 if stale
    stale: bool = False
    # the target's features at the positions this verdict decided (dsd.features), if it keeps them
    features: FeatureBlock | None = field(default=None, compare=False)

    @property
    def emitted(self) -> int:
        return 0 if self.stale else self.accepted + 1
