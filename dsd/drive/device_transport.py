"""The DSD driver's interfaces (dsd/drive/driver.py's docstring describes their use): the ``Device`` that
drafts, the ``Transport`` that carries blocks and verdicts, and a transport's optional abilities,
each a runtime-checkable Protocol the driver tests with ``isinstance``: ``HandsOver`` (it can ask
the server to generate a request's next tokens) and ``Withdraws`` (it can take back segments
asked but not started). Their flag (``hands_over``, ``withdraws``) says whether the ability is on
for this transport (the simulator's is off without a server AR time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from dsd.drive.arrivals import Arrival
from dsd.backends.protocol import Proposal


class Device(Protocol):
    async def draft(self, work: Callable[[], None], n_steps: float, then: Callable[[], Any]) -> tuple[Any, float]: ...


class Transport(Protocol):
    def prepare(self, proposals: list[Proposal]) -> Any: ...
    async def send(self, prepared: Any, after: Arrival | None) -> list[float]: ...
    async def poll(self) -> list[Arrival]: ...
    async def wait(self) -> Arrival: ...


@runtime_checkable
class HandsOver(Protocol):
    hands_over: bool

    async def generate(self, mode: str, gamma: int, max_tokens: int, after: Arrival | None) -> float: ...


@runtime_checkable
class Withdraws(Protocol):
    withdraws: bool

    async def withdraw(self, drop: int, after: Arrival | None) -> float: ...
