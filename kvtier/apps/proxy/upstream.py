"""One request on one side: pick an engine, try another while connections fail, read the answer.

    open_exchange(pool, ...) -> Exchange   the answer's status and headers have arrived
    Exchange.read()                        the whole body; closes
    Exchange.first()                       the body's first piece (b"" for none), kept for
                                           ``chunks``
    Exchange.chunks()                      the body as it arrives, bytes as sent
    Exchange.close()                       idempotent: frees the connection and the engine's slot

A connection that cannot be made (refused, timed out) marks the engine down and the request goes
to another engine of the side. Anything later (the engine breaks off, or the deadline passes)
is ``EngineFailed``: whether to send it again is the caller's (``resend.py``). Every wait ends
at ``deadline``, a time on the event loop's clock. Given ``limits`` (``stall.FirstByte``), the
waits before the first byte of the answer (its headers; ``first``, or a whole ``read``) also
end when the engine goes down or its first byte is late (``stall.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

import httpx

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.errors import EngineFailed, EnginesDown
from kvtier.apps.proxy.stall import FirstByte, Watch

T = TypeVar("T")

CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout)


class Exchange:
    """An answer being received from ``engine``; holds its connection until ``close``."""

    def __init__(
        self,
        pool: Pool,
        engine: Engine,
        response: httpx.Response,
        deadline: float,
        watch: Watch | None = None,
    ):
        self.pool = pool
        self.engine = engine
        self.response = response
        self.deadline = deadline
        self.watch = watch  # the first byte's watch, None once it came
        self._pieces = response.aiter_raw()
        self._first: bytes | None = None
        self._closed = False

    async def read(self) -> bytes:
        """The whole body as sent (no content decoding); the exchange is closed after."""
        try:
            return await self._before_first_byte(self._all())
        finally:
            await self.close()

    async def first(self) -> bytes:
        """The body's first piece (b"": an empty body); ``chunks`` yields it first."""
        if self._first is None:
            self._first = await self._before_first_byte(self._next()) or b""
        return self._first

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in. Raises ``EngineFailed``."""
        if self._first is not None:
            first, self._first = self._first, b""
            if first:
                yield first
        while (chunk := await self._next()) is not None:
            yield chunk

    async def _all(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def _next(self) -> bytes | None:
        """The next piece; None at the end."""
        try:
            async with asyncio.timeout_at(self.deadline):
                return await anext(self._pieces)
        except StopAsyncIteration:
            return None
        except (TimeoutError, httpx.TransportError) as exc:
            raise failure(self.pool.side, self.engine.url, exc) from exc

    async def _before_first_byte(self, step: Awaitable[T]) -> T:
        watch, self.watch = self.watch, None
        return await (step if watch is None else watch.wait(step))

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
    limits: FirstByte | None = None,
    tried: dict[str, str] | None = None,
    took: list[str] | None = None,
) -> Exchange:
    """Send the request to an engine of ``pool`` (``prefer``'s first, if up; none of
    ``tried``, which gains those that refused; ``took`` gains each engine it is sent to) and
    wait for its answer's headers.

    Raises ``EnginesDown`` (naming each engine and why) when none could be connected to, and
    ``EngineFailed`` when the chosen one failed after that."""
    tried = {} if tried is None else tried
    while (engine := pool.acquire(tried, prefer)) is not None:
        if took is not None:
            took.append(engine.url)
        request = engine.client.build_request(method, path, content=body, headers=headers)
        watch = None if limits is None else Watch(pool, engine, limits, tried)
        sent = engine.client.send(request, stream=True)
        try:
            async with asyncio.timeout_at(deadline):
                response = await (sent if watch is None else watch.wait(sent))
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
        return Exchange(pool, engine, response, deadline, watch)
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
