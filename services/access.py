"""Who may talk to a service: the address it listens on, and an optional shared token.

Listening: the services' default is 127.0.0.1. The wildcard addresses (``0.0.0.0``, ``::``)
listen on every interface of the network namespace, which on a host is every network the host
is on; they get a warning in the log unless ``--allow-any-host`` says the namespace
is the testbed's own (compose.yaml: a container whose only interfaces are lo and the internal
testbed network).

The token: ``--token-file PATH`` (or the environment variable ``DSD_TOKEN``) holds one shared
secret. A verifier with a token requires ``Authorization: Bearer TOKEN`` at the WebSocket upgrade
and on /metrics; an edge with one sends it to the verifier and requires it on its own control API
(``/runs``: a run names the verifier the edge connects to). /health stays open on both, for
readiness polls. The token says "a member of this testbed", not which client: per-client limits
apply per connection.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import re
import stat
from pathlib import Path

from aiohttp import web

from services.wire import UNAUTHORIZED

TOKEN_ENV = "DSD_TOKEN"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
MIN_TOKEN_CHARS = 16
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces: it travels in a header


def add_access_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("access")
    group.add_argument(
        "--allow-any-host",
        action="store_true",
        help="allow --host 0.0.0.0/:: without a warning: only where the network namespace "
        "is the testbed's own (a container on the internal testbed network)",
    )
    group.add_argument(
        "--token-file",
        default="",
        help=f"a file holding the shared token (default: ${TOKEN_ENV} if set, else no token)",
    )


def check_host(host: str, allow_any_host: bool, log: logging.Logger) -> None:
    """Warn about a wildcard listen address unless it was allowed explicitly."""
    if host in WILDCARD_HOSTS and not allow_any_host:
        log.warning(
            "listening on %r: every interface of this network namespace, which on a host means "
            "every network it is on. Use the testbed address (or 127.0.0.1), or pass "
            "--allow-any-host where the namespace holds only the testbed network.",
            host or "*",
        )


def load_token(token_file: str, environ=os.environ, log: logging.Logger | None = None) -> str | None:
    """The shared token from --token-file, else from $DSD_TOKEN; None when neither is set."""
    if token_file:
        path = Path(token_file)
        try:
            token = path.read_text().strip()
            mode = path.stat().st_mode
        except OSError as exc:
            raise ValueError(f"--token-file {token_file!r}: {exc.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO) and log is not None:
            log.warning("--token-file %s is readable by others (mode %o): make it 0600", token_file, mode & 0o777)
        source = f"--token-file {token_file!r}"
    else:
        token = environ.get(TOKEN_ENV, "").strip()
        if not token:
            return None
        source = f"${TOKEN_ENV}"
    if not _TOKEN_RE.fullmatch(token) or len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"{source}: a token is at least {MIN_TOKEN_CHARS} printable ASCII characters without "
            f"spaces, got {len(token)} characters"
        )
    return token


def bearer_header(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def bearer_matches(header: str | None, token: str) -> bool:
    """Constant-time comparison of an Authorization header with the expected token."""
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def refusal(request: web.Request, token: str | None, log: logging.Logger) -> web.Response | None:
    """A 401 with a structured body (code ``unauthorized``, the field, why) unless the request
    carries the token, or no token is set; None when the request may go on."""
    if token is None or bearer_matches(request.headers.get("Authorization"), token):
        return None
    reason = "no Authorization header" if "Authorization" not in request.headers else "wrong token"
    log.warning("refused %s %s from %s: %s", request.method, request.path, request.remote, reason)
    return web.json_response(
        {
            "code": UNAUTHORIZED,
            "field": "Authorization",
            "message": f"{reason}: this service requires 'Authorization: Bearer <token>'",
        },
        status=401,
        headers={"WWW-Authenticate": "Bearer"},
    )
