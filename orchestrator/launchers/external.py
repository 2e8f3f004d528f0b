"""The ``external`` launcher: a verifier and edges that someone else started (a Jetson, a laptop,
a cloud VM, or namespaces made by hand), given as URLs and a token. Nothing is started or
stopped here; the sweep drives the edges through their control API as on any launcher.

    [external]                               # in the experiment file, with launcher = "external"
    verifier_url = "http://10.0.0.5:8700"    # as the EDGES reach it (ws://.../ws works too)
    edge_urls = ["http://10.0.0.7:8701", "http://10.0.0.8:8701"]   # control APIs, as we reach them
    token_file = "~/dsd-token"               # the token the services were started with
    shaping = "off"                          # "off" | "app-delay" | "edge"

The link, by ``shaping``:

- ``off`` (default): the real link as it is. ``rtt_ms`` must be ``[0]`` (nothing is added); each
  point first measures every edge's RTT to the verifier with the edge's own probes
  (``POST /link/probe``: Ping/Pong over a WebSocket, as during a run) and links.csv records it
  with ``shaper = none``.
- ``app-delay``: each edge adds rtt_ms/2 each way in the application (as on loopback), on top of
  the real link; the probes measure the sum (``shaper = app-delay``). Needs nothing of the device.
- ``edge``: each edge shapes its own link from inside its network namespace through its control
  API (``PUT /link``, `netem.inside`: kernel netem where the device has it, else the NFQUEUE
  daemon), adding rtt_ms to the real link, and verifies it with ICMP probes against the real
  link's RTT measured just before (``shaper = in-edge-nfqueue`` or ``in-edge-kernel-netem``).
  The edge must run with ``--shape-link`` and CAP_NET_ADMIN + CAP_NET_RAW in its namespace (root
  on a device, ``--cap-add NET_ADMIN`` in a container). The orchestrator cannot shape a link it
  does not own any other way: it has no access to a remote device's interfaces.

close() removes the shaping it applied and leaves the services running: they are not ours.
heal() cannot restart them either; it drops broken shaping and names a service that is down.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from orchestrator.common import http_client
from netem.measure import percentile
from netem.spec import LinkSpec
from orchestrator.launchers.base import EdgeHandle, LinkState
from orchestrator.launchers.control_api import ControlApiTestbed
from orchestrator.links.keys import as_spec
from orchestrator.spec.external import ExternalConfig

_CHECK_INTERVAL_S = 1.0


class ExternalTestbed(ControlApiTestbed):
    """A `Testbed` (base.py) over services that run elsewhere."""

    def __init__(self, config: ExternalConfig, n_edges: int) -> None:
        if n_edges > len(config.edge_urls):
            raise ValueError(
                f"[external] edge_urls: the experiment needs {n_edges} edges, {len(config.edge_urls)} given"
            )
        self.config = config
        self.token = config.token
        self.verifier_url = config.verifier_url
        self.shaper = {"off": "none", "app-delay": "app-delay", "edge": "in-edge"}[config.shaping]
        self.shaper_reason = f"external devices, shaping = {config.shaping!r}"
        self.edges = [
            EdgeHandle(i, url.rstrip("/"), _edge_name(i, url), self.token)
            for i, url in enumerate(config.edge_urls[:n_edges])
        ]
        self._delay_ms: dict[int, float] = {}
        self._shaped: list[EdgeHandle] = []
        self._last_check_s = 0.0
        self._pool = ThreadPoolExecutor(max_workers=min(32, len(self.edges)), thread_name_prefix="dsd-external")
        try:
            self._check_services()
        except BaseException:
            self._pool.shutdown()
            raise

    # ---- the services are there and take our token -------------------------------------------

    def _check_services(self) -> None:
        c = self.config
        base = c.verifier_health_url
        _expect_role(base, "verifier", c.timeout_s)
        status, body = _request("GET", base + "/metrics", None, c.timeout_s, self.token)
        if status != 200:
            raise RuntimeError(f"verifier {base} refused the token from {c.token_file} (/metrics: HTTP {status})")
        for edge in self.edges:
            _expect_role(edge.control_url, "edge", c.timeout_s)
            status, body = _request("GET", edge.control_url + "/link", None, c.timeout_s, self.token)
            if status == 401:
                raise RuntimeError(f"edge {edge.control_url} refused the token from {c.token_file}")
            if status != 200:
                raise RuntimeError(f"edge {edge.control_url} has no /link API (HTTP {status}): update the edge")
            if c.shaping == "edge" and not json.loads(body).get("shaping_allowed"):
                raise RuntimeError(
                    f"edge {edge.control_url} does not shape its link: shaping = 'edge' needs it "
                    "started with --shape-link (and CAP_NET_ADMIN in its network namespace)"
                )

    # ---- Testbed ----------------------------------------------------------------------------

    def shape(self, rtt_ms_per_edge: list) -> list[LinkState]:
        """One RTT (ms) or one LinkSpec per edge: any spec where the edges shape their links,
        a plain RTT with app-delay, 0 on the real link."""
        if len(rtt_ms_per_edge) > len(self.edges):
            raise ValueError(f"{len(rtt_ms_per_edge)} links for {len(self.edges)} edges")
        mode = self.config.shaping
        if mode == "edge":
            pairs = list(zip(self.edges, [as_spec(link) for link in rtt_ms_per_edge]))
            self._shaped += [e for e, _ in pairs if e not in self._shaped]
            return list(
                self._pool.map(
                    lambda p: shape_in_edge(p[0], p[1], self._edge_body(), self.token, self.config.timeout_s), pairs
                )
            )
        pairs = list(zip(self.edges, [_plain_rtt_ms(link) for link in rtt_ms_per_edge]))
        if mode == "off" and any(rtt != 0 for _, rtt in pairs):
            raise ValueError("rtt_ms must be 0 with [external] shaping = 'off' (the real link; nothing is added)")
        self._delay_ms = {e.client_id: rtt / 2 for e, rtt in pairs} if mode == "app-delay" else {}
        return list(self._pool.map(lambda p: self._probe_edge(*p), pairs))

    def _edge_body(self) -> dict:
        c = self.config
        return {
            "verifier_url": self.verifier_url,
            "backend": c.shaper_backend,
            "verify_count": c.verify_count,
            "tolerance_ms": c.verify_tolerance_ms,
        }

    def _probe_edge(self, edge: EdgeHandle, rtt_ms: float) -> LinkState:
        """The edge's RTT to the verifier as a run would see it (its app delay included)."""
        c = self.config
        body = {
            "verifier_url": self.verifier_url,
            "count": c.probe_count,
            "interval_ms": c.probe_interval_ms,
            "app_delay_ms": self._delay_ms.get(edge.client_id, 0.0),
        }
        timeout_s = c.timeout_s + c.probe_count * (c.probe_interval_ms / 1000 + 1.0)
        rtts = json.loads(http_client.call("POST", edge.control_url + "/link/probe", body, timeout_s, self.token))[
            "rtt_ms"
        ]
        return LinkState(
            edge=edge.name,
            shaper=self.shaper,
            rtt_configured_ms=float(rtt_ms),
            rtt_measured_p50_ms=percentile(rtts, 50, "linear"),
            rtt_measured_p99_ms=percentile(rtts, 99, "linear"),
            rtt_measured_stdev_ms=statistics.stdev(rtts) if len(rtts) > 1 else float("nan"),
            loss_measured_pct=100.0 * (1 - len(rtts) / c.probe_count),
        )

    def _shape_edge(self, edge: EdgeHandle, link) -> LinkState:
        state = shape_in_edge(edge, as_spec(link), self._edge_body(), self.token, self.config.timeout_s)
        self.shaper = state.shaper
        return state

    def app_delay_ms(self, client_id: int) -> float:
        return self._delay_ms.get(client_id % len(self.edges), 0.0)

    def check(self) -> None:
        """Shaping in an edge died (a dead NFQUEUE daemon drops every packet): raise. Asked at
        most once a second: every edge is a control call."""
        if not self._shaped or time.monotonic() - self._last_check_s < _CHECK_INTERVAL_S:
            return
        self._last_check_s = time.monotonic()
        for edge in self._shaped:
            failures = json.loads(
                http_client.call("GET", edge.control_url + "/link", None, self.config.timeout_s, self.token)
            )["failures"]
            if failures:
                raise RuntimeError(f"shaping in {edge.name} failed: {failures[0]}")

    def heal(self) -> list[str]:
        """The services are not ours to restart: drop shaping that broke (the next point applies
        it afresh) and name a service that does not answer."""
        healed, down = [], []
        for edge in self._shaped:
            try:
                state = json.loads(
                    http_client.call("GET", edge.control_url + "/link", None, self.config.timeout_s, self.token)
                )
            except (OSError, RuntimeError):
                down.append(edge.name)
                continue
            if state["failures"]:
                http_client.call("DELETE", edge.control_url + "/link", None, self.config.timeout_s, self.token)
                healed.append(f"removed broken shaping in {edge.name} ({state['failures'][0][:120]})")
        for url, role in [
            (self.config.verifier_health_url, "verifier"),
            *((e.control_url, "edge") for e in self.edges),
        ]:
            try:
                _expect_role(url, role, self.config.timeout_s)
            except RuntimeError:
                down.append(url)
        if down:
            raise RuntimeError(f"external services not answering (restart them by hand): {sorted(set(down))}")
        return healed

    def close(self) -> None:
        """Remove the shaping we applied; the services stay up (they are not ours)."""
        errors = []
        for edge in self._shaped:
            try:
                http_client.call("DELETE", edge.control_url + "/link", None, self.config.timeout_s, self.token)
            except (OSError, RuntimeError) as exc:
                errors.append(f"{edge.name}: {exc}")
        self._shaped = []
        self._pool.shutdown()
        if errors:
            raise RuntimeError("could not remove the shaping of " + "; ".join(errors))

    def __enter__(self) -> ExternalTestbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def shape_in_edge(edge: EdgeHandle, spec: LinkSpec, body: dict, token: str | None, timeout_s: float) -> LinkState:
    """PUT /link on one edge: it shapes its own link to `spec` and verifies it (services/shaping_api.py).
    The configured RTT recorded is the edge's base RTT (measured just before) plus the spec's."""
    fields_ = {k: v for k, v in spec.as_dict().items() if v is not None}
    verify_count = body.get("verify_count", 100)
    timeout_s += 30.0 + verify_count * (0.02 + 3 * spec.expected_rtt_ms() / 1000)
    record = json.loads(http_client.call("PUT", edge.control_url + "/link", {**body, **fields_}, timeout_s, token))
    m = record["measured"] or {}
    nan = float("nan")
    return LinkState(
        edge=edge.name,
        shaper=f"in-edge-{record['backend']}",
        rtt_configured_ms=m.get("configured_rtt_ms", spec.expected_rtt_ms()),
        jitter_configured_ms=spec.jitter_ms,
        loss_configured_pct=spec.loss_pct,
        rate_configured_mbit=spec.rate_mbit or 0.0,
        rtt_measured_p50_ms=m.get("rtt_p50_ms", nan),
        rtt_measured_p99_ms=m.get("rtt_p99_ms", nan),
        rtt_measured_stdev_ms=m.get("rtt_stdev_ms", nan),
        loss_measured_pct=m.get("loss_pct", nan),
    )


def _edge_name(index: int, url: str) -> str:
    return f"edge{index}@{urllib.parse.urlsplit(url).netloc}"


def _request(method: str, url: str, body, timeout_s: float, token: str | None) -> tuple[int, bytes]:
    try:
        return http_client.request(method, url, body, timeout_s, token)
    except OSError as exc:
        raise RuntimeError(f"{method} {url}: {exc}") from None


def _expect_role(base_url: str, role: str, timeout_s: float) -> None:
    status, body = _request("GET", base_url + "/health", None, timeout_s, None)
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {}
    if status != 200 or answer.get("role") != role or answer.get("status") != "ok":
        raise RuntimeError(f"{base_url}/health: expected a healthy {role}, got HTTP {status} {body[:200]!r}")


def _plain_rtt_ms(link) -> float:
    if not isinstance(link, LinkSpec):
        return float(link)
    if link != LinkSpec(rtt_ms=link.rtt_ms):
        raise ValueError(
            f"[external] shaping 'off' or 'app-delay' can only give an RTT; got {link} "
            "(shaping = 'edge' shapes the rest)"
        )
    return link.rtt_ms
