"""What the verifier's roles share: the state ``Verifier`` sets up (services/verifier/server.py),
declared once so that each role (serving, then messages, then http, each built on the one
before) is checked against it, and the one call the serving role makes into the messages role."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from dsd.backends.protocol import LanguageModel
from services import spinwait, wire
from services.compute import EmulatedDevice, ThreadDevice
from services.verifier.scheduler import Scheduler
from services.verifier.connection import Connection
from services.verifier.limits import VerifierLimits


class VerifierState:
    draft: LanguageModel
    target: LanguageModel
    device: EmulatedDevice | ThreadDevice
    spin: spinwait.SpinConfig
    selector: spinwait.SpinSelector | None
    scheduler: Scheduler
    limits: VerifierLimits
    token: str | None
    backend_info: dict[str, Any]
    started_s: float
    sessions_open: int
    counts: Counter[str]
    errors: Counter[str]
    _numbers: itertools.count[int]
    _connections: dict[int, Connection]

    async def _reply_error(self, conn: Connection, error: wire.WireError) -> None:
        """Answer a client's error (services/verifier/messages.py)."""
        raise NotImplementedError
