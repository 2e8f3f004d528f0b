"""The verifier service (the cloud): the target, and the draft for co-located SD, behind /ws.

    python -m services.verifier --host 127.0.0.1 --port 8700 --backend-json '{"kind": "synthetic", "alpha": 0.8}' \\
        --profile-json '{"t_draft_edge_s": 0.004, ...}' [--max-batch 1 --batch-window-ms 0]

GET /health, GET /metrics (JSON), GET /ws (one WebSocket per edge client; services.wire messages;
services/README.md describes the interface). The same TCP port also takes the frame transport
(services/frames.py): the same messages as length-prefixed frames on a plain TCP connection.

A connection holds sessions, one per request. The messages of one session are served in order by
that session's own task; sessions run concurrently and meet in the scheduler, which owns the one
device. A malformed or out-of-range message is answered with an Error naming the field and
touches nothing else; a connection that closes (or idles out) frees its sessions.

A client is one connection (a shared token, services/access.py, admits members of the testbed
but does not tell them apart). Each connection has its own limits beside the global ones: open
sessions, requests in flight (queued or being served; one more is answered ``busy`` at once,
so the server keeps reading the socket and never buffers a backlog), prompt tokens, and the
tokens its open sessions may hold (prompt + max_new_tokens summed, a proxy for KV-cache bytes);
and the scheduler lets connections take turns, so one flooding client cannot starve another.

The package, by role: ``limits`` (admission and limits, field checks), ``connection`` (a
connection and its sessions), ``http`` (endpoints, WebSocket, frames), ``messages`` (decoding,
checks, dispatch), ``serving`` (one session's requests through the scheduler), ``scheduler`` (the
one device's queue of passes, batched), ``frame_stamps`` (when a frame reached a socket the loop
did not read at once), ``server`` (the ``Verifier`` made of those), ``cli`` (the command line;
``__main__``).
"""

from services.verifier.cli import build, main
from services.verifier.connection import Connection, Served
from services.verifier.http import VERIFIER_KEY
from services.verifier.limits import INFLIGHT, INT63_MAX, VerifierLimits
from services.verifier.server import Verifier

__all__ = [
    "INFLIGHT",
    "INT63_MAX",
    "VERIFIER_KEY",
    "Connection",
    "Served",
    "Verifier",
    "VerifierLimits",
    "build",
    "main",
]
