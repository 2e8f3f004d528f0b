"""The edge's shaping API (``ShapingApi``): the edge's own link through its control API, shaped
from inside the edge's network namespace (`netem.inside`), read, removed, and measured with the
edge's RTT probes.

    GET    /link          {"shaping_allowed", "record" (what is applied, or null), "failures"}
    PUT    /link          {"verifier_url", LinkSpec fields ("rtt_ms", ...), "backend", "verify_count",
                           "tolerance_ms"}: replaces any shaping, verifies it; 200 with the record
    DELETE /link          removes the shaping (200 even when there was none)
    POST   /link/probe    {"verifier_url", "count", "interval_ms", "app_delay_ms"}: RTT probes over
                          a WebSocket to the verifier, the same Ping/Pong as during a run

Shaping needs ``--shape-link`` (the edge then holds CAP_NET_ADMIN and CAP_NET_RAW in its namespace:
a container with NET_ADMIN, a namespace someone made for it); without it PUT /link answers 403.
Like the rest of the control API these need the testbed's token.

The kernel work runs on one thread of its own that lives as long as the edge: the NFQUEUE
daemon dies with the thread that started it (PR_SET_PDEATHSIG), and one thread orders the
applies and removals.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import TYPE_CHECKING

from aiohttp import web

from dsd.checks import is_number
from netem.spec import LinkSpec

if TYPE_CHECKING:
    from netem.inside import InsideShaper

log = logging.getLogger("services.shaping_api")
SPEC_FIELDS = tuple(f.name for f in fields(LinkSpec))
PUT_FIELDS = ("verifier_url", "backend", "verify_count", "tolerance_ms", *SPEC_FIELDS)
PROBE_FIELDS = ("verifier_url", "count", "interval_ms", "app_delay_ms")
MAX_PROBES = 1000


def peer_ip(verifier_url: str) -> str:
    """The verifier's IPv4 address from its URL (a name is resolved here, in this namespace)."""
    if not isinstance(verifier_url, str) or not re.match(r"(ws|wss|http|https)://", verifier_url):
        raise ValueError(f"verifier_url must be a ws:// or http:// URL, got {verifier_url!r}")
    host = urllib.parse.urlsplit(verifier_url).hostname
    if not host:
        raise ValueError(f"verifier_url has no host: {verifier_url!r}")
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise ValueError(f"verifier_url: cannot resolve {host!r}: {exc}") from None


def _number_in(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if not (is_number(value) and low <= value <= high):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return value


def _check_keys(body, known: tuple[str, ...]) -> dict:
    if not isinstance(body, dict):
        raise ValueError(f"the body is a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ValueError(f"unknown fields {unknown}; known: {sorted(known)}")
    if "verifier_url" not in body:
        raise ValueError("missing field 'verifier_url'")
    return body


class ShapingApi:
    """The edge's shaping API: GET/PUT/DELETE /link and POST /link/probe on the edge's control API."""

    def __init__(self, shaping_allowed: bool, probe) -> None:
        """``probe(verifier_url, count, interval_s, app_delay_ms)``: an async function returning
        the RTTs in ms (the edge's WebSocket probes)."""
        self.shaping_allowed = shaping_allowed
        self.probe = probe
        self.shaper: InsideShaper | None = None  # while shaping
        self._record: dict | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsd-shaping")
        self._lock = asyncio.Lock()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/link", self.get)
        app.router.add_put("/link", self.put)
        app.router.add_delete("/link", self.delete)
        app.router.add_post("/link/probe", self.post_probe)
        app.on_cleanup.append(self._on_cleanup)

    async def _on_cleanup(self, _app) -> None:
        await self._in_thread(self._remove)
        self._thread.shutdown(wait=True)

    async def _in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def failures(self) -> list[str]:
        return self.shaper.failures() if self.shaper is not None else []

    async def get(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"shaping_allowed": self.shaping_allowed, "record": self._record, "failures": self.failures()}
        )

    async def put(self, request: web.Request) -> web.Response:
        if not self.shaping_allowed:
            return web.json_response(
                {
                    "error": "this edge does not shape its link: start it with --shape-link "
                    "(and CAP_NET_ADMIN in its network namespace)"
                },
                status=403,
            )
        try:
            body = _check_keys(await request.json(), PUT_FIELDS)
            spec = LinkSpec.from_dict({k: body[k] for k in SPEC_FIELDS if k in body})
            verify_count = int(_number_in(body, "verify_count", 100, 0, 100_000))
            tolerance_ms = _number_in(body, "tolerance_ms", 2.0, 0.001, 10_000)
            backend = body.get("backend", "auto")
            from netem.probe import BACKENDS

            if backend not in ("auto", *BACKENDS):
                raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
            ip = peer_ip(body["verifier_url"])
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        async with self._lock:
            try:
                self._record = await self._in_thread(self._apply, ip, spec, backend, verify_count, tolerance_ms)
            except Exception as exc:  # noqa: BLE001 - the caller gets the reason
                log.exception("shaping the link to %s failed", ip)
                return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
        return web.json_response(self._record)

    async def delete(self, _request: web.Request) -> web.Response:
        async with self._lock:
            try:
                await self._in_thread(self._remove)
            except Exception as exc:  # noqa: BLE001
                return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
        return web.json_response({"record": None})

    async def post_probe(self, request: web.Request) -> web.Response:
        try:
            body = _check_keys(await request.json(), PROBE_FIELDS)
            count = int(_number_in(body, "count", 20, 1, MAX_PROBES))
            interval_s = _number_in(body, "interval_ms", 50.0, 1.0, 10_000) / 1000
            app_delay_ms = _number_in(body, "app_delay_ms", 0.0, 0.0, 10_000)
            peer_ip(body["verifier_url"])
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        try:
            rtts_ms = await self.probe(body["verifier_url"], count, interval_s, app_delay_ms)
        except Exception as exc:  # noqa: BLE001
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=502)
        return web.json_response({"rtt_ms": rtts_ms, "count": count})

    # ---- on the link thread ----------------------------------------------------------------

    def _apply(self, ip: str, spec: LinkSpec, backend: str, verify_count: int, tolerance_ms: float) -> dict:
        from netem.inside import InsideShaper  # pyroute2 and the rest only where shaping is used
        from netem.shaper import ShaperConfig

        self._remove()
        shaper = InsideShaper(ShaperConfig(backend=backend, verify_count=verify_count))
        record = shaper.apply(ip, spec, tolerance_ms=tolerance_ms)  # closes itself on failure
        self.shaper = shaper
        return record.as_json()

    def _remove(self) -> None:
        shaper, self.shaper, self._record = self.shaper, None, None
        if shaper is not None:
            shaper.close()
