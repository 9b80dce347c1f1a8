"""One request on one side: pick an engine, try another while connections fail, read the answer.

    open_exchange(pool, ...) -> Exchange   the answer's status and headers have arrived
    Exchange.read()                        the whole body; closes
    Exchange.chunks()                      the body as it arrives, bytes as sent
    Exchange.close()                       idempotent: frees the connection and the engine's slot

A connection that cannot be made (refused, timed out) marks the engine down and the request goes
to another engine of the side. Anything later (the engine breaks off, or the deadline passes)
is ``EngineFailed``: the engine may have started on the request, so it is not sent again.
Every wait ends at ``deadline``, a time on the event loop's clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.errors import EngineFailed, EnginesDown

CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout)


class Exchange:
    """An answer being received from ``engine``; holds its connection until ``close``."""

    def __init__(self, pool: Pool, engine: Engine, response: httpx.Response, deadline: float):
        self.pool = pool
        self.engine = engine
        self.response = response
        self.deadline = deadline
        self._closed = False

    async def read(self) -> bytes:
        """The whole body as sent (no content decoding); the exchange is closed after."""
        try:
            return b"".join([chunk async for chunk in self.chunks()])
        finally:
            await self.close()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in. Raises ``EngineFailed``."""
        pieces = self.response.aiter_raw()
        while True:
            try:
                async with asyncio.timeout_at(self.deadline):
                    chunk = await anext(pieces)
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.TransportError) as exc:
                raise failure(self.pool.side, self.engine.url, exc) from exc
            yield chunk

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.release(self.engine)
        await self.response.aclose()


async def open_exchange(
    pool: Pool,
    method: str,
    path: str,
    body: bytes | None,
    headers: Mapping[str, str],
    deadline: float,
    prefer: str | None = None,
) -> Exchange:
    """Send the request to an engine of ``pool`` (``prefer``'s first, if up) and wait for its
    answer's headers.

    Raises ``EnginesDown`` (naming each engine and why) when none could be connected to, and
    ``EngineFailed`` when the chosen one failed after that."""
    tried: dict[str, str] = {}
    while (engine := pool.acquire(tried, prefer)) is not None:
        request = engine.client.build_request(method, path, content=body, headers=headers)
        try:
            async with asyncio.timeout_at(deadline):
                response = await engine.client.send(request, stream=True)
        except CONNECT_FAILURES as exc:
            pool.release(engine)
            tried[engine.url] = connect_failure(exc)
            pool.mark_down(engine, tried[engine.url])
            continue
        except BaseException as exc:
            pool.release(engine)
            if isinstance(exc, TimeoutError | httpx.TransportError):
                raise failure(pool.side, engine.url, exc) from exc
            raise
        return Exchange(pool, engine, response, deadline)
    raise EnginesDown(pool.side, {**pool.down_reasons(), **tried})


def connect_failure(exc: httpx.TransportError) -> str:
    """Why a connection could not be made, in a few words ("connection refused")."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timed out"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    return f"cannot connect: {exc}"


def failure(side: str, url: str, exc: BaseException) -> EngineFailed:
    """``exc``, raised once the engine had the request, as the error the client gets."""
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return EngineFailed(side, url, "no answer before the proxy's timeout", timed_out=True)
    return EngineFailed(side, url, str(exc) or type(exc).__name__, timed_out=False)
