"""The edge's serving settings (``ServeConfig``): which verifier the OpenAI-compatible API decodes
with, in which mode and gamma, how many requests it admits, and where its rows go. Set with
``--openai-json`` at start or ``PUT /openai`` later; a request may override mode and gamma with
its ``dsd`` field."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dsd.checks import is_int
from dsd.modes import get_mode
from services import frames
from services.edge.config import RUN_ID, check_json_fields


@dataclass(frozen=True)
class ServeConfig:
    verifier_url: str
    mode: str = "sync"
    gamma: int = 4
    max_in_flight: int = 1  # pipelined: blocks in flight per request
    run_id: str = "openai"  # the folder of its rows (requests.csv, rounds.csv)
    client_id: str = "openai"  # the rows' client_id
    model: str = ""  # the name clients send as "model"; empty: the pair's folder name
    max_concurrent: int = 4  # requests decoded at once; more wait in the queue
    max_queue: int = 64  # requests waiting beyond those; one more gets 429
    default_max_tokens: int = 256  # a request without max_tokens: this, or what the context leaves
    request_timeout_s: float = 600.0  # a request not done by then ends with an error (a hung verifier)
    probe_interval_ms: float = 5000.0  # the link's RTT probe on the channel (rows' rtt_probe_ms); 0: none
    app_delay_ms: float = 0.0  # services/edge/config.py RunConfig's: added each way in the app
    transport: str = frames.DEFAULT_TRANSPORT
    tcp_rto_max_ms: int = 0

    def __post_init__(self) -> None:
        if not re.match(r"(ws|wss|http|https)://", str(self.verifier_url)):
            raise ValueError(f"verifier_url must be a ws:// or http:// URL, got {self.verifier_url!r}")
        get_mode(self.mode)
        for name in ("run_id", "client_id"):
            if not (isinstance(getattr(self, name), str) and RUN_ID.fullmatch(getattr(self, name))):
                raise ValueError(f"{name} must be 1-128 of [A-Za-z0-9._-], got {getattr(self, name)!r}")
        if not isinstance(self.model, str):
            raise ValueError(f"model must be a string, got {self.model!r}")
        for name, low in (
            ("gamma", 1),
            ("max_in_flight", 1),
            ("max_concurrent", 1),
            ("max_queue", 0),
            ("default_max_tokens", 1),
            ("tcp_rto_max_ms", 0),
        ):
            value = getattr(self, name)
            if not (is_int(value) and value >= low):
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        for name, least in (("request_timeout_s", 0.001), ("probe_interval_ms", 0.0), ("app_delay_ms", 0.0)):
            value = getattr(self, name)
            if not (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= least
            ):
                raise ValueError(f"{name} must be a finite number >= {least}, got {value!r}")
            object.__setattr__(self, name, float(value))
        frames.check_transport(self.transport)

    @classmethod
    def from_json(cls, body) -> ServeConfig:
        check_json_fields(cls, body, "a serving config")
        return cls(**body)
