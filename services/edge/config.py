"""A run's config (``RunConfig``: the JSON body of POST /runs, validated on construction),
the errors that end a run, and one request's record (``Request``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields

from dsd.checks import is_int
from dsd.backends.protocol import SamplingParams
from dsd.features import check_feature_dtype
from dsd.speculation.stopping import StopRule
from dsd.controller.interface import CONTROLLERS, GAMMA_MAX, ControllerConfig
from dsd.modes import SYNC, edge_modes, get_mode, plannable_edge_modes
from dsd.cache.speculation_cache import CacheConfig
from services import frames


RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")  # a run id is a file name: no path, no spaces


@dataclass(frozen=True)
class RunConfig:
    run_id: str
    client_id: str
    mode: str
    gamma: int
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int
    verifier_url: str
    max_in_flight: int = 1
    seed: int = 0
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    app_delay_ms: float = 0.0
    stop_at_eos: bool = True
    probe_count: int = 5  # RTT probes before the run
    probe_interval_ms: float = 500.0  # and one every so often during it
    request_timeout_s: float = 600.0  # a request not done by then fails the run (a hung service)
    # 0 = none; else a request not done this long after its start is given up as a real client
    # would: its row says why (gave_up), its session is closed, and the run goes on with the next
    request_deadline_s: float = 0.0
    # cap TCP's retransmission backoff on the link (frames.cap_retransmission_backoff): after an
    # outage the request resumes within this of the link's return; 0 = the kernel's backoff
    tcp_rto_max_ms: int = 0
    controller: str = "static"  # dsd.controller.interface: who picks each round's gamma and mode
    gamma_max: int = GAMMA_MAX  # the largest gamma a controller may pick
    # what an adaptive controller may pick per request (ar/colocated: the request runs on the
    # server) and per round (sync/pipelined)
    controller_modes: tuple[str, ...] = plannable_edge_modes()
    # how the per-round messages travel (services/frames.py): "ws", the verifier's /ws WebSocket,
    # or "tcp", length-prefixed frames on a plain TCP connection to the same port
    transport: str = frames.DEFAULT_TRANSPORT
    # open-loop load: the first request starts at this epoch time (0: at once), so a request's
    # arrival does not move with how long the connection took to open
    start_at_unix_s: float = 0.0
    # the cached mode's speculation cache (dsd/cache/speculation_cache.py; JSON: a table of its fields)
    cache: CacheConfig = CacheConfig()
    # the category of each prompt (a categorized workload; requests.csv's category), or none
    categories: tuple[str, ...] = ()
    # how the target's features travel to a feature draft (dsd.features): "bfloat16" or "int8"
    # (a draft that reads none asks for none)
    feature_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        self._check_names()
        self._check_numbers()
        self._check_prompts()
        self._check_link()
        self._check_controller()
        self._check_cache()
        if isinstance(self.controller_modes, list):
            object.__setattr__(self, "controller_modes", tuple(self.controller_modes))
        self.controller_config()  # gamma_max, controller_modes: checked there

    def _check_names(self) -> None:
        if not (isinstance(self.run_id, str) and RUN_ID.fullmatch(self.run_id)):
            raise ValueError(f"run_id must be 1-128 of [A-Za-z0-9._-] (it names a folder), got {self.run_id!r}")
        if not isinstance(self.client_id, str) or not self.client_id:
            raise ValueError(f"client_id must be a non-empty string, got {self.client_id!r}")
        get_mode(self.mode)  # dsd/modes.py: a ValueError naming the known modes

    def _check_numbers(self) -> None:
        for name, low in (
            ("gamma", 1),
            ("max_new_tokens", 1),
            ("max_in_flight", 1),
            ("seed", 0),
            ("probe_count", 0),
            ("tcp_rto_max_ms", 0),
        ):
            value = getattr(self, name)
            if not (is_int(value) and value >= low):
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        if self.top_k is not None and not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise ValueError(f"top_k must be a whole number >= 1 or null, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        object.__setattr__(self, "top_p", float(self.top_p))
        for name, least in (
            ("temperature", 0.0),
            ("app_delay_ms", 0.0),
            ("probe_interval_ms", 1.0),
            ("request_timeout_s", 0.001),
            ("start_at_unix_s", 0.0),
            ("request_deadline_s", 0.0),
        ):
            value = getattr(self, name)
            if not (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= least
            ):
                raise ValueError(f"{name} must be a finite number >= {least}, got {value!r}")
            object.__setattr__(self, name, float(value))  # JSON may say 15 for 15.0
        if not isinstance(self.stop_at_eos, bool):
            raise ValueError(f"stop_at_eos must be true or false, got {self.stop_at_eos!r}")

    def _check_prompts(self) -> None:
        if not self.prompts or not all(
            isinstance(p, tuple) and p and all(isinstance(t, int) and t >= 0 for t in p) for p in self.prompts
        ):
            raise ValueError("prompts must be a non-empty list of non-empty lists of token ids >= 0")
        if isinstance(self.categories, list):
            object.__setattr__(self, "categories", tuple(self.categories))
        if (
            not isinstance(self.categories, tuple)
            or not all(isinstance(c, str) for c in self.categories)
            or len(self.categories) not in (0, len(self.prompts))
        ):
            raise ValueError(
                f"categories must be empty or one string per prompt ({len(self.prompts)}), got {self.categories!r:.120}"
            )

    def _check_link(self) -> None:
        if not re.match(r"(ws|wss|http|https)://", str(self.verifier_url)):
            raise ValueError(f"verifier_url must be a ws:// or http:// URL, got {self.verifier_url!r}")
        frames.check_transport(self.transport)
        check_feature_dtype(self.feature_dtype, "feature_dtype")

    def _check_controller(self) -> None:
        if self.controller not in CONTROLLERS:
            raise ValueError(f"controller must be one of {CONTROLLERS}, got {self.controller!r}")
        if self.controller != "static" and self.mode not in edge_modes():
            raise ValueError(
                f"controller {self.controller!r} needs mode sync or pipelined (the edge drafts), got {self.mode!r}"
            )

    def _check_cache(self) -> None:
        if isinstance(self.cache, dict):
            check_json_fields(CacheConfig, self.cache, "cache")
            object.__setattr__(self, "cache", CacheConfig(**self.cache))
        if not isinstance(self.cache, CacheConfig):
            raise ValueError(
                f"cache must be a table of {sorted(f.name for f in fields(CacheConfig))}, got {self.cache!r}"
            )

    def controller_config(self) -> ControllerConfig:
        return ControllerConfig(
            self.controller,
            self.gamma,
            self.mode if self.mode in edge_modes() else SYNC,
            self.gamma_max,
            self.controller_modes,
        )

    @classmethod
    def from_json(cls, body) -> RunConfig:
        check_json_fields(cls, body, "a run")
        values = dict(body)
        if isinstance(values.get("prompts"), list):
            values["prompts"] = tuple(tuple(p) if isinstance(p, list) else p for p in values["prompts"])
        return cls(**values)

    @property
    def ws_url(self) -> str:
        return ws_url(self.verifier_url)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.seed, self.top_p)


class RunError(RuntimeError):
    pass


def check_json_fields(cls, body, what: str) -> None:
    """A JSON body for the config dataclass ``cls``: an object, no unknown field, no required one
    missing (ValueErrors naming them)."""
    if not isinstance(body, dict):
        raise ValueError(f"{what} is a JSON object, got {type(body).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(body) - names)
    if unknown:
        raise ValueError(f"unknown fields {unknown}; known: {sorted(names)}")
    missing = [f.name for f in fields(cls) if f.name not in body and f.default is MISSING]
    if missing:
        raise ValueError(f"missing fields {missing}")


def ws_url(verifier_url: str) -> str:
    """The verifier's WebSocket URL from http://host:port or ws://host:port[/ws]."""
    url = re.sub(r"^http", "ws", verifier_url)
    return url if url.rstrip("/").endswith("/ws") else url.rstrip("/") + "/ws"


@dataclass
class Request:
    """What a request needs and what it measured (times on perf_counter)."""

    index: int
    prompt: list[int]
    config: RunConfig
    stop: StopRule
    t_start_s: float = 0.0
    t_first_s: float | None = None
    first_emitted: int = 0
    t_last_s: float | None = None
    tokens: list[int] | None = None
    rounds: int = 0
    stale_rounds: int = 0
    session: int | None = None  # its session on the link, once opened
    n_emitted: int = 0  # tokens received so far (what a request given up got)
    gave_up: str = ""  # why the client gave it up (its deadline), else empty
    seed: int | None = None  # its sampling seed; None: the run's seed + its index
    request_id: str = ""  # the HTTP client's X-Request-ID (the OpenAI-compatible API)
    # who reads the tokens as they are committed (the OpenAI-compatible API streams them)
    on_tokens: Callable[[float, Sequence[int]], None] | None = None

    @property
    def sampling_seed(self) -> int:
        return self.config.seed + self.index if self.seed is None else self.seed

    def emitted(self, t_receive_s: float, tokens: Sequence[int]) -> None:
        n_tokens = len(tokens)
        self.n_emitted += n_tokens
        if self.on_tokens is not None and n_tokens:
            self.on_tokens(t_receive_s, tokens)
        if n_tokens:
            if self.t_first_s is None:
                self.t_first_s, self.first_emitted = t_receive_s, n_tokens
            self.t_last_s = t_receive_s
