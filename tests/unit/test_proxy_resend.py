"""An engine that dies or stalls before the first byte of its answer reached the client costs
the client nothing: the request goes to another engine, counted; after a byte went out, or with
no engine left, the client is told (``kvtier/apps/proxy/resend.py``, ``stall.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from proxy_fakes import (
    WAIT_S,
    FakeEngine,
    Hook,
    metric,
    proxied,
    resetting,
    run,
    serving,
    stream_texts,
    until,
)

from kvtier.apps.proxy.app import build_fleet_app
from kvtier.apps.proxy.config import FleetConfig, ProxyConfig
from kvtier.apps.proxy.hedge import HEDGE_FLOOR_S, MIN_SAMPLES, Hedge

COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 3}
TEXTS = ["t0 ", "t1 ", "t2 "]
BOUND_S = 5.0  # a stalled engine's request is answered within this (found by a 0.3 s probe)
FAST = {"health_interval_s": 0.1, "health_timeout_s": 0.3}


@contextlib.asynccontextmanager
async def fleet_of(*urls: str, **limits: float) -> AsyncIterator[httpx.AsyncClient]:
    app = build_fleet_app(FleetConfig(urls, "round-robin", **limits))  # type: ignore[arg-type]
    async with serving(app) as [url], httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
        yield client


def _hang(release: asyncio.Event) -> Hook:
    async def hang() -> None:
        await asyncio.wait_for(release.wait(), WAIT_S)

    return hang


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_fleet_engine_that_breaks_off_costs_no_client_error(stream: bool) -> None:
    good = FakeEngine("good")

    async def scenario() -> None:
        async with resetting() as dead, serving(good.app) as [url], fleet_of(dead, url) as client:
            answers = [
                await client.post("/v1/completions", json={**COMPLETION, "stream": stream})
                for _ in range(4)
            ]
            resent = await metric(client, "kvtier_proxy_resent_requests_total", side="engine",
                                  cause="broke")  # fmt: skip
        assert [a.status_code for a in answers] == [200] * 4
        texts = [stream_texts(a.text) if stream else [a.json()["choices"][0]["text"]]
                 for a in answers]  # fmt: skip
        assert texts == [TEXTS if stream else ["".join(TEXTS)]] * 4
        routes = [a.headers["x-kvtier-route"] for a in answers]
        moved = [r for r in routes if "resent=1" in r]
        assert moved and all(r.startswith(f"{url}; retry;") for r in moved), routes
        assert resent == len(moved)  # the dead one was tried once, then skipped (backoff)
        assert len(good.received) == 4

    run(scenario())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_stalled_fleet_engine_is_found_and_its_request_answered_elsewhere(stream: bool) -> None:
    stalled, good = FakeEngine("stalled"), FakeEngine("good")
    release = asyncio.Event()

    async def scenario() -> None:
        async with serving(stalled.app, good.app) as urls, fleet_of(*urls, **FAST) as client:
            stalled.before_answer = stalled.before_health = _hang(release)
            start = time.monotonic()
            answers = await asyncio.gather(*(
                client.post("/v1/completions", json={**COMPLETION, "stream": stream})
                for _ in range(2)
            ))  # fmt: skip
            took = time.monotonic() - start
            resent = await metric(client, "kvtier_proxy_resent_requests_total", side="engine",
                                  cause="stalled")  # fmt: skip
            release.set()
        assert [a.status_code for a in answers] == [200, 200]
        assert took < BOUND_S
        assert resent == 1 and len(stalled.received) == 1 and len(good.received) == 2
        assert (
            "resent=1"
            in answers[0].headers["x-kvtier-route"] + answers[1].headers["x-kvtier-route"]
        )

    run(scenario())


def test_a_stream_silent_after_its_headers_goes_elsewhere_by_the_first_byte_limit() -> None:
    """Its /health passes (a wedged device): the first byte's limit finds it."""
    silent, good = FakeEngine("silent"), FakeEngine("good")
    release = asyncio.Event()
    silent.before_first_chunk = _hang(release)

    async def scenario() -> None:
        async with serving(silent.app, good.app) as urls:
            async with fleet_of(*urls, first_byte_timeout_s=0.5) as client:
                answer = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
                release.set()
        assert answer.status_code == 200 and stream_texts(answer.text) == TEXTS
        assert answer.headers["x-kvtier-route"].startswith(f"{urls[1]}; retry;")

    run(scenario())


def test_with_no_other_engine_a_stalled_one_is_waited_for() -> None:
    engine = FakeEngine("only")
    release = asyncio.Event()

    async def scenario() -> None:
        async with serving(engine.app) as [url], fleet_of(url, **FAST) as client:
            engine.before_answer = engine.before_health = _hang(release)
            asked = asyncio.ensure_future(client.post("/v1/completions", json=COMPLETION))
            await until(lambda: len(engine.received) == 1, "the request to reach the engine")
            await asyncio.sleep(0.5)  # a wait the test is about: probes time out meanwhile
            assert not asked.done()
            release.set()
            answer = await asked
        assert answer.status_code == 200

    run(scenario())


def test_a_broken_answer_is_sent_again_at_most_retries_times() -> None:
    async def scenario() -> None:
        async with resetting() as a, resetting() as b, fleet_of(a, b, retries=1) as client:
            answer = await client.post("/v1/completions", json=COMPLETION)
            resent = await metric(client, "kvtier_proxy_resent_requests_total", side="engine",
                                  cause="broke")  # fmt: skip
        assert answer.status_code == 502 and resent == 1
        message = answer.json()["error"]["message"]
        assert message.startswith((f"engine engine {a} failed", f"engine engine {b} failed"))

    run(scenario())


def test_a_decode_engine_that_breaks_off_sends_the_request_to_another_without_the_offer() -> None:
    prefill, good = FakeEngine("p"), FakeEngine("d")

    async def scenario() -> None:
        async with resetting() as dead, serving(prefill.app, good.app) as (p_url, d_url):
            async with proxied([p_url], [dead, d_url]) as (client, router):
                answers = [await client.post("/v1/completions", json=COMPLETION)
                           for _ in range(2)]  # fmt: skip
                resent = await metric(client, "kvtier_proxy_resent_requests_total",
                                      side="decode", cause="broke")  # fmt: skip
        assert [a.status_code for a in answers] == [200, 200]
        moved = [a for a in answers if a.headers.get("x-kvtier-resent") == "1"]
        assert len(moved) == 1 and resent == 1
        # the one sent again is computed there: the prefill's KV may be gone
        params = [r.body.get("kv_transfer_params") for r in good.received]
        assert sorted(p is None for p in params) == [False, True]

    run(scenario())


def test_retry_and_limit_settings_name_their_bad_value() -> None:
    with pytest.raises(ValueError, match="retries"):
        FleetConfig(("http://127.0.0.1:1",), retries=-1)
    with pytest.raises(ValueError, match="health_timeout_s"):
        ProxyConfig(("http://127.0.0.1:1",), ("http://127.0.0.1:2",), health_timeout_s=0)
    with pytest.raises(ValueError, match="first_byte_timeout_s"):
        FleetConfig(("http://127.0.0.1:1",), first_byte_timeout_s=0)


def test_a_stalled_prefill_engine_is_given_up_on_when_found_not_at_the_prefills_limit() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    release = asyncio.Event()

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url], **FAST) as (client, _):
                await until(prefill.health_asked.is_set, "the prefill engine probed")
                prefill.before_answer = prefill.before_health = _hang(release)
                start = time.monotonic()
                answer = await client.post("/v1/completions", json=COMPLETION)
                took = time.monotonic() - start
                release.set()
        assert answer.status_code == 200 and answer.headers["x-kvtier-prefill"] == "failed"
        assert took < BOUND_S  # the prefill's own limit is 60 s
        assert decode.received[0].body.get("kv_transfer_params") is None

    run(scenario())


def test_a_first_byte_later_than_nearly_every_recent_one_goes_to_a_second_engine_too() -> None:
    slow, quick = FakeEngine("slow"), FakeEngine("quick")
    release = asyncio.Event()

    async def scenario() -> None:
        async with serving(slow.app, quick.app) as urls, fleet_of(*urls) as client:
            for _ in range(MIN_SAMPLES):  # the recent first bytes: milliseconds
                assert (await client.post("/v1/completions", json=COMPLETION)).status_code == 200
            slow.before_answer = _hang(release)
            start = time.monotonic()
            answers = await asyncio.gather(
                *(client.post("/v1/completions", json=COMPLETION) for _ in range(2))
            )
            took = time.monotonic() - start
            hedged = await metric(client, "kvtier_proxy_resent_requests_total", side="engine",
                                  cause="hedged")  # fmt: skip
            release.set()
        assert [a.status_code for a in answers] == [200, 200]
        assert hedged == 1 and took < 1.0  # hedged after HEDGE_FLOOR_S, not at /health's 3 s
        routes = [a.headers["x-kvtier-route"] for a in answers]
        assert all(r.startswith(f"{urls[1]};") for r in routes), routes

    run(scenario())


def test_hedging_waits_for_enough_answers_and_can_be_turned_off() -> None:
    hedge = Hedge(2.0, HEDGE_FLOOR_S)
    for i in range(MIN_SAMPLES - 1):
        hedge.saw(False, 0.01 * (i + 1))
    assert hedge.after(False) is None  # too few to say what is late
    hedge.saw(False, 0.5)
    assert hedge.after(False) == pytest.approx(1.0)  # 2 x the 99th percentile
    assert hedge.after(True) is None  # streams are timed apart
    for _ in range(MIN_SAMPLES):
        hedge.saw(True, 0.001)
    assert hedge.after(True) == HEDGE_FLOOR_S
    assert Hedge(0.0, HEDGE_FLOOR_S).after(False) is None
    with pytest.raises(ValueError, match="hedge_after_p99"):
        FleetConfig(("http://127.0.0.1:1",), hedge_after_p99=-1)
