"""The engines of one side, and which of them takes the next request.

    Engine              one upstream: its URL, its connection pool, its requests in flight
    Pool.acquire        the engine with the fewest requests in flight, among those neither down
                        nor already tried; ties go round-robin (or the one a router preferred,
                        if up). Counts the request in flight.
    Pool.release        the request ended (answered, failed or abandoned)
    Pool.mark_down      skip an engine for ``backoff_s``: a connection to it failed, or it broke
                        off a request (or, on the prefill side, a request to it failed)
    Pool.set_health     record an engine's /health probe: one that failed skips the engine
                        until one passes
    Pool.down_reasons   the engines skipped now, with why
    Pool.up             the engines up now
    Pool.is_up, named   one engine's state; the engine at a URL
    Pool.elsewhere      whether a request waiting on an engine could go to another one now

An engine is down while either holds: its backoff has not ended, or its last probe failed.
Going down sets the engine's ``fault`` event: the requests that wait on it for the first byte
of an answer are sent to another engine (``stall.py``). A pool whose requests have no other way
(``last_resort``: a decode side, a fleet) still sends them to an engine whose probe only timed
out (a stalled engine, which may answer late) when no engine is up, rather than fail them; a
prefill side does not (skipping it costs a recompute, not an error).

Single-threaded: every call comes from the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

import httpx


@dataclass(eq=False)
class Engine:
    """One vLLM server. ``client`` is its own keep-alive pool, shared by all requests."""

    url: str
    client: httpx.AsyncClient
    in_flight: int = 0
    down_until: float = 0.0  # clock time; the engine is up again from then on
    down_reason: str = ""
    unhealthy: str = ""  # why its last /health probe failed; "" once one passed (or none ran)
    stalled: bool = False  # its last probe failed for want of an answer in time
    warned_no_offer: bool = False  # logged once: its prefills return no kv_transfer_params
    # set when it goes down; a request acquiring it up takes a fresh one if that was set
    fault: asyncio.Event = field(default_factory=asyncio.Event)


class Pool:
    """The engines of one ``side`` (``"prefill"`` or ``"decode"``)."""

    def __init__(
        self,
        side: str,
        engines: Sequence[Engine],
        backoff_s: float,
        clock: Callable[[], float] = time.monotonic,
        last_resort: bool = False,
    ) -> None:
        self.side = side
        self.engines = tuple(engines)
        self.backoff_s = backoff_s
        self.last_resort = last_resort
        self._clock = clock
        self._turn = 0  # where the next tie-break scan starts

    def acquire(self, tried: Container[str] = (), prefer: str | None = None) -> Engine | None:
        """The engine to send a request to, counted in flight; None: every one is down or tried.
        ``prefer``: that engine's URL, if it is up and not tried (a router chose it)."""
        now = self._clock()
        if prefer is not None and prefer not in tried:
            chosen = self.named(prefer)
            if _up(chosen, now):
                return _counted(chosen)
        best = self._least(tried, lambda engine: _up(engine, now))
        if best is None and self.last_resort:
            best = self._least(tried, lambda engine: _stalled_only(engine, now))
        return None if best is None else _counted(best)

    def _least(self, tried: Container[str], fit: Callable[[Engine], bool]) -> Engine | None:
        """The fitting engine not tried with the fewest in flight, ties in turn."""
        best: Engine | None = None
        best_index = 0
        for step in range(len(self.engines)):
            index = (self._turn + step) % len(self.engines)
            engine = self.engines[index]
            if engine.url in tried or not fit(engine):
                continue
            if best is None or engine.in_flight < best.in_flight:
                best, best_index = engine, index
        if best is not None:
            self._turn = best_index + 1
        return best

    def release(self, engine: Engine) -> None:
        """A request ``acquire`` counted on ``engine`` is over."""
        engine.in_flight -= 1
        assert engine.in_flight >= 0, f"{engine.url}: released more requests than acquired"

    def mark_down(self, engine: Engine, reason: str) -> None:
        """Skip ``engine`` for ``backoff_s``, remembering why (for the error a client gets)."""
        engine.down_until = self._clock() + self.backoff_s
        engine.down_reason = reason
        engine.fault.set()

    def set_health(self, engine: Engine, probed: str, stalled: bool = False) -> bool:
        """Record a /health probe of ``engine``: ``""`` passed, else why it failed (the engine is
        skipped until a probe passes; ``stalled``: it failed for want of an answer in time).
        Whether the engine went down or came back by it."""
        changed = bool(engine.unhealthy) != bool(probed)
        engine.unhealthy = probed
        engine.stalled = bool(probed) and stalled
        if probed:
            engine.fault.set()
        return changed

    def elsewhere(self, engine: Engine | None, tried: Container[str] = ()) -> bool:
        """Whether an engine up other than ``engine`` (and those ``tried``) could take a
        request now."""
        now = self._clock()
        return any(
            other is not engine and other.url not in tried and _up(other, now)
            for other in self.engines
        )

    def up(self) -> list[Engine]:
        """The engines ``acquire`` may return now, in order (one look at the clock)."""
        now = self._clock()
        return [engine for engine in self.engines if _up(engine, now)]

    def is_up(self, engine: Engine) -> bool:
        """Whether ``acquire`` may return ``engine`` now."""
        return _up(engine, self._clock())

    def named(self, url: str) -> Engine:
        """The engine at ``url`` (``KeyError`` if not of this side)."""
        for engine in self.engines:
            if engine.url == url:
                return engine
        raise KeyError(f"{self.side}: no engine {url}")

    def any_up(self) -> bool:
        """Whether ``acquire`` could return an engine now (nothing tried yet)."""
        now = self._clock()
        return any(
            _up(engine, now) or (self.last_resort and _stalled_only(engine, now))
            for engine in self.engines
        )

    def down_reasons(self) -> dict[str, str]:
        """URL -> why, for each engine skipped now, in the order the engines were given."""
        now = self._clock()
        return {e.url: e.unhealthy or e.down_reason for e in self.engines if not _up(e, now)}


def _up(engine: Engine, now: float) -> bool:
    return engine.down_until <= now and not engine.unhealthy


def _stalled_only(engine: Engine, now: float) -> bool:
    """Down only because its probe timed out: it may still answer, late."""
    return engine.down_until <= now and engine.stalled


def _counted(engine: Engine) -> Engine:
    """``engine``, acquired: one more in flight; a fault event of a past outage replaced."""
    if engine.fault.is_set() and not engine.unhealthy:
        engine.fault = asyncio.Event()
    engine.in_flight += 1
    return engine
