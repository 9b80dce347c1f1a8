"""The engines of one side, and which of them takes the next request.

    Engine              one upstream: its URL, its connection pool, its requests in flight
    Pool.acquire        the engine with the fewest requests in flight, among those neither down
                        nor already tried; ties go round-robin. Counts the request in flight.
    Pool.release        the request ended (answered, failed or abandoned)
    Pool.mark_down      skip an engine for ``backoff_s``: a connection to it failed
    Pool.down_reasons   the engines skipped now, with why

Single-threaded: every call comes from the proxy's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

import httpx


@dataclass(eq=False)
class Engine:
    """One vLLM server. ``client`` is its own keep-alive pool, shared by all requests."""

    url: str
    client: httpx.AsyncClient
    in_flight: int = 0
    down_until: float = 0.0  # clock time; the engine is up again from then on
    down_reason: str = ""
    warned_no_offer: bool = False  # logged once: its prefills return no kv_transfer_params


class Pool:
    """The engines of one ``side`` (``"prefill"`` or ``"decode"``)."""

    def __init__(
        self,
        side: str,
        engines: Sequence[Engine],
        backoff_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.side = side
        self.engines = tuple(engines)
        self.backoff_s = backoff_s
        self._clock = clock
        self._turn = 0  # where the next tie-break scan starts

    def acquire(self, tried: Container[str] = ()) -> Engine | None:
        """The engine to send a request to, counted in flight; None: every one is down or tried."""
        now = self._clock()
        best: Engine | None = None
        best_index = 0
        for step in range(len(self.engines)):
            index = (self._turn + step) % len(self.engines)
            engine = self.engines[index]
            if engine.url in tried or engine.down_until > now:
                continue
            if best is None or engine.in_flight < best.in_flight:
                best, best_index = engine, index
        if best is not None:
            self._turn = best_index + 1
            best.in_flight += 1
        return best

    def release(self, engine: Engine) -> None:
        """A request ``acquire`` counted on ``engine`` is over."""
        engine.in_flight -= 1
        assert engine.in_flight >= 0, f"{engine.url}: released more requests than acquired"

    def mark_down(self, engine: Engine, reason: str) -> None:
        """Skip ``engine`` for ``backoff_s``, remembering why (for the error a client gets)."""
        engine.down_until = self._clock() + self.backoff_s
        engine.down_reason = reason

    def any_up(self) -> bool:
        """Whether ``acquire`` could return an engine now (nothing tried yet)."""
        now = self._clock()
        return any(engine.down_until <= now for engine in self.engines)

    def down_reasons(self) -> dict[str, str]:
        """URL -> why, for each engine skipped now, in the order the engines were given."""
        now = self._clock()
        return {e.url: e.down_reason for e in self.engines if e.down_until > now}
