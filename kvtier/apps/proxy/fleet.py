"""A fleet of ``kv_both`` engines behind one endpoint, each request sent where its KV already is.

    FleetRouter.complete(path, body, auth)   tokenize, choose an engine (``scoring.py``), relay
    FleetRouter.models / health / watch / metrics / aclose   as ``Router``'s

The proxy follows every engine's KV events (``event_stream.py``, found from the engine's URL:
``/kv_event_sources``) into one index (``prefix_index.py``) and tokenizes each request as the
engine will, with the engine's own ``/tokenize`` (its tokenizer and, for a chat request, its chat
template): never a silent miss from a tokenizer or template that differs. A request it cannot
tokenize is routed by load. The answer says where it went and why (``x-kvtier-route``); a
non-streamed answer's ``kv_transfer_params`` (kvtier's provenance) gives the cached tokens the
engine reported, counted beside those the proxy predicted (``fleet_metrics.py``).

Every engine's ``/health`` is watched: one that fails is skipped, and what it held is forgotten
(a restarted engine comes back empty); once it passes again its events are followed anew. The
proxy keeps nothing the events cannot rebuild: several proxies behind one address route alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from typing import Any

import httpx
from starlette.responses import Response

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.config import FleetConfig
from kvtier.apps.proxy.errors import EnginesDown, ProxyError
from kvtier.apps.proxy.event_stream import EventStream, Mode, sources, unreachable
from kvtier.apps.proxy.fleet_metrics import FleetMetrics
from kvtier.apps.proxy.health import OK, probe
from kvtier.apps.proxy.prefix_index import PrefixIndex
from kvtier.apps.proxy.relay import relay
from kvtier.apps.proxy.router import engine_at, json_object, models_of, request_headers
from kvtier.apps.proxy.scoring import Candidate, choose
from kvtier.apps.proxy.upstream import open_exchange

logger = logging.getLogger(__name__)

RECENT = 64  # requests over which "sent lately" is counted (a new conversation's tie-break)

# what /tokenize takes of a chat request, to apply the chat template as the completion will
CHAT_KEYS = (
    "messages", "add_generation_prompt", "continue_final_message", "chat_template",
    "chat_template_kwargs", "tools", "add_special_tokens", "mm_processor_kwargs",
)  # fmt: skip


class FleetRouter:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        limits = (config.timeout_s, config.connect_timeout_s)
        engines = [engine_at(url, *limits) for url in config.engines]
        self.pool = Pool("engine", engines, config.backoff_s)
        self.index = PrefixIndex()
        self.lock = threading.Lock()  # the index, between the streams' threads and requests
        self.streams: dict[str, list[EventStream]] = {url: [] for url in config.engines}
        self.no_events: dict[str, str] = {url: "not asked yet" for url in config.engines}
        self.queued = dict.fromkeys(config.engines, 0)  # prompt tokens sent, not yet answered
        self.recent = dict.fromkeys(config.engines, 0.0)  # requests sent lately, decaying
        self.metrics = FleetMetrics(self)
        self._turn = 0

    def mode(self, url: str) -> Mode:
        """``url``'s index: exact when every stream of it is, else degraded, or down."""
        streams = self.streams[url]
        if not streams or any(s.mode is Mode.DOWN for s in streams):
            return Mode.DOWN
        return Mode.DEGRADED if any(s.mode is Mode.DEGRADED for s in streams) else Mode.EXACT

    async def complete(self, path: str, raw: bytes, authorization: str | None) -> Response:
        request_id = uuid.uuid4().hex
        headers = request_headers(request_id, authorization)
        deadline = asyncio.get_running_loop().time() + self.config.timeout_s
        try:
            request = json_object(raw)
            tokens = await self._tokens(path, request, headers)
            url, reason, predicted, uncached = self._choose(tokens)
            self.queued[url] += uncached
            try:
                exchange = await open_exchange(self.pool, "POST", path, raw, headers, deadline, url)
            finally:
                self.queued[url] -= uncached
            went = exchange.engine.url
            self.metrics.decided(self.config.policy, reason if went == url else "retry")
            route = f"{went}; {reason}; predicted_cached_tokens={predicted}"
            response = await relay(exchange, [(b"x-kvtier-route", route.encode())])
            if not request.get("stream"):
                self.metrics.reported_by(went, predicted if went == url else 0, _cached(response))
            return response
        except ProxyError as exc:
            logger.debug("%s %s: %s", request_id, path, exc.message)
            return exc.response()

    def _choose(self, tokens: list[int] | None) -> tuple[str, str, int, int]:
        """(the engine's URL, why, the prompt tokens it is expected to hold, those to compute)."""
        up = [engine for engine in self.pool.engines if self.pool.is_up(engine)]
        if not up:
            raise EnginesDown("engine", self.pool.down_reasons())
        n = len(tokens) if tokens is not None else 0
        with self.lock:
            block_size = self.index.block_size
            runs = (
                self.index.runs(self.index.digests(tokens), [e.url for e in up])
                if tokens is not None and block_size
                else {}
            )
        candidates = [
            Candidate(e.url, e.in_flight, self.queued[e.url],
                      runs.get(e.url) if self.mode(e.url) is Mode.EXACT else None,
                      self.recent[e.url])
            for e in up
        ]  # fmt: skip
        decision = choose(self.config.policy, candidates, n, block_size or 1, self._turn)
        self._turn += 1
        for url in self.recent:  # a count over about the last RECENT requests
            self.recent[url] *= 1.0 - 1.0 / RECENT
        self.recent[up[decision.index].url] += 1.0
        unknown = tokens is None and self.config.policy == "kv-aware"
        reason = "no-tokens" if unknown else decision.reason
        return up[decision.index].url, reason, decision.cached_tokens, n - decision.cached_tokens

    async def _tokens(
        self, path: str, request: dict[str, Any], headers: dict[str, str]
    ) -> list[int] | None:
        """The prompt's token ids as the engines see them; None when they cannot be had."""
        if self.config.policy != "kv-aware":
            return None
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a batch: routed by its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if path.endswith("/chat/completions"):
            body = {key: request[key] for key in CHAT_KEYS if key in request}
        elif isinstance(prompt, str):
            body = {"prompt": prompt, "add_special_tokens": request.get("add_special_tokens", True)}
        else:
            return None
        body["model"] = request.get("model")
        up = [engine for engine in self.pool.engines if self.pool.is_up(engine)]
        if not up:
            return None
        engine = up[self._turn % len(up)]
        try:
            answer = await engine.client.post("/tokenize", json=body, headers=headers)
            tokens = answer.json().get("tokens") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("kvtier proxy: /tokenize on %s failed: %s", engine.url, exc)
            return None
        return tokens if isinstance(tokens, list) else None

    async def models(self, authorization: str | None) -> Response:
        return await models_of(self.pool, authorization, self.config.timeout_s)

    async def health(self) -> Response:
        results = await asyncio.gather(
            *(probe(e, self.config.connect_timeout_s) for e in self.pool.engines)
        )
        engines = {e.url: result for e, result in zip(self.pool.engines, results, strict=True)}
        up = OK in engines.values()
        index = {url: self.mode(url).value for url in engines}
        body: dict[str, object] = {"status": OK if up else "unavailable", "engine": engines,
                                   "index": index}  # fmt: skip
        if not up:
            body["error"] = "no engine up: " + ", ".join(f"{u} ({w})" for u, w in engines.items())
        return Response(json.dumps(body), 200 if up else 503, media_type="application/json")

    async def watch(self) -> None:
        """Until cancelled: each engine's /health every ``health_interval_s``; its events
        followed while it is up, forgotten when it goes down."""
        await asyncio.gather(*(self._watch(engine) for engine in self.pool.engines))

    async def _watch(self, engine: Engine) -> None:
        interval, timeout = self.config.health_interval_s, self.config.connect_timeout_s
        while True:
            result = await probe(engine, timeout)
            changed = self.pool.set_health(engine, "" if result == OK else result)
            if result != OK and (changed or self.streams[engine.url]):
                logger.warning("kvtier proxy: engine %s is down (%s): skipped, its index "
                               "dropped", engine.url, result)  # fmt: skip
                await asyncio.to_thread(self._unfollow, engine.url)
            elif result == OK and not self.streams[engine.url]:
                await asyncio.to_thread(self._follow, engine.url)
            await asyncio.sleep(interval)

    def _follow(self, url: str) -> None:
        try:
            found = sources(url, self.config.connect_timeout_s)
        except (OSError, ValueError, KeyError) as exc:
            self.no_events[url] = f"/kv_event_sources: {exc}"
            return
        why = unreachable(url, found)
        if why:
            if why != self.no_events[url]:  # said once, not at every /health
                logger.warning("kvtier proxy: %s: %s; routed by load", url, why)
            self.no_events[url] = why
            return
        self.streams[url] = [EventStream(url, source, self.index, self.lock) for source in found]
        for stream in self.streams[url]:
            stream.start()
        self.no_events[url] = ""

    def _unfollow(self, url: str) -> None:
        streams, self.streams[url] = self.streams[url], []
        for stream in streams:
            stream.stop()
        with self.lock:
            self.index.drop(url)

    async def aclose(self) -> None:
        for url in self.streams:
            await asyncio.to_thread(self._unfollow, url)
        await asyncio.gather(*(engine.client.aclose() for engine in self.pool.engines))


def _cached(response: Response) -> int | None:
    """The prompt tokens an engine's answer says it did not compute (kvtier's provenance)."""
    try:
        found = json.loads(bytes(response.body))["kv_transfer_params"]["kvtier"]
        return int(found["prompt_tokens"]) - int(found["computed"])
    except (ValueError, KeyError, TypeError):
        return None
