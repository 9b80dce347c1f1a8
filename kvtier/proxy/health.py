"""``GET /health``: up when at least one prefill and one decode engine answer theirs.

probe(engine, timeout_s) -> str    "ok", or why not ("connection refused", "HTTP 503")
health(prefill, decode, ...)       200, or 503 naming the engines that are not ok
"""

from __future__ import annotations

import asyncio
import json

import httpx
from starlette.responses import Response

from kvtier.proxy.balancer import Engine, Pool
from kvtier.proxy.upstream import CONNECT_FAILURES, connect_failure

OK = "ok"


async def probe(engine: Engine, timeout_s: float) -> str:
    """Ask ``engine``'s ``/health``; does not count as a request in flight."""
    try:
        answer = await engine.client.get("/health", timeout=timeout_s)
    except CONNECT_FAILURES as exc:
        return connect_failure(exc)
    except httpx.TimeoutException:
        return f"no answer in {timeout_s:g} s"
    except httpx.TransportError as exc:
        return str(exc) or type(exc).__name__
    return OK if answer.status_code == 200 else f"HTTP {answer.status_code}"


async def check_health(prefill: Pool, decode: Pool, timeout_s: float) -> Response:
    """Every engine probed at once. The body maps each side's URLs to their probe's result; a
    503 also says, in ``error``, which side has no engine up."""
    engines = [*prefill.engines, *decode.engines]
    results = await asyncio.gather(*(probe(engine, timeout_s) for engine in engines))
    by_url = dict(zip([engine.url for engine in engines], results))
    sides = {pool.side: {e.url: by_url[e.url] for e in pool.engines} for pool in (prefill, decode)}
    down = [
        f"{side} engine(s) down: " + ", ".join(f"{url} ({why})" for url, why in found.items())
        for side, found in sides.items()
        if OK not in found.values()
    ]
    body: dict[str, object] = {"status": "unavailable" if down else OK, **sides}
    if down:
        body["error"] = "; ".join(down)
    return Response(json.dumps(body), 503 if down else 200, media_type="application/json")
