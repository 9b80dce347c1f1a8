"""``kvtier proxy --engine``: a fleet of fake engines whose KV events come from vLLM's own
publisher over real ZMQ; each request goes where its prefix is, and by load without one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_fakes import BS, PROMPT, FleetEngine, fleet
from proxy_fakes import WAIT_S, FakeEngine, metric, run, serving, until

from kvtier.apps.proxy.app import build_app
from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.config import FleetConfig
from kvtier.apps.proxy.event_sources import Source
from kvtier.apps.proxy.event_stream import Mode
from kvtier.apps.proxy.kv_events import Event, Kind
from kvtier.apps.proxy.placement import Placement


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[FleetEngine]]:
    fleet = [FleetEngine(name, tmp_path) for name in ("a", "b")]
    yield fleet
    for engine in fleet:
        engine.publisher.shutdown()


async def _route(client: httpx.AsyncClient, body: dict[str, Any], chat: bool = False) -> str:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    answer = await client.post(path, json={"model": "m", "max_tokens": 2, **body})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-kvtier-route"]


def test_a_request_goes_where_its_prefix_is_and_by_load_without_one(
    engines: list[FleetEngine],
) -> None:
    a, b = engines

    async def scenario() -> None:
        async with fleet(engines) as (client, placement, urls):
            await until(lambda: all(placement.streams[u] for u in urls), "both engines followed")
            b.holds(PROMPT)
            await until(lambda: placement.index.block_size == BS and len(placement.index) == 6,
                        "b's blocks in the index")  # fmt: skip
            for _ in range(3):  # every time, whatever the turn
                route = await _route(client, {"prompt": PROMPT})
                assert route.startswith(f"{urls[1]}; prefix; predicted_cached_tokens=96"), route
            assert len(b.received) == 3 and not a.received
            other = [await _route(client, {"prompt": list(range(7, 60))}) for _ in range(2)]
            # no engine ahead (a new conversation): to the engine sent fewer requests lately
            assert [r.split(";")[:2] for r in other] == [[urls[0], " load"]] * 2
            assert await metric(client, "kvtier_proxy_decisions_total", policy="kv-aware",
                                reason="prefix") == 3  # fmt: skip
            assert await metric(client, "kvtier_proxy_index_mode", url=urls[1],
                                mode="exact") == 1  # fmt: skip
            # a chat request is tokenized by an engine, with its template: the same prefix
            route = await _route(client, {"messages": [{"role": "user", "content": "hi"}]}, True)
            assert route.startswith(urls[1]), route
            asked = [t for e in engines for t in e.tokenized]
            assert asked and asked[-1]["messages"] == [{"role": "user", "content": "hi"}]

    run(scenario())


def test_an_engine_down_is_forgotten_and_its_traffic_moves(engines: list[FleetEngine]) -> None:
    a, b = engines

    async def scenario() -> None:
        async with fleet(engines) as (client, placement, urls):
            await until(lambda: all(placement.streams[u] for u in urls), "both engines followed")
            b.holds(PROMPT)
            await until(lambda: len(placement.index) == 6, "b's blocks in the index")
            b.health_status = 503
            await until(lambda: not placement.streams[urls[1]] and len(placement.index) == 0,
                        "b's index dropped")  # fmt: skip
            assert (await _route(client, {"prompt": PROMPT})).startswith(urls[0])
            b.health_status = 200  # back: followed again, its buffer replayed
            await until(lambda: len(placement.index) == 6, "b's blocks again")
            assert (await _route(client, {"prompt": PROMPT})).startswith(urls[1])

    run(scenario())


def test_an_engine_stalled_is_skipped_but_keeps_its_index(engines: list[FleetEngine]) -> None:
    """A /health unanswered in time (a pause, a busy machine) is not a restart: the engine's KV
    is still there, so the proxy skips it while it stalls and sends its prefix back to it after,
    with no replay to wait for."""
    _, b = engines

    async def scenario() -> None:
        release = asyncio.Event()

        async def hang() -> None:
            await asyncio.wait_for(release.wait(), WAIT_S)

        async with fleet(engines, health_timeout_s=1.0) as (client, placement, urls):
            await until(lambda: all(placement.streams[u] for u in urls), "both engines followed")
            b.holds(PROMPT)
            await until(lambda: len(placement.index) == 6, "b's blocks in the index")
            streams = placement.streams[urls[1]]
            b.before_health = hang
            await until(lambda: not placement.pool.is_up(placement.pool.engines[1]), "b skipped")
            assert (await _route(client, {"prompt": PROMPT})).startswith(urls[0])
            assert placement.streams[urls[1]] is streams and placement.mode(urls[1]) is Mode.EXACT
            b.before_health = None
            release.set()
            await until(lambda: placement.pool.is_up(placement.pool.engines[1]), "b back")
            route = await _route(client, {"prompt": PROMPT})
            assert route.startswith(f"{urls[1]}; prefix; predicted_cached_tokens=96"), route
            assert placement.streams[urls[1]] is streams  # followed all along, never rebuilt

    run(scenario())


def test_round_robin_and_least_loaded_ignore_the_prefix(engines: list[FleetEngine]) -> None:
    _, b = engines

    async def scenario() -> None:
        async with fleet(engines, "round-robin") as (client, placement, urls):
            await until(lambda: all(placement.streams[u] for u in urls), "both engines followed")
            b.holds(PROMPT)
            await until(lambda: len(placement.index) == 6, "b's blocks in the index")
            routes = [(await _route(client, {"prompt": PROMPT})).split(";")[0] for _ in range(4)]
            assert routes == [urls[0], urls[1], urls[0], urls[1]]
            assert not [t for e in engines for t in e.tokenized]  # nothing to tokenize for

    run(scenario())


def test_the_prefill_engine_of_prefill_decode_is_chosen_where_the_prefix_is(
    engines: list[FleetEngine],
) -> None:
    a, b = engines
    decode = FakeEngine("d")

    async def scenario() -> None:
        async with serving(a.app, b.app, decode.app) as [pa, pb, pd]:
            app = build_app([pa, pb], [pd], health_interval_s=0.05)
            async with serving(app) as [url], httpx.AsyncClient(base_url=url, timeout=WAIT_S) as c:
                placement = app.state.router.placement
                await until(lambda: all(placement.streams.values()), "both prefill engines")
                b.holds(PROMPT)
                await until(lambda: len(placement.index) == 6, "b's blocks in the index")
                for _ in range(3):
                    answer = await c.post("/v1/completions", json={"model": "m", "prompt": PROMPT,
                                                                  "max_tokens": 2})  # fmt: skip
                    assert answer.status_code == 200, answer.text
                    assert answer.headers["x-kvtier-prefill"] == "offered"
                    route = answer.headers["x-kvtier-route"]
                    assert route.startswith(f"{pb}; prefix; predicted_cached_tokens=96"), route
        assert len(b.received) == 3 and not a.received and len(decode.received) == 3

    run(scenario())


def test_a_fleet_config_names_its_bad_value() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        FleetConfig(("http://127.0.0.1:1",), "random")
    with pytest.raises(ValueError, match="engine: http://127.0.0.1:1 is given twice"):
        FleetConfig(("127.0.0.1:1", "http://127.0.0.1:1/"))
    assert FleetConfig(("h:1",)).engines == ("http://h:1",)


def test_an_engine_whose_stream_degrades_is_blind_from_the_next_choice() -> None:
    """Which engines' indexes are not exact is kept between choices (not asked of every engine
    for every request), and worked out again as soon as a stream's mode changes: its thread
    tells the placement."""
    urls = ["http://a:1", "http://b:1"]
    clients = [httpx.AsyncClient() for _ in urls]
    pool = Pool("fleet", [Engine(url, client) for url, client in zip(urls, clients)], 1.0)
    placement = Placement(pool, "kv-aware", 1.0)
    streams = [placement._stream(url, Source("tcp://127.0.0.1:9", None, "")) for url in urls]
    for url, stream in zip(urls, streams):  # not started: their modes set as their threads do
        placement.streams[url] = [stream]
        stream.mode = Mode.EXACT
    tokens = list(range(100, 164))
    placement.index.apply(
        urls[1], [Event(Kind.STORED, (1, 2, 3, 4), None, tuple(tokens), 16, "GPU")]
    )
    assert placement.choose(tokens)[:3] == (urls[1], "prefix", 63)
    streams[1].mode = Mode.DEGRADED  # a gap: b's index counts as holding nothing
    assert placement.choose(tokens)[1:3] == ("load", 0)
    streams[1].mode = Mode.EXACT  # rebuilt
    assert placement.choose(tokens)[:3] == (urls[1], "prefix", 63)
    for client in clients:
        run(client.aclose())
