"""A request sent again to another engine while nothing of its answer has reached the client.

    await answered(pool, send, headers, policy, count) -> Answered(response, url)

``send(attempt)`` opens the request's exchange with an engine of ``pool`` (``upstream.py``),
avoiding ``attempt.tried``; ``relay`` then waits for the first byte of the answer (a stream's
first event, or a whole answer not streamed) before anything goes to the client. Until then, an
engine that breaks off (its process killed, the connection reset) or stalls (``stall.py``: it
went down while it had the request, or sent no first byte in time) costs the client nothing:
the request goes to another engine. One whose first byte is later than nearly every recent one
(``hedge.py``) goes to a second engine as well, and the first of the two to answer serves it,
the other cancelled. Each sending beyond the first is counted by cause (``count``:
``errors.BROKE``, ``errors.STALLED``, ``HEDGED``), at most ``policy.retries`` of them. An engine
that broke off is skipped for the pool's backoff, so that its other requests move too. The
request's own deadline ending is the client's 504, and a stream that already started ends with
an error event (``relay.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from starlette.responses import Response

from kvtier.apps.proxy.balancer import Pool
from kvtier.apps.proxy.errors import BROKE, HEDGED, TIMED_OUT, EngineFailed
from kvtier.apps.proxy.hedge import Hedge
from kvtier.apps.proxy.relay import StreamRelay, relay
from kvtier.apps.proxy.upstream import Exchange

logger = logging.getLogger(__name__)

Header = tuple[bytes, bytes]


class Attempt(NamedTuple):
    """The ``number``-th sending of a request (0: the first); ``tried``: the engines not to
    send it to, URL -> why (it failed there, or is waiting there; ``open_exchange`` adds those
    that refused a connection); ``took``: the engines it was sent to (``open_exchange`` adds
    each)."""

    number: int
    tried: dict[str, str]
    took: list[str]


class Answered(NamedTuple):
    response: Response
    url: str  # the engine whose answer it is


class Policy(NamedTuple):
    retries: int  # sendings beyond the first, at most
    hedge: Hedge | None  # when a late first byte sends it to a second engine too
    streamed: bool  # the request's kind, for ``hedge``


async def answered(
    pool: Pool,
    send: Callable[[Attempt], Awaitable[Exchange]],
    headers: Callable[[Exchange, Attempt], Sequence[Header]],
    policy: Policy,
    count: Callable[[str], None],
) -> Answered:
    """The client's response: the first answer an engine began, as the module says.

    Raises ``EnginesDown`` when no engine is left to try, and ``EngineFailed`` when the last
    one tried failed (or the deadline passed)."""
    clock = asyncio.get_running_loop().time
    started, tried = clock(), dict[str, str]()
    live: dict[asyncio.Future[Answered], Attempt] = {}
    sendings = 0

    async def one(attempt: Attempt) -> Answered:
        exchange = await send(attempt)
        return Answered(await relay(exchange, headers(exchange, attempt)), exchange.engine.url)

    def start(avoid: dict[str, str]) -> None:
        nonlocal sendings
        attempt = Attempt(sendings, avoid, [])
        live[asyncio.ensure_future(one(attempt))] = attempt
        sendings += 1

    start(tried)
    hedge_at = None if policy.hedge is None else policy.hedge.after(policy.streamed)
    try:
        while True:
            wait = None if hedge_at is None else max(0.0, started + hedge_at - clock())
            done, _ = await asyncio.wait(live, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:  # late: a second engine too, if there is one
                hedge_at = None
                avoid = {**tried, **{url: "busy" for a in live.values() for url in a.took}}
                if sendings <= policy.retries and pool.elsewhere(None, avoid):
                    count(HEDGED)
                    start(avoid)
                continue
            for task in done:
                live.pop(task)
            won = [task for task in done if task.exception() is None]
            for task in won[1:]:
                await _dropped(task)
            if won:
                if policy.hedge is not None:
                    policy.hedge.saw(policy.streamed, clock() - started)
                return won[0].result()
            last = _noted(pool, tried, [task.exception() for task in done])
            if live:
                continue  # another sending may still answer
            if not isinstance(last, EngineFailed) or last.cause == TIMED_OUT:
                raise last
            if sendings > policy.retries:
                raise last
            count(last.cause)
            logger.warning("%s; sent to another %s engine", last.message, pool.side)
            start(tried)
    finally:
        for task in live:
            task.cancel()
        for task in live:
            await _dropped(task)


def _noted(
    pool: Pool, tried: dict[str, str], failures: list[BaseException | None]
) -> BaseException:
    """The sendings' failures noted (an engine that broke off skipped for the pool's backoff,
    each in ``tried``); the last of them."""
    for failure in failures:
        if isinstance(failure, EngineFailed) and failure.cause != TIMED_OUT:
            if failure.cause == BROKE:
                pool.mark_down(pool.named(failure.url), failure.reason)
            tried[failure.url] = failure.reason
    last = failures[-1]
    assert last is not None
    return last


async def _dropped(task: asyncio.Future[Answered]) -> None:
    """A sending no longer needed: ended, its engine's connection closed."""
    with contextlib.suppress(BaseException):
        response = (await task).response
        if isinstance(response, StreamRelay):
            await response.exchange.close()
