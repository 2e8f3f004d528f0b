"""The edge service (the device): the draft, an HTTP API for the orchestrator, and the client of
every mode, so that all four are measured from the same place over the same link.

    python -m services.edge --host 127.0.0.1 --port 8701 --backend-json '{"kind": "synthetic"}' --profile-json '{...}'

    POST /runs                 start a run (JSON, RunConfig's fields); 201, or 400 naming the field
    GET  /runs/{id}            status ("running", "done", "failed"), progress, error
    GET  /runs/{id}/rounds.csv, /runs/{id}/requests.csv    the traces so far (services.traces)
    GET  /health

A run is one client: one WebSocket to the verifier and its prompts one after another. In sync and
pipelined DSD this process drafts (``dsd.drive.edge_decoder.EdgeDecoder`` on a real clock: one draft step at a
time, handling verdicts between steps and abandoning a draft whose epoch has passed; an emulated
block with no block in flight, which no verdict can cut short, is charged in one wait); for cloud
AR and co-located SD it asks the verifier to generate and records the streamed rounds. Each run
drafts on its own emulated device (every client is its own device); with real models the runs of
one process share one worker thread (NOTE: so concurrent real-model clients in one edge process
slow each other's drafting; start one edge process per client to avoid it).

The link is measured with application-level pings on the same WebSocket, before and during a
run; ``app_delay_ms`` delays every message in each direction (for hosts whose link cannot be
shaped), in order, and is recorded in every row.

The package, by role: ``config`` (RunConfig, a request's record), ``verifier_channel`` (the
connection to the verifier), ``transport`` (dsd.drive.driver's transport and device), ``client`` (one
request in each mode), ``app`` (the HTTP API and its runs), ``cli`` (the command line; ``__main__``).
"""

from services.edge.app import Edge, Run
from services.edge.cli import build, main
from services.edge.client import Client
from services.edge.config import Request, RunConfig, RunError, ws_url
from services.edge.transport import DraftDevice, SessionTransport, _verify_message
from services.edge.verifier_channel import MAX_RECEIVE_BYTES, VerifierChannel, probe_for_request_s

__all__ = [
    "MAX_RECEIVE_BYTES",
    "Client",
    "DraftDevice",
    "Edge",
    "Request",
    "Run",
    "RunConfig",
    "RunError",
    "SessionTransport",
    "VerifierChannel",
    "_verify_message",
    "build",
    "main",
    "probe_for_request_s",
    "ws_url",
]
