"""Engines that are down, slow or die: skipped while another is up, else a named error, fast.

(Prefill engines down or failing are not an error: see test_proxy_degrade.)"""

from __future__ import annotations

import asyncio
import json
import time

from proxy_fakes import WAIT_S, FakeEngine, closed_url, proxied, run, serving

COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 3}
BOUND_S = 5.0  # a failure is answered within this, not after the proxy's 300 s


def test_a_decode_engine_that_is_down_is_skipped() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")

    async def scenario() -> None:
        with closed_url() as dead:
            async with serving(prefill.app, decode.app) as (p_url, d_url):
                async with proxied([p_url], [dead, d_url]) as (client, router):
                    answers = [await client.post("/v1/completions", json=COMPLETION)]
                    answers.append(await client.post("/v1/completions", json=COMPLETION))
                    assert router.decode.down_reasons() == {dead: "connection refused"}
        assert [answer.status_code for answer in answers] == [200, 200]
        assert len(decode.received) == 2

    run(scenario())


def test_with_every_decode_engine_down_the_client_gets_503_naming_them() -> None:
    prefill = FakeEngine("p")

    async def scenario() -> None:
        with closed_url() as dead:
            async with serving(prefill.app) as [p_url], proxied([p_url], [dead]) as (client, _):
                start = time.monotonic()
                first = await client.post("/v1/completions", json=COMPLETION)
                second = await client.post("/v1/chat/completions", json=COMPLETION)
                assert time.monotonic() - start < BOUND_S
        for answer in (first, second):
            assert answer.status_code == 503
            error = answer.json()["error"]
            assert error["message"] == f"decode engine(s) down: {dead} (connection refused)"
            assert error["code"] == 503
            assert answer.json()["down"] == {dead: "connection refused"}
        assert len(prefill.received) <= 1  # the second request was not prefilled for no one

    run(scenario())


def test_an_engine_too_slow_for_the_timeout_gets_504() -> None:
    """The prefill's own limit (60 s) is past the request's: no time is left to decode."""
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    never = asyncio.Event()

    async def hang() -> None:
        await asyncio.wait_for(never.wait(), WAIT_S)

    prefill.before_answer = hang

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url], timeout_s=0.5) as (client, router):
                start = time.monotonic()
                answer = await client.post("/v1/completions", json=COMPLETION)
                assert time.monotonic() - start < BOUND_S
                never.set()
                assert router.prefill.engines[0].in_flight == 0
        assert answer.status_code == 504
        assert answer.json()["error"]["message"] == (
            f"prefill engine {p_url} failed: no answer before the proxy's timeout"
        )
        assert decode.received == []

    run(scenario())


def test_a_decode_engine_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")

    async def die() -> None:
        raise RuntimeError("the engine died")

    decode.after_first_chunk = die

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, router):
                request = {**COMPLETION, "stream": True}
                answer = await client.post("/v1/completions", json=request)
                assert router.decode.engines[0].in_flight == 0
        events = [line.removeprefix("data: ") for line in answer.text.splitlines() if line]
        assert len(events) == 2 and json.loads(events[0])["choices"] == [{"text": "t0 "}]
        error = json.loads(events[1])["error"]
        assert error["code"] == 502 and error["message"].startswith(f"decode engine {d_url} failed")

    run(scenario())
