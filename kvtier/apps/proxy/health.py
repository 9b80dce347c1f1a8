"""Engines' ``/health``: the proxy's own ``GET /health``, and the watch on the prefill side.

probe(engine, timeout_s) -> str        "ok", or why not ("connection refused", "HTTP 503",
                                       "no answer in 3 s": ``stalled``)
check_health(prefill, decode, ...)     200 (``degraded`` without a prefill engine), or 503
                                       without a decode engine; naming those not ok
watch(pool, interval_s, timeout_s)     runs until cancelled: probes each engine of ``pool``
                                       every ``interval_s``; one that fails is skipped until it
                                       passes (``Pool.set_health``)

An engine that stops answering (its process stopped, a long pause, a wedged device) is found by
its probe within ``interval_s + timeout_s``; the requests waiting on it for a first byte then
go to another engine (``stall.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import httpx
from starlette.responses import Response

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.upstream import CONNECT_FAILURES, connect_failure

logger = logging.getLogger(__name__)

OK = "ok"
NO_ANSWER = "no answer in"  # how a probe's timeout reads: the engine stalled
Probed = Callable[[Engine, bool], Awaitable[None]]  # after each probe: the engine, and if it passed


async def probe(engine: Engine, timeout_s: float) -> str:
    """Ask ``engine``'s ``/health``; does not count as a request in flight. Never raises for
    what the engine did (every ``httpx`` error is a reason)."""
    try:
        answer = await engine.client.get("/health", timeout=timeout_s)
    except CONNECT_FAILURES as exc:
        return connect_failure(exc)
    except httpx.TimeoutException:
        return f"{NO_ANSWER} {timeout_s:g} s"
    except httpx.HTTPError as exc:
        return str(exc) or type(exc).__name__
    return OK if answer.status_code == 200 else f"HTTP {answer.status_code}"


def stalled(result: str) -> bool:
    """Whether a probe's ``result`` says the engine did not answer in time."""
    return result.startswith(NO_ANSWER)


async def check_health(prefill: Pool, decode: Pool, timeout_s: float) -> Response:
    """Every engine probed at once. The body maps each side's URLs to their probe's result, and
    says in ``error`` which side has no engine up. 503 only without a decode engine: without a
    prefill engine the proxy still serves (degraded: ``"status": "degraded"``, 200)."""
    engines = [*prefill.engines, *decode.engines]
    results = await asyncio.gather(*(probe(engine, timeout_s) for engine in engines))
    by_url = dict(zip([engine.url for engine in engines], results))
    sides = {pool.side: {e.url: by_url[e.url] for e in pool.engines} for pool in (prefill, decode)}
    down = [
        f"{side} engine(s) down: " + ", ".join(f"{url} ({why})" for url, why in found.items())
        for side, found in sides.items()
        if OK not in found.values()
    ]
    unavailable = OK not in sides[decode.side].values()
    status = "unavailable" if unavailable else "degraded" if down else OK
    body: dict[str, object] = {"status": status, **sides}
    if down:
        body["error"] = "; ".join(down)
    return Response(json.dumps(body), 503 if unavailable else 200, media_type="application/json")


async def watch(
    pool: Pool, interval_s: float, timeout_s: float, then: Probed | None = None
) -> None:
    """Probe each engine of ``pool`` every ``interval_s`` (each within ``timeout_s``, each on
    its own: one that hangs delays no other) until cancelled, marking it up or down by its
    probe, then awaiting ``then(engine, up)``; the first probes go at once."""
    await asyncio.gather(
        *(_watch(pool, engine, interval_s, timeout_s, then) for engine in pool.engines)
    )


async def _watch(
    pool: Pool, engine: Engine, interval_s: float, timeout_s: float, then: Probed | None
) -> None:
    while True:
        result = await probe(engine, timeout_s)
        if pool.set_health(engine, "" if result == OK else result, stalled(result)):
            if result == OK:
                logger.info("%s engine %s is up again", pool.side, engine.url)
            else:
                logger.warning("%s engine %s is down (%s): skipped until its /health passes",
                               pool.side, engine.url, result)  # fmt: skip
        if then is not None:
            await then(engine, result == OK)
        await asyncio.sleep(interval_s)
