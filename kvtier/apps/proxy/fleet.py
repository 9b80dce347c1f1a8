"""A fleet of ``kv_both`` engines behind one endpoint, each request sent where its KV already is.

    FleetRouter.complete(path, body, auth)   tokenize, choose an engine (``placement.py``), relay
    FleetRouter.models / health / watch / metrics / aclose   as ``Router``'s

Which engine holds what, and the choice, are ``placement.py``'s. The answer says where it went
and why (``x-kvtier-route``); a non-streamed answer's ``kv_transfer_params`` (kvtier's
provenance) gives the cached tokens the engine reported, counted beside those the proxy
predicted (``fleet_metrics.py``). Every engine's ``/health`` is watched: one that fails is
skipped and forgotten (one that stalls, its probe unanswered in time, skipped but its index
kept); once it passes again its events are followed anew.

An engine that breaks off or stalls before the first byte of its answer reached the client
costs the client nothing: the request goes to another engine (``resend.py``; ``x-kvtier-route``
then says ``retry`` and ``resent=N``). With no engine up, a request waits on a stalled one
rather than fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid

from starlette.responses import Response

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.config import FleetConfig
from kvtier.apps.proxy.errors import EnginesDown, ProxyError
from kvtier.apps.proxy.fleet_metrics import FleetMetrics
from kvtier.apps.proxy.health import OK, probe, stalled
from kvtier.apps.proxy.hedge import HEDGE_FLOOR_S, Hedge
from kvtier.apps.proxy.placement import Choice, Placement
from kvtier.apps.proxy.resend import Attempt, Header, Policy, answered
from kvtier.apps.proxy.router import engine_at, json_object, models_of, request_headers
from kvtier.apps.proxy.stall import FirstByte
from kvtier.apps.proxy.upstream import Exchange, open_exchange

logger = logging.getLogger(__name__)


class FleetRouter:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        limits = (config.timeout_s, config.connect_timeout_s)
        engines = [engine_at(url, *limits) for url in config.engines]
        self.pool = Pool("engine", engines, config.backoff_s, last_resort=True)
        self.placement = Placement(self.pool, config.policy, config.connect_timeout_s)
        self.hedge = Hedge(config.hedge_after_p99, HEDGE_FLOOR_S)
        self.metrics = FleetMetrics(self)

    async def complete(self, path: str, raw: bytes, authorization: str | None) -> Response:
        request_id = uuid.uuid4().hex
        headers = request_headers(request_id, authorization)
        deadline = asyncio.get_running_loop().time() + self.config.timeout_s
        try:
            request = json_object(raw)
            choice = await self._choice(path, request, headers)
            limits = FirstByte(deadline, self.config.first_byte_timeout_s)

            async def send(attempt: Attempt) -> Exchange:
                first = attempt.number == 0 and choice.url != ""
                with self.placement.sending(choice) if first else contextlib.nullcontext():
                    return await open_exchange(self.pool, "POST", path, raw, headers, deadline,
                                               choice.url if first else None, limits,
                                               attempt.tried, attempt.took)  # fmt: skip

            def more(exchange: Exchange, attempt: Attempt) -> list[Header]:
                return [choice.header(exchange.engine.url, attempt.number)]

            policy = Policy(self.config.retries, self.hedge, bool(request.get("stream")))
            response, url = await answered(self.pool, send, more, policy,
                                           self.metrics.resend_of(self.pool.side))  # fmt: skip
            self.metrics.decided(self.config.policy, choice.reason if url == choice.url
                                 else "retry")  # fmt: skip
            if not request.get("stream"):
                predicted = choice.predicted if url == choice.url else 0
                self.metrics.reported_by(url, predicted, _cached(response))
            return response
        except ProxyError as exc:
            logger.debug("%s %s: %s", request_id, path, exc.message)
            return exc.response()

    async def _choice(
        self, path: str, request: dict[str, object], headers: dict[str, str]
    ) -> Choice:
        """The engine ``placement`` picks; with none up but a stalled one (``Pool.last_resort``),
        the request goes by load to it."""
        tokens = await self.placement.tokens(path, request, headers)
        try:
            return self.placement.choose(tokens, self.placement.root(request))
        except EnginesDown:
            if not self.pool.any_up():
                raise
            return Choice("", "load", 0, 0)

    async def models(self, authorization: str | None) -> Response:
        return await models_of(self.pool, authorization, self.config.timeout_s)

    async def health(self) -> Response:
        results = await asyncio.gather(
            *(probe(e, self.config.connect_timeout_s) for e in self.pool.engines)
        )
        engines = {e.url: result for e, result in zip(self.pool.engines, results, strict=True)}
        up = OK in engines.values()
        index = {url: self.placement.mode(url).value for url in engines}
        body: dict[str, object] = {"status": OK if up else "unavailable", "engine": engines,
                                   "index": index}  # fmt: skip
        if not up:
            body["error"] = "no engine up: " + ", ".join(f"{u} ({w})" for u, w in engines.items())
        return Response(json.dumps(body), 200 if up else 503, media_type="application/json")

    async def watch(self) -> None:
        """Until cancelled: each engine's /health every ``health_interval_s``; its events
        followed while it is up, forgotten when it goes down (kept while it stalls)."""
        await asyncio.gather(*(self._watch(engine) for engine in self.pool.engines))

    async def _watch(self, engine: Engine) -> None:
        interval, timeout = self.config.health_interval_s, self.config.health_timeout_s
        while True:
            result = await probe(engine, timeout)
            stuck = stalled(result)
            changed = self.pool.set_health(engine, "" if result == OK else result, stuck)
            if changed and result != OK:
                kept = "kept" if stuck else "dropped"
                logger.warning("kvtier proxy: engine %s is down (%s): skipped, its index %s",
                               engine.url, result, kept)  # fmt: skip
            await self.placement.track(engine, result == OK, stuck)
            await asyncio.sleep(interval)

    async def aclose(self) -> None:
        await self.placement.aclose()
        await asyncio.gather(*(engine.client.aclose() for engine in self.pool.engines))


def _cached(response: Response) -> int | None:
    """The prompt tokens an engine's answer says it did not compute (kvtier's provenance)."""
    try:
        found = json.loads(bytes(response.body))["kv_transfer_params"]["kvtier"]
        return int(found["prompt_tokens"]) - int(found["computed"])
    except (ValueError, KeyError, TypeError):
        return None
