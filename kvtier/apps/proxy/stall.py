"""Waiting on an engine for the first byte of an answer, unless it dies or stalls first.

    Watch(pool, engine, limits, tried)   a request on ``engine`` (``tried``: the engines it
                                         failed on before), within ``limits`` (``FirstByte``)
    await watch.wait(step)           ``step``'s result; ``EngineFailed`` with cause
                                     ``STALLED`` when, before it is done, the engine goes down
                                     (``Engine.fault``: its /health probe failed or timed out,
                                     or another request found it dead) while another engine
                                     could take the request (on a prefill side, always: the
                                     decode engine computes instead), or the first byte's
                                     limit passes;
                                     ``TIMED_OUT`` at the request's deadline

Nothing of the answer has reached the client while a ``step`` runs (the request's headers and,
for a stream, its first event, or a whole answer not streamed), so the request may go to
another engine. With no other engine up, a request keeps waiting on its own (a stalled engine
may answer late), up to the first byte's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Container
from typing import Any, NamedTuple, TypeVar

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.errors import STALLED, TIMED_OUT, EngineFailed

T = TypeVar("T")


class FirstByte(NamedTuple):
    """A request's limits, as times on the event loop's clock: its ``deadline``, and when its
    first byte is due from an engine (``by``, ``limit_s`` after it was sent there)."""

    deadline: float
    limit_s: float

    def by(self) -> float:
        return min(self.deadline, asyncio.get_running_loop().time() + self.limit_s)


class Watch:
    def __init__(
        self, pool: Pool, engine: Engine, limits: FirstByte, tried: Container[str]
    ) -> None:
        self.pool, self.engine, self.limits, self.tried = pool, engine, limits, tried
        self.by = limits.by()
        self.fault = engine.fault  # this outage's: a later one sets a later event

    async def wait(self, step: Awaitable[T]) -> T:
        """``step``'s result, or ``EngineFailed`` (``STALLED``) as the module says."""
        work = asyncio.ensure_future(step)
        fault: asyncio.Future[Any] | None = asyncio.ensure_future(self.fault.wait())
        try:
            while True:
                waits: set[asyncio.Future[Any]] = {work}
                if fault is not None:
                    waits.add(fault)
                timeout = self.by - asyncio.get_running_loop().time()
                done, _ = await asyncio.wait(
                    waits, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED
                )
                if work in done:
                    return work.result()
                if not done:
                    raise self._timed_out()
                if not self.pool.last_resort or self.pool.elsewhere(self.engine, self.tried):
                    why = self.engine.unhealthy or self.engine.down_reason or "down"
                    raise self._failed(f"went down while it had the request ({why})", STALLED)
                fault = None  # no other engine: wait on this one, up to the bound
        finally:
            if fault is not None:
                fault.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work

    def _timed_out(self) -> EngineFailed:
        if self.by >= self.limits.deadline:
            return self._failed("no answer before the proxy's timeout", TIMED_OUT)
        return self._failed(f"no first byte in {self.limits.limit_s:g} s", STALLED)

    def _failed(self, reason: str, cause: str) -> EngineFailed:
        return EngineFailed(self.pool.side, self.engine.url, reason, cause == TIMED_OUT, cause)
