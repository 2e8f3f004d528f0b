"""The ``[external]`` table of an experiment file: the URLs and token of services someone else
started, and how their link is shaped (the launcher itself: orchestrator/launchers/external.py)."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from dsd.checks import check, fail, is_int, is_number
from netem.spec import check_known_keys
from services.access import load_token

SHAPING = ("off", "app-delay", "edge")
SHAPER_BACKENDS = ("auto", "kernel-netem", "nfqueue")
_URL_RE = re.compile(r"^(http|https|ws|wss)://[^/\s:]+(:\d{1,5})?(/[^\s]*)?$")


@dataclass(frozen=True)
class ExternalConfig:
    verifier_url: str
    edge_urls: tuple[str, ...]
    token_file: str
    shaping: str = "off"
    shaper_backend: str = "auto"  # shaping = "edge": the backend the edges use
    probe_count: int = 20  # RTT probes per edge and point (the real link)
    probe_interval_ms: float = 50.0
    verify_count: int = 100  # shaping = "edge": ICMP probes after applying
    verify_tolerance_ms: float = 2.0  # ... off by more than this fails the point
    timeout_s: float = 10.0  # one control call

    def __post_init__(self) -> None:
        if not isinstance(self.verifier_url, str) or not _URL_RE.match(self.verifier_url):
            fail("external.verifier_url", self.verifier_url, "an http:// or ws:// URL with a host (and port)")
        urls = self.edge_urls
        if (
            not isinstance(urls, tuple)
            or not urls
            or not all(isinstance(u, str) and _URL_RE.match(u) and u.startswith("http") for u in urls)
        ):
            fail("external.edge_urls", urls, "a non-empty list of http://host:port URLs (the edges' control APIs)")
        if len(set(u.rstrip("/") for u in urls)) != len(urls):
            fail("external.edge_urls", urls, "distinct URLs")
        if self.shaping not in SHAPING:
            fail("external.shaping", self.shaping, f"one of {SHAPING}")
        if self.shaper_backend not in SHAPER_BACKENDS:
            fail("external.shaper_backend", self.shaper_backend, f"one of {SHAPER_BACKENDS}")
        for key, low, high in (("probe_count", 1, 1000), ("verify_count", 1, 100_000)):
            value = getattr(self, key)
            check(is_int(value) and low <= value <= high, f"external.{key}", value, f"a whole number in {low}..{high}")
        for key, low, high in (
            ("probe_interval_ms", 1.0, 10_000.0),
            ("verify_tolerance_ms", 0.001, 10_000.0),
            ("timeout_s", 0.1, 3600.0),
        ):
            value = getattr(self, key)
            check(is_number(value) and low <= value <= high, f"external.{key}", value, f"a number in {low}..{high}")
        if not isinstance(self.token_file, str) or not Path(self.token_file).expanduser().is_file():
            fail("external.token_file", self.token_file, "an existing file holding the services' token")
        try:
            load_token(str(Path(self.token_file).expanduser()))
        except ValueError as exc:
            raise ValueError(f"[external] token_file: {exc}") from None

    @classmethod
    def from_dict(cls, table: dict) -> ExternalConfig:
        """From the experiment file's [external] table; a misspelt key is an error."""
        if not isinstance(table, dict):
            raise ValueError(f"[external] must be a table, got {table!r}")
        check_known_keys(cls, table, "[external]")
        missing = sorted({"verifier_url", "edge_urls", "token_file"} - set(table))
        if missing:
            raise ValueError(f"[external]: missing key(s) {missing}")
        values = dict(table)
        if isinstance(values["edge_urls"], list):
            values["edge_urls"] = tuple(values["edge_urls"])
        return cls(**values)

    @property
    def token(self) -> str:
        return load_token(str(Path(self.token_file).expanduser()))

    @property
    def verifier_health_url(self) -> str:
        """The verifier's HTTP base URL (the same host and port as its WebSocket)."""
        parts = urllib.parse.urlsplit(re.sub(r"^ws", "http", self.verifier_url))
        path = parts.path.rstrip("/")
        path = path[:-3] if path.endswith("/ws") else path
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
