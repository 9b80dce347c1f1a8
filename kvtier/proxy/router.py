"""A completion in two hops: its prompt on a prefill engine, its tokens from a decode engine.

    Router.complete(path, body, auth)   prefill (one token, KV kept for a remote decode), then
                                        the client's request on a decode engine, with the KV
                                        transfer params the prefill answered; the decode
                                        engine's answer goes back as it came
    Router.models(auth)                 a decode engine's ``/v1/models``
    Router.health()                     see ``kvtier.proxy.health``
    Router.aclose()                     closes every engine's connection pool

Both hops carry one ``X-Request-Id`` and the client's ``Authorization``. The answer carries
``Server-Timing: prefill;dur=MS`` (the prefill hop as the proxy saw it), so a client can split its
time to first token into the prefill and what followed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import httpx
from starlette.responses import Response

from kvtier.proxy.balancer import Engine, Pool
from kvtier.proxy.bodies import decode_body, offered_params, prefill_body
from kvtier.proxy.config import ProxyConfig
from kvtier.proxy.errors import BadRequest, EngineAnswered, EngineFailed, EnginesDown, ProxyError
from kvtier.proxy.health import check_health
from kvtier.proxy.relay import relay
from kvtier.proxy.upstream import open_exchange

logger = logging.getLogger(__name__)

KEEPALIVE_S = 4.0  # under uvicorn's (vLLM's) 5 s: an idle connection is dropped here first


class Router:
    """Owns one connection pool per engine, from construction to ``aclose``."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.prefill = Pool("prefill", [self._engine(url) for url in config.prefill],
                            config.backoff_s)  # fmt: skip
        self.decode = Pool("decode", [self._engine(url) for url in config.decode], config.backoff_s)

    def _engine(self, url: str) -> Engine:
        timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None,
                              keepalive_expiry=KEEPALIVE_S)  # fmt: skip
        # trust_env=False: engines are reached directly, never through an HTTP(S)_PROXY
        client = httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits, trust_env=False)
        return Engine(url, client)

    async def complete(self, path: str, raw: bytes, authorization: str | None) -> Response:
        """The answer to a completion request ``raw`` sent to ``path``."""
        request_id = uuid.uuid4().hex
        headers = _headers(request_id, authorization)
        clock = asyncio.get_running_loop().time
        deadline = clock() + self.config.timeout_s
        try:
            request = _json_object(raw)
            if not self.decode.any_up():  # fail before a prefill holds KV for no one
                raise EnginesDown("decode", self.decode.down_reasons())
            started = clock()
            offer = await self._prefill(path, request, headers, deadline)
            timing = (b"server-timing", b"prefill;dur=%.1f" % ((clock() - started) * 1e3))
            body = json.dumps(decode_body(request, offer)).encode()
            exchange = await open_exchange(self.decode, "POST", path, body, headers, deadline)
            logger.debug("%s: decode on %s", request_id, exchange.engine.url)
            return await relay(exchange, [timing])
        except ProxyError as exc:
            logger.debug("%s %s: %s", request_id, path, exc.message)
            return exc.response()

    async def _prefill(
        self, path: str, request: dict[str, Any], headers: dict[str, str], deadline: float
    ) -> dict[str, Any] | None:
        """The prefill engine's ``kv_transfer_params`` for the decode engine (None: no offer)."""
        body = json.dumps(prefill_body(request)).encode()
        exchange = await open_exchange(self.prefill, "POST", path, body, headers, deadline)
        engine, answer = exchange.engine, exchange.response
        if not answer.is_success:
            raise EngineAnswered("prefill", await relay(exchange))
        try:
            offer = offered_params(json.loads(await exchange.read()))
        except ValueError:
            raise EngineFailed(
                "prefill", engine.url, "its answer is not JSON", timed_out=False
            ) from None
        logger.debug("%s: prefill on %s, %s", headers["x-request-id"], engine.url,
                     "its KV offered" if offer else "no KV offered")  # fmt: skip
        if offer is None and not engine.warned_no_offer:
            engine.warned_no_offer = True
            logger.warning(
                "prefill engine %s answered without kv_transfer_params to hand its KV over (no KV "
                "connector?): decode engines compute those prompts again", engine.url,
            )  # fmt: skip
        return offer

    async def models(self, authorization: str | None) -> Response:
        """A decode engine's ``GET /v1/models``, as it answered."""
        headers = _headers(uuid.uuid4().hex, authorization)
        deadline = asyncio.get_running_loop().time() + self.config.timeout_s
        try:
            exchange = await open_exchange(
                self.decode, "GET", "/v1/models", None, headers, deadline
            )
            return await relay(exchange)
        except ProxyError as exc:
            return exc.response()

    async def health(self) -> Response:
        return await check_health(self.prefill, self.decode, self.config.connect_timeout_s)

    async def aclose(self) -> None:
        engines = [*self.prefill.engines, *self.decode.engines]
        await asyncio.gather(*(engine.client.aclose() for engine in engines))


def _headers(request_id: str, authorization: str | None) -> dict[str, str]:
    # identity: the bytes relayed are the bytes the engine sent, never compressed
    headers = {"content-type": "application/json", "accept-encoding": "identity",
               "x-request-id": request_id}  # fmt: skip
    if authorization is not None:
        headers["authorization"] = authorization
    return headers


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        request = json.loads(raw)
    except ValueError:
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the request body is not a JSON object")
    return request
