"""A weightless language model pair for controlled sweeps.

The target is a deterministic function of the context: the token at a position is a hash of
(seed, position, the previous ``context_tokens`` tokens), never the end-of-sequence id unless an
EOS draw (probability ``eos_prob`` per position) says so. The draft copies the target's token
with probability ``alpha``, decided by an independent hash of the same inputs, and proposes a
wrong token otherwise; so acceptance is i.i.d. per position with probability alpha, as the
latency model assumes, and a greedy run is reproducible bit for bit. With ``acceptance_trace``
the draft is right or wrong where a real pair's recorded rounds say (acceptance_trace.py).

With ``acceptance = "stratified"`` the draft instead follows a per-request layout of rounds
(``dsd.backends.acceptance``): each round's accepted count is still truncated geometric, and every
request realises alpha within a stated bound. The layout needs the request's prompt and gamma,
given by ``begin_request`` (``dsd.speculation.drafting.begin_request``) before the first draft.

With ``alpha_classes`` ((token id, alpha), ...) the prompt says the acceptance: a request whose
prompt starts with one of those tokens is drafted with that alpha (others with ``alpha``), still
i.i.d. per position. A workload that switches prompt classes mid-run is how acceptance changes on
a schedule (code vs chat): deterministic, the same in every launcher, and the target (so greedy
output) is untouched.

Logits are one-hot rows, so every algorithm in ``dsd`` runs on these models unchanged. Compute
time is not spent here: ``services.compute.EmulatedDevice`` emulates it from a hardware profile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, TypeVar

from dsd.checks import is_int
from dsd.backends.acceptance import ACCEPTANCE_KINDS, RoundLayout
from dsd.backends.acceptance_trace import AcceptanceTrace, TraceReplay, read_rounds_csv
from dsd.backends.protocol import BackendConfig, ForwardStats, LanguageModel, LogitsRequest
from dsd.sequence import common_prefix_length

if TYPE_CHECKING:
    import torch

_MASK64 = 0xFFFFFFFFFFFFFFFF
_TWO64 = float(1 << 64)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _hash(*values: int) -> int:
    h = 0
    for v in values:
        h = _splitmix64(h ^ (v & _MASK64))
    return h


@dataclass(frozen=True)
class SyntheticConfig:
    alpha: float = 0.8  # probability that a draft token is the target's token
    vocab_size: int = 512
    seed: int = 0
    eos_token_id: int = 0
    eos_prob: float = 0.0  # per generated position
    context_tokens: int = 4  # how much of the context decides the next token
    acceptance: str = "iid"  # or "stratified": every request realises alpha (dsd.backends.acceptance)
    # replay a real pair's acceptance instead of i.i.d. alpha (dsd/backends/acceptance_trace.py)
    acceptance_trace: AcceptanceTrace | None = None
    # per prompt class: ((first prompt token, alpha), ...); other prompts draft with alpha
    alpha_classes: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")
        if self.vocab_size < 3:
            raise ValueError(f"vocab_size must be >= 3, got {self.vocab_size!r}")
        if not 0 <= self.eos_token_id < self.vocab_size:
            raise ValueError(f"eos_token_id must be in [0, vocab_size), got {self.eos_token_id!r}")
        if not 0.0 <= self.eos_prob < 1.0:
            raise ValueError(f"eos_prob must be in [0, 1), got {self.eos_prob!r}")
        if self.context_tokens < 1:
            raise ValueError(f"context_tokens must be >= 1, got {self.context_tokens!r}")
        if self.acceptance not in ACCEPTANCE_KINDS:
            raise ValueError(f"acceptance must be one of {ACCEPTANCE_KINDS}, got {self.acceptance!r}")
        classes = self.alpha_classes
        if not isinstance(classes, tuple) or not all(
            isinstance(c, tuple)
            and len(c) == 2
            and is_int(c[0])
            and 0 <= c[0] < self.vocab_size
            and isinstance(c[1], (int, float))
            and not isinstance(c[1], bool)
            and 0.0 <= c[1] <= 1.0
            for c in classes
        ):
            raise ValueError(
                f"alpha_classes must be (token id in [0, vocab_size), alpha in [0, 1]) pairs, got {classes!r}"
            )
        if len({t for t, _ in classes}) != len(classes):
            raise ValueError(f"alpha_classes names a token twice: {classes!r}")
        if classes and (self.acceptance != "iid" or self.acceptance_trace is not None):
            raise ValueError("alpha_classes is for i.i.d. acceptance (not with acceptance='stratified' or a trace)")

    def alpha_of(self, prompt: Sequence[int]) -> float:
        """The draft's acceptance for a request with this prompt (its class, else alpha)."""
        if prompt:
            for token, alpha in self.alpha_classes:
                if prompt[0] == token:
                    return float(alpha)
        return self.alpha


def parse_alpha_classes(text: str) -> tuple[tuple[int, float], ...]:
    """ "1:0.9,2:0.3" -> ((1, 0.9), (2, 0.3)): alpha_classes as the launchers pass them."""
    out = []
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        token, sep, alpha = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out.append((int(token), float(alpha)))
        except ValueError:
            raise ValueError(f"alpha_classes must read token:alpha,..., got {text!r}") from None
    return tuple(out)


def format_alpha_classes(classes: Iterable[tuple[int, float]]) -> str:
    return ",".join(f"{token}:{alpha!r}" for token, alpha in classes)


def target_token(config: SyntheticConfig, context: Sequence[int]) -> int:
    """The target's next token after ``context`` (at position len(context))."""
    return _target_at(config, len(context), context[-config.context_tokens :])


def draft_token(config: SyntheticConfig, context: Sequence[int]) -> int:
    return _draft_at(config, len(context), context[-config.context_tokens :])


def _target_at(config: SyntheticConfig, position: int, window: Sequence[int]) -> int:
    h = _hash(config.seed, position, *window)
    if config.eos_prob and _hash(h, 1) / _TWO64 < config.eos_prob:
        return config.eos_token_id
    # Any token but EOS, uniformly.
    token = h % (config.vocab_size - 1)
    return token + 1 if token >= config.eos_token_id else token


def _draft_at(
    config: SyntheticConfig, position: int, window: Sequence[int], outcome: str = "", alpha: float | None = None
) -> int:
    """The draft's token; ``outcome`` "right"/"wrong" from a stratified layout, else a coin that
    comes up right with probability ``alpha`` (config.alpha unless a trace decides it)."""
    right = _target_at(config, position, window)
    h = _hash(config.seed, 0xD4AF7, position, *window)
    p = config.alpha if alpha is None else alpha
    if outcome == "right" or (outcome != "wrong" and (alpha == 1.0 or h / _TWO64 < p)):
        return right
    # A wrong token (never the right one, so a rejection is a rejection).
    return (right + 1 + _hash(h) % (config.vocab_size - 1)) % config.vocab_size


class SyntheticLM:
    """A LanguageModel whose logits are one-hot rows of target_token or draft_token."""

    def __init__(self, config: SyntheticConfig, role: str) -> None:
        if role not in ("target", "draft"):
            raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
        self.config = config
        self.role = role
        self.name = f"synthetic-{role}"
        self.vocab_size = config.vocab_size
        self.eos_token_id = config.eos_token_id
        self.max_positions = None
        self.stats = ForwardStats()
        self._next_at = _target_at if role == "target" else _draft_at
        self._cached: dict[str, list[int]] = {}
        trace = config.acceptance_trace if role == "draft" else None
        self._replay = TraceReplay(trace, config.seed) if trace is not None else None
        self._layouts: dict[str, RoundLayout] = {}  # stratified acceptance, per sequence

    def begin_request(self, seq_id: str, prompt: Sequence[int], gamma: int) -> None:
        """A draft with stratified acceptance lays out the request's rounds (seeded by the
        prompt and gamma, so a request gets the same rounds in every mode and launcher)."""
        if self.role == "draft" and self.config.acceptance == "stratified":
            seed = _hash(self.config.seed, 0x57A7, gamma, len(prompt), *prompt)
            self._layouts[seq_id] = RoundLayout(self.config.alpha, gamma, len(prompt), seed)

    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        if not 1 <= n_last <= len(tokens):
            raise ValueError(f"n_last must be in [1, {len(tokens)}], got {n_last}")
        tokens = list(tokens)
        cached = self._cached.setdefault(seq_id, [])
        keep = min(common_prefix_length(cached, tokens), len(tokens) - n_last)
        import torch  # here, not at the top: a synthetic config is read without torch

        fed = len(tokens) - keep
        self._cached[seq_id] = tokens
        self.stats.passes += 1
        self.stats.positions_fed += fed
        out = torch.zeros(n_last, self.vocab_size)  # [n_last, vocab]
        k = self.config.context_tokens
        first = len(tokens) - n_last + 1
        layout = self._layout(seq_id)
        alpha_at = self._replay.alpha_of(seq_id, tokens, n_last) if self._replay is not None else None
        if self.role == "draft" and self.config.alpha_classes:
            alpha = self.config.alpha_of(tokens)
            alpha_at = lambda _position: alpha  # noqa: E731
        for row in range(n_last):
            position = first + row
            window = tokens[max(0, position - k) : position]
            if layout is not None:
                out[row, _draft_at(self.config, position, window, layout.outcome(position))] = 1.0
            elif alpha_at is not None:
                out[row, _draft_at(self.config, position, window, alpha=alpha_at(position))] = 1.0
            else:
                out[row, self._next_at(self.config, position, window)] = 1.0
        return out

    def _layout(self, seq_id: str) -> RoundLayout | None:
        if self.role != "draft" or self.config.acceptance != "stratified":
            return None
        if seq_id not in self._layouts:
            raise ValueError(
                f"stratified acceptance: sequence {seq_id!r} was drafted before begin_request "
                "gave its prompt and gamma (dsd.speculation.drafting.begin_request)"
            )
        return self._layouts[seq_id]

    def logits_batch(self, requests: Sequence[LogitsRequest]) -> list[torch.Tensor]:
        """One call per request: nothing is computed here, so there is nothing to batch (the
        emulated device charges a batch its profile's time)."""
        return [self.logits(r.seq_id, r.tokens, r.n_last) for r in requests]

    def cached_length(self, seq_id: str) -> int:
        return len(self._cached.get(seq_id, ()))

    def crop(self, seq_id: str, length: int) -> None:
        if seq_id in self._cached:
            del self._cached[seq_id][length:]

    def fork(self, seq_id: str, new_seq_id: str, length: int) -> None:
        """A branch shares its source's acceptance layout and trace position (the draft's tokens
        depend on them, and a branch must draft what its source would have)."""
        self._cached[new_seq_id] = list(self._cached.get(seq_id, ())[:length])
        if seq_id in self._layouts:
            self._layouts[new_seq_id] = self._layouts[seq_id]
        if self._replay is not None:
            self._replay.fork(seq_id, new_seq_id)

    def move(self, seq_id: str, new_seq_id: str) -> None:
        _rename(self._cached, seq_id, new_seq_id)
        _rename(self._layouts, seq_id, new_seq_id)
        if self._replay is not None:
            self._replay.fork(seq_id, new_seq_id)
            self._replay.release(seq_id)

    def release(self, seq_id: str) -> None:
        self._cached.pop(seq_id, None)
        self._layouts.pop(seq_id, None)
        if self._replay is not None:
            self._replay.release(seq_id)


@dataclass(frozen=True)
class SyntheticBackendConfig(BackendConfig):
    """The synthetic backend as the services and experiments name it (``kind = "synthetic"``)."""

    kind: ClassVar[str] = "synthetic"
    emulated: ClassVar[bool] = True
    alpha: float = 0.8
    vocab_size: int = 512
    seed: int = 0
    eos_prob: float = 0.0
    # replay a real pair's per-round acceptance instead of i.i.d. alpha (acceptance_trace.py): a
    # rounds.csv path, or the rounds inline as "proposed:accepted,..." (what services are sent)
    acceptance_trace: str = ""
    acceptance_rounds: str = ""
    acceptance: str = "iid"  # or "stratified": every request realises alpha (dsd.backends.acceptance)
    # alpha per prompt class, "token:alpha,..." (a prompt's first token says its class)
    alpha_classes: str = ""

    def __post_init__(self) -> None:
        if self.acceptance_trace and self.acceptance_rounds:
            raise ValueError("acceptance_trace and acceptance_rounds: give one (a rounds.csv, or its rounds inline)")
        if (self.acceptance_trace or self.acceptance_rounds) and self.acceptance != "iid":
            raise ValueError(f"acceptance_trace replaces acceptance={self.acceptance!r}: the trace decides acceptance")
        self.synthetic()  # validates alpha, vocab_size, eos_prob, acceptance, the trace

    def trace(self) -> AcceptanceTrace | None:
        """The acceptance trace to replay, or None (acceptance by alpha)."""
        if self.acceptance_rounds:
            return AcceptanceTrace.from_text(self.acceptance_rounds)
        if self.acceptance_trace:
            return read_rounds_csv(self.acceptance_trace)
        return None

    def synthetic(self) -> SyntheticConfig:
        return SyntheticConfig(
            alpha=self.alpha,
            vocab_size=self.vocab_size,
            seed=self.seed,
            eos_prob=self.eos_prob,
            acceptance=self.acceptance,
            acceptance_trace=self.trace(),
            alpha_classes=parse_alpha_classes(self.alpha_classes),
        )

    def portable(self) -> SyntheticBackendConfig:
        """The trace inline: a service need not see the file."""
        if not self.acceptance_trace:
            return self
        trace = self.trace()
        return self if trace is None else replace(self, acceptance_trace="", acceptance_rounds=trace.to_text())

    def load(self) -> tuple[LanguageModel, LanguageModel]:
        synthetic = self.synthetic()
        return SyntheticLM(synthetic, "draft"), SyntheticLM(synthetic, "target")


Value = TypeVar("Value")


def _rename(table: dict[str, Value], seq_id: str, new_seq_id: str) -> None:
    """``seq_id``'s entry under ``new_seq_id`` (whatever that held dropped)."""
    table.pop(new_seq_id, None)
    if seq_id in table:
        table[new_seq_id] = table.pop(seq_id)
