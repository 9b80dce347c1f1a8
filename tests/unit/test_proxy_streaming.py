"""Streams go through as they come, and a client that leaves frees the decode engine."""

from __future__ import annotations

import asyncio

from proxy_fakes import WAIT_S, FakeEngine, proxied, run, serving, stream_texts

STREAMED = {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True}
FIRST_S = WAIT_S / 2  # the client's wait for the first event: shorter than the engine's hold


def test_the_first_event_reaches_the_client_before_the_engine_finishes() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    client_got_first = asyncio.Event()

    async def hold() -> None:  # the engine finishes only once the client has its first event
        await asyncio.wait_for(client_got_first.wait(), WAIT_S)

    decode.after_first_chunk = hold

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                async with client.stream("POST", "/v1/completions", json=STREAMED) as answer:
                    chunks = answer.aiter_raw()
                    async with asyncio.timeout(FIRST_S):
                        first = await anext(chunks)
                    assert not decode.stream_closed.is_set()
                    client_got_first.set()
                    rest = b"".join([chunk async for chunk in chunks])
        assert stream_texts(first.decode()) == ["t0 "]
        assert stream_texts((first + rest).decode()) == ["t0 ", "t1 ", "t2 "]

    run(scenario())


def test_a_client_that_leaves_aborts_the_decode_stream() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    never = asyncio.Event()

    async def hold() -> None:
        await asyncio.wait_for(never.wait(), WAIT_S)

    decode.after_first_chunk = hold

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, router):
                async with client.stream("POST", "/v1/completions", json=STREAMED) as answer:
                    await anext(answer.aiter_raw())
                # the client closed its connection mid-stream: the proxy closes the engine's
                await asyncio.wait_for(decode.stream_closed.wait(), FIRST_S)
                assert router.decode.engines[0].in_flight == 0

    run(scenario())
