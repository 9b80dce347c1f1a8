"""``kvtier proxy --engine``: a request meets a cached prefix only under the LoRA adapter and
cache salt it was computed with, as the engines' own block hashes do; fake engines publishing
through vLLM's own publisher over real ZMQ."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_fakes import PROMPT, FleetEngine, fleet
from proxy_fakes import run, until


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[FleetEngine]]:
    fleet = [FleetEngine(name, tmp_path) for name in ("base", "salted", "adapter")]
    yield fleet
    for engine in fleet:
        engine.publisher.shutdown()


async def _route(client: httpx.AsyncClient, **body: Any) -> str:
    answer = await client.post("/v1/completions", json={"max_tokens": 2, "prompt": PROMPT, **body})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-kvtier-route"]


def test_a_request_goes_where_its_prefix_is_under_its_adapter_and_salt(
    engines: list[FleetEngine],
) -> None:
    base, salted, adapter = engines
    adapter.adapters = ["listed"]  # an adapter no event named yet

    async def scenario() -> None:
        async with fleet(engines) as (client, placement, urls):
            await until(lambda: all(placement.streams[u] for u in urls), "engines followed")
            base.holds(PROMPT)
            salted.holds(PROMPT, salt="tenant-1")
            adapter.holds(PROMPT, lora="ad")
            await until(lambda: len(placement.index) == 18, "every engine's blocks indexed")
            for body, where in (({"model": "m"}, 0), ({"model": "m", "cache_salt": "tenant-1"}, 1),
                                ({"model": "ad"}, 2)):  # fmt: skip
                route = await _route(client, **body)
                assert route.startswith(f"{urls[where]}; prefix; predicted_cached_tokens=96"), (
                    body, route,
                )  # fmt: skip
            # another tenant, an adapter /v1/models lists, one loaded since the engines were
            # asked (not a base model they list): nothing cached, wherever it goes
            for body in ({"model": "m", "cache_salt": "tenant-2"}, {"model": "listed"},
                         {"model": "loaded-since"}):  # fmt: skip
                route = await _route(client, **body)
                assert route.endswith("; load; predicted_cached_tokens=0"), (body, route)
            assert placement.index.adapters == {"ad", "listed"}
            assert placement.bases == {"m"}

    run(scenario())


def test_engines_that_list_no_models_leave_every_name_a_base_model(
    engines: list[FleetEngine],
) -> None:
    """Engines behind ``--api-key`` answer ``/v1/models`` 401: only events name adapters, and a
    name no event gave is looked up as the base model's."""
    for engine in engines:
        engine.models_status = 401

    async def scenario() -> None:
        async with fleet(engines) as (client, placement, urls):
            await until(lambda: all(placement.streams[u] for u in urls), "engines followed")
            engines[0].holds(PROMPT)
            await until(lambda: len(placement.index) == 6, "the blocks indexed")
            route = await _route(client, model="served-name")
            assert route.startswith(f"{urls[0]}; prefix; predicted_cached_tokens=96"), route
            assert placement.bases == set()

    run(scenario())


def test_engines_serving_other_models_are_said_once(
    engines: list[FleetEngine], caplog: pytest.LogCaptureFixture
) -> None:
    """One proxy routes one model: a request names it, and an engine that lists it under no
    such name answers 404. The proxy says which engines differ, once."""
    engines[2].base = "other"

    async def scenario() -> None:
        async with fleet(engines) as (_, placement, urls):
            await until(lambda: len(placement.served) == 3, "every engine's models read")
            said = [r.getMessage() for r in caplog.records if "must serve the same" in r.message]
            assert len(said) == 1 and urls[2] in said[0] and "'other'" in said[0], said
            assert placement.bases == {"m", "other"}

    with caplog.at_level("WARNING", logger="kvtier.apps.proxy.placement"):
        run(scenario())
