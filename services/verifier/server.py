"""The verifier: its state, and its roles by module (http, messages, serving)."""

from __future__ import annotations

import itertools
import time
from collections import Counter

from dsd.backends.protocol import LanguageModel
from services import spinwait
from services.verifier.scheduler import Scheduler
from services.verifier.connection import Connection
from services.verifier.http import VerifierHttp
from services.verifier.limits import VerifierLimits
from services.verifier.messages import VerifierMessages
from services.verifier.serving import VerifierServing


class Verifier(VerifierHttp, VerifierMessages, VerifierServing):
    """The verifier service's state; its roles are the three classes it is made of."""

    def __init__(
        self,
        draft: LanguageModel,
        target: LanguageModel,
        device,
        scheduler: Scheduler,
        limits: VerifierLimits,
        backend_info: dict,
        token: str | None = None,
        spin: spinwait.SpinConfig = spinwait.SpinConfig(),
    ) -> None:
        self.draft, self.target, self.device = draft, target, device
        self.spin = spin  # services.spinwait: the loop polls for a lone session's next block
        self.selector: spinwait.SpinSelector | None = None  # the serving loop's, if it polls
        self.scheduler = scheduler
        scheduler.after_loop_pass = self.after_loop_pass
        self.limits = limits
        self.token = token  # None: no authentication
        self.backend_info = backend_info
        self.started_s = time.perf_counter()
        self.sessions_open = 0
        self.counts: Counter[str] = Counter()  # connections, sessions, rounds by kind
        self.errors: Counter[str] = Counter()
        self._numbers = itertools.count(1)
        self._connections: dict[int, Connection] = {}
