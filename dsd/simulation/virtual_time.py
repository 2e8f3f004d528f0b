"""Virtual time for the simulated clients: an event loop, and each client as a coroutine that
suspends when its clock moves (a draft step, waiting for a verdict) and resumes at that virtual
time, so every send happens in time order across clients."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine, Generator


class VirtualLoop:
    """Virtual time: events run in time order, at one time the verifier's decisions last (so jobs
    that arrive together are there together), otherwise in the order they were scheduled."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.events: list[tuple[float, bool, int, Callable[[], None]]] = []
        self.order = itertools.count()

    def __call__(self) -> float:
        return self.now_s

    def at(self, t_s: float, fn: Callable[[], None], last: bool = False) -> None:
        heapq.heappush(self.events, (t_s, last, next(self.order), fn))

    def run(self) -> None:
        while self.events:
            t_s, _, _, fn = heapq.heappop(self.events)
            self.now_s = max(self.now_s, t_s)
            fn()


class Suspend:
    """What a client's coroutine awaits to give the loop back: resume at ``t_s`` (None: when woken)."""

    def __init__(self, t_s: float | None) -> None:
        self.t_s = t_s

    def __await__(self) -> Generator[Suspend, None, None]:
        yield self


class ClientCoroutine:
    """One client's coroutine on the loop; ``run(client)`` makes it."""

    def __init__(self, loop: VirtualLoop, run: Callable[[ClientCoroutine], Coroutine[Suspend, None, None]]) -> None:
        self.loop, self.parked = loop, False
        self.coroutine = run(self)

    def resume(self) -> None:
        self.parked = False
        try:
            suspend = self.coroutine.send(None)
        except StopIteration:
            return
        if suspend.t_s is None:
            self.parked = True
        else:
            self.loop.at(suspend.t_s, self.resume)

    def wake(self) -> None:
        if self.parked:
            self.resume()
