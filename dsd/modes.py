"""The decoding modes as data: one entry per mode, and everything else asks the registry.

A mode says where it drafts (``EDGE``, ``SERVER`` or ``NOWHERE``), whether the edge pipelines
(drafts the next block while one is in flight), its closed-form per-token time
(``dsd.analytic.latency_model``), whether an adaptive controller may pick it for a round (``dsd.controller.interface``)
and how plots label and colour it. Adding a mode is one ``register(Mode(...))`` plus its driver
policy (what the edge or the server does in its rounds); the experiment's validation, the
analysis, the predictions and the plots then know it.

The names of the four modes of docs/concepts.md are constants (``AR``, ``COLOCATED``, ``SYNC``,
``PIPELINED``) for the few places that treat one mode specially (a crossover between two
named modes, the parameter a mode's rounds measure); everywhere else asks by property.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsd.analytic import latency_model as lm

AR, COLOCATED, SYNC, PIPELINED, CACHED = "ar", "colocated", "sync", "pipelined", "cached"
CROSSOVERS = {  # name: (mode that wins at low RTT, reference it is compared with)
    "sync_vs_ar": (SYNC, AR),
    "pipelined_vs_colocated": (PIPELINED, COLOCATED),
    "cached_vs_colocated": (CACHED, COLOCATED),
}
EDGE, SERVER, NOWHERE = "edge", "server", "nowhere"
DRAFT_SITES = (EDGE, SERVER, NOWHERE)

# A predictor: the closed form's steady-state seconds per output token of one mode, from alpha,
# gamma, the RTT (seconds) and the compute times, all four always passed by keyword:
# t_ar_s, t_draft_edge_s, t_draft_server_s, t_verify_s (a mode reads the ones it needs; a caller
# that cannot know one passes None, and a misspelt name is a TypeError, never ignored); and
# cache_hit_rate and cache_fill_s, the share of verdicts a speculation cache held and how long
# it takes to fill (None where unknown: only the cached mode reads them).
Predictor = Callable[..., float]


@dataclass(frozen=True)
class Mode:
    name: str
    drafts: str  # EDGE, SERVER or NOWHERE (no drafts: gamma does not apply)
    pipelined: bool  # the edge drafts ahead and sends while a block is in flight
    per_token_s: Predictor  # (alpha, gamma, rtt_s, *, t_ar_s, t_draft_edge_s, t_draft_server_s, t_verify_s)
    label: str  # plots and reports
    color: str  # matplotlib colour
    plannable: bool = False  # an adaptive controller may pick it for a round
    # Its driver policy when no adaptive controller runs: a factory ControllerConfig -> controller
    # (dsd.controller.interface: decide() / observe()) that plans each round; None: every round drafts the
    # configured gamma in this mode.
    policy: Callable[..., object] | None = None
    # while its one block is in flight the edge drafts next blocks for the likely verdicts
    # (dsd.cache.speculation_cache) and sends one when its verdict comes
    cache: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise ValueError(f"name must be an identifier-like string, got {self.name!r}")
        if self.drafts not in DRAFT_SITES:
            raise ValueError(f"drafts must be one of {DRAFT_SITES}, got {self.drafts!r}")
        if not isinstance(self.pipelined, bool) or (self.pipelined and self.drafts != EDGE):
            raise ValueError(f"pipelined must be a bool, True only when the edge drafts, got {self.pipelined!r}")
        if not callable(self.per_token_s):
            raise ValueError(f"per_token_s must be callable, got {self.per_token_s!r}")
        if not isinstance(self.cache, bool) or (self.cache and (self.drafts != EDGE or self.pipelined)):
            raise ValueError(
                f"cache must be a bool, True only for an edge mode that does not pipeline, got {self.cache!r}"
            )
        if self.policy is not None and not (callable(self.policy) and self.drafts == EDGE):
            raise ValueError(f"policy must be callable, and only for a mode the edge drafts in, got {self.policy!r}")
        for name in ("label", "color"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")

    @property
    def speculative(self) -> bool:
        """Drafts and verifies in rounds, so gamma and alpha apply."""
        return self.drafts != NOWHERE


def _ar(
    alpha: float,
    gamma: int,
    rtt_s: float,
    *,
    t_ar_s: float,
    t_draft_edge_s: float,
    t_draft_server_s: float,
    t_verify_s: float,
    cache_hit_rate: float | None = None,
    cache_fill_s: float | None = None,
) -> float:
    return t_ar_s  # one target step per token


def _colocated(
    alpha: float,
    gamma: int,
    rtt_s: float,
    *,
    t_ar_s: float,
    t_draft_edge_s: float,
    t_draft_server_s: float,
    t_verify_s: float,
    cache_hit_rate: float | None = None,
    cache_fill_s: float | None = None,
) -> float:
    return lm.per_token_colocated_s(alpha, gamma, t_draft_server_s, t_verify_s)


def _sync(
    alpha: float,
    gamma: int,
    rtt_s: float,
    *,
    t_ar_s: float,
    t_draft_edge_s: float,
    t_draft_server_s: float,
    t_verify_s: float,
    cache_hit_rate: float | None = None,
    cache_fill_s: float | None = None,
) -> float:
    return lm.per_token_sync_dsd_s(alpha, gamma, t_draft_edge_s, t_verify_s, rtt_s)


def _pipelined(
    alpha: float,
    gamma: int,
    rtt_s: float,
    *,
    t_ar_s: float,
    t_draft_edge_s: float,
    t_draft_server_s: float,
    t_verify_s: float,
    cache_hit_rate: float | None = None,
    cache_fill_s: float | None = None,
) -> float:
    return lm.per_token_pipelined_dsd_s(alpha, gamma, t_draft_edge_s, t_verify_s, rtt_s)


def _cached(
    alpha: float,
    gamma: int,
    rtt_s: float,
    *,
    t_ar_s: float,
    t_draft_edge_s: float,
    t_draft_server_s: float,
    t_verify_s: float,
    cache_hit_rate: float | None = None,
    cache_fill_s: float | None = None,
) -> float:
    if cache_hit_rate is None:
        raise ValueError("the cached mode's closed form needs the cache's hit rate (cache_hit_rate)")
    return lm.per_token_cached_dsd_s(
        alpha, gamma, t_draft_edge_s, t_verify_s, rtt_s, cache_hit_rate, cache_fill_s or 0.0
    )


MODES: dict[str, Mode] = {}  # name -> Mode, in registration order (the order of plots and grids)


def register(mode: Mode) -> Mode:
    """Add a mode; its name must be new."""
    if not isinstance(mode, Mode):
        raise ValueError(f"mode must be a Mode, got {type(mode).__name__}")
    if mode.name in MODES:
        raise ValueError(f"mode name must be new, {mode.name!r} is registered already")
    MODES[mode.name] = mode
    return mode


def unregister(name: str) -> None:
    """Remove a mode added by ``register`` (tests that register a toy mode clean up with it)."""
    get_mode(name)
    del MODES[name]


register(Mode(AR, NOWHERE, False, _ar, "cloud AR", "tab:gray", plannable=True))
register(Mode(COLOCATED, SERVER, False, _colocated, "co-located SD", "tab:green"))
register(Mode(SYNC, EDGE, False, _sync, "synchronous DSD", "tab:blue", plannable=True))
register(Mode(PIPELINED, EDGE, True, _pipelined, "pipelined DSD", "tab:orange", plannable=True))
BUILTIN = tuple(MODES)  # the four modes of docs/concepts.md: an experiment's default
# NOTE: not plannable: an adaptive controller has no estimate of the cache's hit rate yet, so it
# cannot weigh this mode against the others.
register(Mode(CACHED, EDGE, False, _cached, "cached pipelined DSD", "tab:red", cache=True))


def get_mode(name: str) -> Mode:
    """The registered mode of this name; a ValueError naming it and the known names otherwise."""
    if not isinstance(name, str) or name not in MODES:
        raise ValueError(f"mode must be one of {names()}, got {name!r}")
    return MODES[name]


def names() -> tuple[str, ...]:
    return tuple(MODES)


def edge_modes() -> tuple[str, ...]:
    """The edge drafts (DSD): sync and pipelined."""
    return tuple(n for n, m in MODES.items() if m.drafts == EDGE)


def server_modes() -> tuple[str, ...]:
    """The server runs the whole request and streams tokens: cloud AR and co-located SD."""
    return tuple(n for n, m in MODES.items() if m.drafts != EDGE)


def speculative_modes() -> tuple[str, ...]:
    """Rounds of drafts and a verdict: every mode but AR; alpha is fitted from their rounds."""
    return tuple(n for n, m in MODES.items() if m.speculative)


def gammaless_modes() -> tuple[str, ...]:
    """No drafts, so gamma does not apply (AR): run once per grid, matched at any gamma."""
    return tuple(n for n, m in MODES.items() if not m.speculative)


def plan_modes() -> tuple[str, ...]:
    """What an adaptive controller may pick for a round."""
    return tuple(n for n, m in MODES.items() if m.plannable)


def plannable_edge_modes() -> tuple[str, ...]:
    """The DSD modes an adaptive controller may pick for a round: its default choice."""
    return tuple(n for n, m in MODES.items() if m.plannable and m.drafts == EDGE)


def predict_per_token_s(
    name: str,
    alpha: float,
    gamma: int,
    rtt_s: float,
    *,
    t_ar_s: float | None,
    t_draft_edge_s: float | None,
    t_draft_server_s: float | None,
    t_verify_s: float | None,
    cache_hit_rate: float | None = None,
    cache_fill_s: float | None = None,
) -> float:
    """The named mode's closed-form seconds per token (see ``Predictor``)."""
    return get_mode(name).per_token_s(
        alpha,
        gamma,
        rtt_s,
        t_ar_s=t_ar_s,
        t_draft_edge_s=t_draft_edge_s,
        t_draft_server_s=t_draft_server_s,
        t_verify_s=t_verify_s,
        cache_hit_rate=cache_hit_rate,
        cache_fill_s=cache_fill_s,
    )
