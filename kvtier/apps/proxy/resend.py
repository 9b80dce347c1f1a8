"""A request sent again to another engine while nothing of its answer has reached the client.

    await answered(pool, send, headers, retries, count) -> Response

``send(attempt)`` opens the request's exchange with an engine of ``pool`` (``upstream.py``),
avoiding ``attempt.tried``; ``relay`` then waits for the first byte of the answer (a stream's
first event, or a whole answer not streamed) before anything goes to the client. Until then, an
engine that breaks off (its process killed, the connection reset) or stalls (``stall.py``: it
went down while it had the request, or sent no first byte in time) costs the client nothing:
the request goes to another engine, at most ``retries`` times, each counted by cause
(``count``: ``errors.BROKE``, ``errors.STALLED``). An engine that broke off is skipped for the
pool's backoff, so that its other requests move too. The request's own deadline ending is the
client's 504, and a stream that already started ends with an error event (``relay.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

from starlette.responses import Response

from kvtier.apps.proxy.balancer import Pool
from kvtier.apps.proxy.errors import BROKE, TIMED_OUT, EngineFailed
from kvtier.apps.proxy.relay import relay
from kvtier.apps.proxy.upstream import Exchange

logger = logging.getLogger(__name__)

Header = tuple[bytes, bytes]


class Attempt(NamedTuple):
    """The ``number``-th sending of a request (0: the first); ``tried``: the engines it failed
    on before, URL -> why (``open_exchange`` adds those that refused a connection)."""

    number: int
    tried: dict[str, str]


async def answered(
    pool: Pool,
    send: Callable[[Attempt], Awaitable[Exchange]],
    headers: Callable[[Exchange, Attempt], Sequence[Header]],
    retries: int,
    count: Callable[[str], None],
) -> Response:
    """The client's response: the first answer an engine began, as the module says.

    Raises ``EnginesDown`` when no engine is left to try, and ``EngineFailed`` when the last
    one tried failed (or the deadline passed)."""
    attempt = Attempt(0, {})
    while True:
        try:
            exchange = await send(attempt)
            return await relay(exchange, headers(exchange, attempt))
        except EngineFailed as exc:
            if exc.cause == TIMED_OUT or attempt.number >= retries:
                raise
            if exc.cause == BROKE:
                pool.mark_down(pool.named(exc.url), exc.reason)
            attempt.tried[exc.url] = exc.reason
            count(exc.cause)
            logger.warning("%s; sent to another %s engine", exc.message, pool.side)
            attempt = Attempt(attempt.number + 1, attempt.tried)
