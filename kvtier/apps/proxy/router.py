"""A completion in two hops: its prompt on a prefill engine, its tokens from a decode engine.

    Router.complete(path, body, auth)   prefill (one token, KV kept for a remote decode), then
                                        the client's request on a decode engine, with the KV
                                        transfer params the prefill answered; the decode
                                        engine's answer goes back as it came
    Router.models(auth)                 a decode engine's ``/v1/models``
    Router.health()                     see ``kvtier.apps.proxy.health``
    Router.watch()                      runs until cancelled: every engine's /health
    Router.metrics                      ``ProxyMetrics``, for ``GET /metrics``
    Router.aclose()                     closes every engine's connection pool

The prefill engine is chosen as a fleet's engine is (``placement.py``; ``kv-aware``: the one
holding most of the prompt's KV, against its queue; ``x-kvtier-route`` says which and why), the
decode engine by load. Both hops carry one ``X-Request-Id`` and the client's
``Authorization``. Without a prefill engine up, or when the one asked fails, the request goes
to a decode engine alone, which computes the prompt (see ``apps/proxy/prefill.py``). The
answer carries ``x-kvtier-prefill`` (what the prefill hop did) and ``Server-Timing:
prefill;dur=MS`` (the hop as the proxy saw it), so a client can split its time to first token
into the prefill and what followed.

A decode engine that breaks off or stalls before the first byte of its answer reached the client
costs the client nothing: the request goes to another decode engine (``resend.py``), without the
prefill's offer (its KV may be gone: that engine computes the prompt), said by ``x-kvtier-resent:
N``. With no other decode engine up, it waits on a stalled one rather than fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any

import httpx
from starlette.responses import Response

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.bodies import decode_body
from kvtier.apps.proxy.config import ProxyConfig
from kvtier.apps.proxy.engine_url import rank_headers, split
from kvtier.apps.proxy.errors import BadRequest, EnginesDown, ProxyError
from kvtier.apps.proxy.health import check_health, watch
from kvtier.apps.proxy.hedge import HEDGE_FLOOR_S, Hedge
from kvtier.apps.proxy.metrics import ProxyMetrics
from kvtier.apps.proxy.placement import Choice, Placement
from kvtier.apps.proxy.prefill import prefill
from kvtier.apps.proxy.relay import relay
from kvtier.apps.proxy.resend import Attempt, Header, Policy, answered
from kvtier.apps.proxy.stall import FirstByte
from kvtier.apps.proxy.upstream import Exchange, open_exchange

logger = logging.getLogger(__name__)

RESENT = b"x-kvtier-resent"  # times the request was sent to another decode engine
KEEPALIVE_S = 4.0  # under uvicorn's (vLLM's) 5 s: an idle connection is dropped here first


class Router:
    """Owns one connection pool per engine, from construction to ``aclose``."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        engines = [[engine_at(url, config.timeout_s, config.connect_timeout_s) for url in urls]
                   for urls in (config.prefill, config.decode)]  # fmt: skip
        self.prefill = Pool("prefill", engines[0], config.backoff_s)
        self.decode = Pool("decode", engines[1], config.backoff_s, last_resort=True)
        self.metrics = ProxyMetrics(self.prefill, self.decode)
        self.placement = Placement(self.prefill, config.policy, config.connect_timeout_s)
        self.hedge = Hedge(config.hedge_after_p99, HEDGE_FLOOR_S)

    async def complete(self, path: str, raw: bytes, authorization: str | None) -> Response:
        """The answer to a completion request ``raw`` sent to ``path``."""
        request_id = uuid.uuid4().hex
        headers = request_headers(request_id, authorization)
        deadline = asyncio.get_running_loop().time() + self.config.timeout_s
        try:
            request = json_object(raw)
            if not self.decode.any_up():  # fail before a prefill holds KV for no one
                raise EnginesDown("decode", self.decode.down_reasons())
            choice = await self._prefill_choice(path, request, headers)
            with self.placement.sending(choice) if choice else contextlib.nullcontext():
                hop = await prefill(self.prefill, path, request, headers, deadline,
                                    self.config.prefill_timeout_s,
                                    choice.url if choice else None)  # fmt: skip
            route = [] if choice is None else [choice.header(choice.url)]
            first = json.dumps(decode_body(request, hop.offer)).encode()
            limits = FirstByte(deadline, self.config.first_byte_timeout_s)

            async def send(attempt: Attempt) -> Exchange:
                body = first
                if attempt.number and hop.offer is not None:  # sent again: computed there
                    body = json.dumps(decode_body(request, None)).encode()
                return await open_exchange(self.decode, "POST", path, body, headers, deadline,
                                           limits=limits, tried=attempt.tried,
                                           took=attempt.took)  # fmt: skip

            def more(exchange: Exchange, attempt: Attempt) -> list[Header]:
                logger.debug("%s: decode on %s", request_id, exchange.engine.url)
                resent = [(RESENT, b"%d" % attempt.number)] if attempt.number else []
                return [*hop.headers(), *route, *resent]

            policy = Policy(self.config.retries, self.hedge, bool(request.get("stream")))
            answer = await answered(self.decode, send, more, policy,
                                    self.metrics.resend_of(self.decode.side))  # fmt: skip
            self.metrics.count(hop.outcome)
            return answer.response
        except ProxyError as exc:
            logger.debug("%s %s: %s", request_id, path, exc.message)
            return exc.response()

    async def _prefill_choice(
        self, path: str, request: dict[str, Any], headers: dict[str, str]
    ) -> Choice | None:
        """The prefill engine ``placement`` picks; None when none is up (the hop is skipped)."""
        if not self.prefill.any_up():
            return None
        tokens = await self.placement.tokens(path, request, headers)
        try:
            return self.placement.choose(tokens, self.placement.root(request))
        except EnginesDown:  # gone down while the prompt was tokenized
            return None

    async def models(self, authorization: str | None) -> Response:
        """A decode engine's ``GET /v1/models``, as it answered."""
        return await models_of(self.decode, authorization, self.config.timeout_s)

    async def health(self) -> Response:
        return await check_health(self.prefill, self.decode, self.config.connect_timeout_s)

    async def watch(self) -> None:
        """Probe every engine's /health until cancelled (see ``kvtier.apps.proxy.health``)."""
        interval, timeout = self.config.health_interval_s, self.config.health_timeout_s
        await asyncio.gather(watch(self.prefill, interval, timeout, self.placement.track),
                             watch(self.decode, interval, timeout))  # fmt: skip

    async def aclose(self) -> None:
        await self.placement.aclose()
        engines = [*self.prefill.engines, *self.decode.engines]
        await asyncio.gather(*(engine.client.aclose() for engine in engines))


async def models_of(pool: Pool, authorization: str | None, timeout_s: float) -> Response:
    """An engine of ``pool``'s ``GET /v1/models``, as it answered (or the proxy's error)."""
    headers = request_headers(uuid.uuid4().hex, authorization)
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        exchange = await open_exchange(pool, "GET", "/v1/models", None, headers, deadline)
        return await relay(exchange)
    except ProxyError as exc:
        return exc.response()


def engine_at(url: str, timeout_s: float, connect_timeout_s: float) -> Engine:
    """The engine at ``url``, with a keep-alive connection pool of its own (one engine of a
    data-parallel server: every request names its rank)."""
    timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None,
                          keepalive_expiry=KEEPALIVE_S)  # fmt: skip
    # trust_env=False: engines are reached directly, never through an HTTP(S)_PROXY
    client = httpx.AsyncClient(base_url=split(url)[0], headers=rank_headers(url),
                               timeout=timeout, limits=limits, trust_env=False)  # fmt: skip
    return Engine(url, client)


def request_headers(request_id: str, authorization: str | None) -> dict[str, str]:
    # identity: the bytes relayed are the bytes the engine sent, never compressed
    headers = {"content-type": "application/json", "accept-encoding": "identity",
               "x-request-id": request_id}  # fmt: skip
    if authorization is not None:
        headers["authorization"] = authorization
    return headers


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        request = json.loads(raw)
    except ValueError:
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the request body is not a JSON object")
    return request
