"""``kvtier proxy --engine URL#dp0 URL#dp1``: each engine of a fake data-parallel server is an
engine of the fleet: its own KV events (vLLM's publisher over real ZMQ, one per engine, as vLLM's
``/kv_event_sources`` lists them), and requests sent to it with vLLM's ``X-data-parallel-rank``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from proxy_fakes import WAIT_S, FakeEngine, run, serving, until
from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

from kvtier.apps.proxy.app import build_fleet_app
from kvtier.apps.proxy.config import FleetConfig
from kvtier.apps.proxy.event_sources import sources

BS = 16
PROMPT = list(range(2000, 2100))  # six full blocks and four tokens
RANKS = 2


class DataParallelServer(FakeEngine):
    """A fake server of ``RANKS`` engines, each publishing its KV events apart."""

    def __init__(self, work: Path) -> None:
        self.events = {
            str(rank): {"enable_kv_cache_events": True, "publisher": "zmq",
                        "endpoint": f"ipc://{work}/events-{rank}",
                        "replay_endpoint": f"ipc://{work}/replay-{rank}", "topic": ""}
            for rank in range(RANKS)
        }  # fmt: skip
        self.publishers = [
            ZmqEventPublisher(0, e["endpoint"], e["replay_endpoint"]) for e in self.events.values()
        ]
        super().__init__("server")

    def _app(self) -> FastAPI:
        app = super()._app()
        app.get("/kv_event_sources")(self._sources)
        return app

    async def _sources(self) -> Any:
        return self.events

    def holds(self, rank: int, tokens: list[int]) -> None:
        """Engine ``rank`` tells that its memory holds ``tokens``' full blocks."""
        hashes = [hash((rank, i)) & 0xFFFF_FFFF for i in range(len(tokens) // BS)]
        event = BlockStored(block_hashes=hashes, parent_block_hash=None, block_size=BS,
                            token_ids=tokens[: len(hashes) * BS], lora_id=None, medium="GPU",
                            lora_name=None)  # fmt: skip
        self.publishers[rank].publish(KVEventBatch(ts=time.time(), events=[event]))

    def ranks_asked(self) -> list[str | None]:
        return [r.headers.get("x-data-parallel-rank") for r in self.received]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DataParallelServer]:
    fake = DataParallelServer(tmp_path)
    yield fake
    for publisher in fake.publishers:
        publisher.shutdown()


def test_a_request_goes_to_the_engine_of_the_server_that_holds_its_prefix(
    server: DataParallelServer,
) -> None:
    async def scenario() -> None:
        async with serving(server.app) as [url]:
            engines = (f"{url}#dp0", f"{url}#dp1")
            app = build_fleet_app(FleetConfig(engines, health_interval_s=0.05))
            placement = app.state.router.placement
            async with (
                serving(app) as [proxy],
                httpx.AsyncClient(base_url=proxy, timeout=WAIT_S) as client,
            ):
                await until(lambda: all(len(placement.streams[e]) == 1 for e in engines),
                            "each engine's own events followed")  # fmt: skip
                server.holds(1, PROMPT)
                await until(lambda: len(placement.index) == 6, "engine 1's blocks indexed")
                for _ in range(3):
                    route = await _route(client, PROMPT)
                    assert route.startswith(f"{engines[1]}; prefix; predicted_cached"), route
                assert server.ranks_asked() == ["1"] * 3
                route = await _route(client, list(range(7, 60)))  # no engine holds it
                assert route.startswith(f"{engines[0]}; load"), route
                assert server.ranks_asked()[-1] == "0"

    run(scenario())


def test_an_engine_the_server_lacks_is_refused_naming_its_ranks(
    server: DataParallelServer,
) -> None:
    async def scenario() -> None:
        async with serving(server.app) as [url]:
            # asked from a thread: the fake server answers in this event loop
            found = await asyncio.to_thread(sources, f"{url}#dp1", WAIT_S)
            assert [s.endpoint for s in found] == [server.events["1"]["endpoint"]]
            with pytest.raises(ValueError, match=r"no data-parallel engine 2 \(its: 0, 1\)"):
                await asyncio.to_thread(sources, f"{url}#dp2", WAIT_S)

    run(scenario())


async def _route(client: httpx.AsyncClient, prompt: list[int]) -> str:
    body = {"model": "fake-model", "max_tokens": 2, "prompt": prompt}  # the model it lists
    answer = await client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.headers["x-kvtier-route"]
