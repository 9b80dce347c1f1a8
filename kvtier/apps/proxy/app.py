"""The proxy's ASGI app: OpenAI-compatible routes onto a ``Router`` (prefill then decode) or a
``FleetRouter`` (a fleet of engines, each request where its KV is).

POST /v1/completions, POST /v1/chat/completions   prefill then decode, or the fleet's choice;
                                                  streamed or not, as the client asked
GET  /v1/models                                   a decode engine's
GET  /health                                      200 (maybe degraded) / 503, see
                                                  ``kvtier.apps.proxy.health``
GET  /metrics                                     see ``kvtier.apps.proxy.metrics``

While the app's lifespan runs, the engines' /health is watched (``watch``: the prefill side, or
every engine of a fleet, whose KV events are followed while it is up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import FastAPI, Request
from starlette.responses import Response

from kvtier.apps.proxy.config import FleetConfig, ProxyConfig
from kvtier.apps.proxy.fleet import FleetRouter
from kvtier.apps.proxy.fleet_metrics import FleetMetrics
from kvtier.apps.proxy.metrics import ProxyMetrics
from kvtier.apps.proxy.router import Router

logger = logging.getLogger(__name__)


def build_app(
    prefill: Sequence[str],
    decode: Sequence[str],
    *,
    timeout_s: float = 300.0,
    connect_timeout_s: float = 5.0,
    backoff_s: float = 2.0,
    prefill_timeout_s: float = 60.0,
    health_interval_s: float = 2.0,
    policy: str = "kv-aware",
    health_timeout_s: float = 3.0,
    first_byte_timeout_s: float = 120.0,
    retries: int = 2,
    hedge_after_p99: float = 2.0,
) -> FastAPI:
    """The app for these engines (see ``ProxyConfig``; a bad URL raises ``ValueError``).

    Its ``Router`` is ``app.state.router``; the engines' connection pools close when the app's
    lifespan ends."""
    config = ProxyConfig(tuple(prefill), tuple(decode), timeout_s, connect_timeout_s, backoff_s,
                         prefill_timeout_s, health_interval_s, policy, health_timeout_s,
                         first_byte_timeout_s, retries, hedge_after_p99)  # fmt: skip
    started = f"prefill {', '.join(config.prefill)}; decode {', '.join(config.decode)}"
    return _app(Router(config), started)


def build_fleet_app(config: FleetConfig) -> FastAPI:
    """The app for a fleet of ``kv_both`` engines (``fleet.py``); its ``FleetRouter`` is
    ``app.state.router``."""
    return _app(FleetRouter(config), f"{config.policy} over {', '.join(config.engines)}")


class _Routes(Protocol):
    """What the app asks of a router (``Router``, ``FleetRouter``)."""

    async def complete(self, path: str, raw: bytes, authorization: str | None) -> Response: ...

    async def models(self, authorization: str | None) -> Response: ...

    async def health(self) -> Response: ...

    async def watch(self) -> None: ...

    async def aclose(self) -> None: ...

    @property
    def metrics(self) -> ProxyMetrics | FleetMetrics: ...


def _app(router: _Routes, started: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logger.info("kvtier proxy: %s", started)
        watching = asyncio.create_task(router.watch(), name="kvtier proxy: /health")
        try:
            yield
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await router.aclose()

    app = FastAPI(title="kvtier proxy", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    app.state.router = router

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await router.complete("/v1/completions", await request.body(), _auth(request))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await router.complete("/v1/chat/completions", await request.body(), _auth(request))

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return await router.models(_auth(request))

    @app.get("/health")
    async def health() -> Response:
        return await router.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return router.metrics.response()

    return app


def _auth(request: Request) -> str | None:
    return request.headers.get("authorization")
