"""Fake engines of a fleet behind ``kvtier proxy --engine``, for the proxy's tests.

FleetEngine(name, work)   a ``FakeEngine`` that publishes KV events through vLLM's own
                          publisher over real ZMQ (``holds``), tokenizes chat requests, and
                          lists the LoRA adapters it serves in ``/v1/models``
fleet(engines, policy)    the engines and a fleet proxy before them, served: a client of the
                          proxy, its ``Placement`` and the engines' URLs
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from proxy_fakes import WAIT_S, FakeEngine, serving
from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

from kvtier.apps.ports import free_port
from kvtier.apps.proxy.app import build_fleet_app
from kvtier.apps.proxy.config import FleetConfig
from kvtier.apps.proxy.placement import Placement

BS = 16
PROMPT = list(range(1000, 1100))  # six full blocks and four tokens: a chat request's tokens


class FleetEngine(FakeEngine):
    """A fake engine that publishes KV events (vLLM's publisher) and tokenizes chat requests."""

    def __init__(self, name: str, work: Path) -> None:
        self.events = {"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"ipc://{work}/{name}", "topic": "kv",
                       "replay_endpoint": f"tcp://127.0.0.1:{free_port()}"}  # fmt: skip
        self.publisher = ZmqEventPublisher(0, self.events["endpoint"],
                                           self.events["replay_endpoint"], topic="kv")  # fmt: skip
        self.tokenized: list[dict[str, Any]] = []
        self.adapters: list[str] = []  # the LoRA adapters its /v1/models lists
        self.base = "m"  # the base model it lists
        self.models_status = 200  # 401: its /v1/models refuses, as behind --api-key
        super().__init__(name)

    def _app(self) -> FastAPI:
        app = super()._app()
        app.get("/kv_event_sources")(self._sources)
        app.post("/tokenize")(self._tokenize)
        return app

    async def _sources(self) -> Any:
        return {"0": self.events}

    async def _tokenize(self, request: Request) -> Any:
        body = await request.json()
        self.tokenized.append(body)
        return JSONResponse({"tokens": PROMPT if "messages" in body else [1, 2, 3]})

    async def _models(self) -> Any:
        if self.models_status != 200:
            return JSONResponse({"error": "Unauthorized"}, self.models_status)
        base = {"id": self.base, "root": f"/models/{self.base}", "parent": None}
        cards = [{"id": a, "root": f"/adapters/{a}", "parent": self.base} for a in self.adapters]
        return JSONResponse({"object": "list", "data": [base, *cards]})

    def holds(
        self, tokens: list[int], medium: str = "GPU", lora: str | None = None,
        salt: str | None = None,
    ) -> None:  # fmt: skip
        """Tell that its memory holds ``tokens``' full blocks (engine hashes of its own),
        computed with adapter ``lora`` and cache salt ``salt`` (vLLM's untagged extra keys)."""
        hashes = [hash((self.name, lora, salt, i)) & 0xFFFF_FFFF for i in range(len(tokens) // BS)]
        extra = [tuple(k for k in (lora, salt if i == 0 else None) if k) or None
                 for i in range(len(hashes))]  # fmt: skip
        event = BlockStored(block_hashes=hashes, parent_block_hash=None, block_size=BS,
                            token_ids=tokens[: len(hashes) * BS], lora_id=1 if lora else None,
                            medium=medium, lora_name=lora, extra_keys=extra)  # fmt: skip
        self.publisher.publish(KVEventBatch(ts=time.time(), events=[event]))


@contextlib.asynccontextmanager
async def fleet(
    engines: list[FleetEngine], policy: str = "kv-aware", health_timeout_s: float = 3.0
) -> AsyncIterator[tuple[httpx.AsyncClient, Placement, list[str]]]:
    async with serving(*(e.app for e in engines)) as urls:
        config = FleetConfig(tuple(urls), policy, health_interval_s=0.05,
                             health_timeout_s=health_timeout_s)  # fmt: skip
        app = build_fleet_app(config)
        async with serving(app) as [url], httpx.AsyncClient(base_url=url, timeout=WAIT_S) as c:
            yield c, app.state.router.placement, urls
