"""Without a working prefill engine the proxy degrades: the decode engine computes the prompt.

No prefill engine up (its /health fails, or it is in backoff), or the one asked fails before
answering (refused, reset, too slow for the prefill's limit, a 5xx): the client's request goes to
a decode engine as it came, without ``kv_transfer_params``, and the client gets its answer with
``x-kvtier-prefill: skipped|failed``, counted on ``/metrics``. Once the prefill engine passes its
/health again, prefills resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from proxy_fakes import (
    WAIT_S,
    FakeEngine,
    closed_url,
    metric,
    proxied,
    resetting,
    run,
    serving,
    stream_texts,
    until,
)

COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 3, "min_tokens": 2}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
TEXTS = ["t0 ", "t1 ", "t2 "]
BOUND_S = 5.0  # a degraded request is answered within this, not after the proxy's 300 s
DEGRADED = "kvtier_proxy_degraded_requests_total"
REQUESTS = "kvtier_proxy_requests_total"
REASONS = {"refused": "connection refused", "timeout": "no answer before the proxy's timeout"}
CASES = {  # id -> (path, request)
    "completion": ("/v1/completions", COMPLETION),
    "completion-streamed": ("/v1/completions", {**COMPLETION, "stream": True}),
    "chat": ("/v1/chat/completions", CHAT),
    "chat-streamed": ("/v1/chat/completions", {**CHAT, "stream": True}),
}


def _served_by_decode(answer: Any, request: dict[str, Any], decode: FakeEngine) -> None:
    """The client got the decode engine's answer to its request, sent without a prefill's KV."""
    assert answer.status_code == 200, answer.text
    [decoded] = decode.received
    assert decoded.body == request and "kv_transfer_params" not in decoded.body
    if request.get("stream"):
        assert stream_texts(answer.text) == TEXTS
        assert answer.text.endswith("data: [DONE]\n\n")
    else:
        assert answer.json()["engine"] == decode.name
        assert answer.json()["kv_transfer_params"] is None


@pytest.mark.parametrize("case", CASES)
def test_with_no_prefill_engine_up_the_decode_engine_computes_the_prompt(case: str) -> None:
    path, request = CASES[case]
    decode = FakeEngine("d")

    async def scenario() -> None:
        with closed_url() as dead_1, closed_url() as dead_2:
            async with serving(decode.app) as [d_url]:
                async with proxied([dead_1, dead_2], [d_url]) as (client, router):
                    await until(lambda: not router.prefill.any_up(), "the watch to see them down")
                    started = time.monotonic()
                    answer = await client.post(path, json=request)
                    assert time.monotonic() - started < BOUND_S
                    assert await metric(client, DEGRADED, reason="no_prefill") == 1
                    assert await metric(client, DEGRADED, reason="prefill_failed") == 0
                    assert await metric(client, REQUESTS, prefill="skipped") == 1
                    assert await metric(client, REQUESTS, prefill="offered") == 0
                    for url in (dead_1, dead_2):
                        assert await metric(client, "kvtier_proxy_engine_up", side="prefill",
                                            url=url) == 0  # fmt: skip
                    assert await metric(client, "kvtier_proxy_engine_up", side="decode",
                                        url=d_url) == 1  # fmt: skip
        _served_by_decode(answer, request, decode)
        assert answer.headers["x-kvtier-prefill"] == "skipped"
        assert answer.headers["server-timing"] == 'prefill;dur=0.0;desc="skipped"'

    run(scenario())


@contextlib.asynccontextmanager
async def _failing_prefill(failure: str) -> AsyncIterator[tuple[str, FakeEngine]]:
    """A prefill engine whose /health passes and which fails a completion as ``failure`` says
    (for "refused", the caller ends the ``async with`` once the proxy has seen it up)."""
    prefill = FakeEngine("p")
    if failure == "reset":
        async with resetting() as url:
            yield url, prefill
        return
    if failure == "500":
        prefill.error_status = 500
    never = asyncio.Event()
    if failure == "timeout":
        prefill.before_answer = lambda: asyncio.wait_for(never.wait(), WAIT_S)
    async with serving(prefill.app) as [url]:
        try:
            yield url, prefill
        finally:
            never.set()


@pytest.mark.parametrize("case", ["completion", "chat-streamed"])
@pytest.mark.parametrize("failure", ["refused", "reset", "timeout", "500"])
def test_a_prefill_engine_that_fails_is_a_recompute_on_the_decode_engine(
    failure: str, case: str
) -> None:
    path, request = CASES[case]
    decode = FakeEngine("d")
    # a long watch interval: the proxy takes the prefill engine for up when the request comes
    limits = {"prefill_timeout_s": 0.3, "health_interval_s": 60.0, "backoff_s": 60.0}

    async def scenario() -> None:
        async with serving(decode.app) as [d_url], contextlib.AsyncExitStack() as prefill_up:
            p_url, prefill = await prefill_up.enter_async_context(_failing_prefill(failure))
            async with proxied([p_url], [d_url], **limits) as (client, router):
                engine = router.prefill.engines[0]
                if failure == "refused":  # gone once its /health passed: connections refused
                    await asyncio.wait_for(prefill.health_asked.wait(), WAIT_S)
                    await prefill_up.aclose()
                started = time.monotonic()
                answer = await client.post(path, json=request)
                assert time.monotonic() - started < BOUND_S
                assert await metric(client, DEGRADED, reason="prefill_failed") == 1
                assert await metric(client, DEGRADED, reason="no_prefill") == 0
                assert await metric(client, REQUESTS, prefill="failed") == 1
                # an engine that broke off or never answered is skipped for the backoff; one
                # that answered a 5xx is not (the next request may well succeed)
                reasons = router.prefill.down_reasons()
                assert set(reasons) == (set() if failure == "500" else {p_url})
                if failure in REASONS:
                    assert reasons[p_url] == REASONS[failure]
                assert engine.in_flight == 0
        _served_by_decode(answer, request, decode)
        assert answer.headers["x-kvtier-prefill"] == "failed"
        timing = re.fullmatch(
            r'prefill;dur=(\d+\.\d);desc="failed"', answer.headers["server-timing"]
        )
        assert timing is not None
        if failure == "timeout":  # bounded by the prefill's limit, not the request's
            assert limits["prefill_timeout_s"] * 1e3 <= float(timing[1]) < BOUND_S * 1e3

    run(scenario())


def test_a_prefill_engine_known_down_is_not_asked_until_its_backoff_ends() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    never = asyncio.Event()
    prefill.before_answer = lambda: asyncio.wait_for(never.wait(), WAIT_S)

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            limits = {"prefill_timeout_s": 0.3, "backoff_s": 60.0}
            async with proxied([p_url], [d_url], **limits) as (client, _):
                first = await client.post("/v1/completions", json=COMPLETION)
                started = time.monotonic()
                second = await client.post("/v1/completions", json=COMPLETION)
                assert time.monotonic() - started < BOUND_S
                never.set()
                assert await metric(client, DEGRADED, reason="prefill_failed") == 1
                assert await metric(client, DEGRADED, reason="no_prefill") == 1
        assert first.headers["x-kvtier-prefill"] == "failed"
        assert second.headers["x-kvtier-prefill"] == "skipped"
        assert len(prefill.received) == 1  # the second request did not wait on it
        assert [r.body for r in decode.received] == [COMPLETION, COMPLETION]

    run(scenario())


def test_prefills_resume_once_the_prefill_engine_passes_its_health_again() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    prefill.health_status = 503

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url], health_interval_s=0.05) as (client, router):
                await until(lambda: not router.prefill.any_up(), "the watch to see it down")
                assert router.prefill.down_reasons() == {p_url: "HTTP 503"}
                skipped = await client.post("/v1/completions", json=COMPLETION)
                prefill.health_status = 200
                await until(router.prefill.any_up, "the watch to see it up again")
                engine_up = await metric(
                    client, "kvtier_proxy_engine_up", side="prefill", url=p_url
                )
                resumed = await client.post("/v1/completions", json=COMPLETION)
                assert await metric(client, REQUESTS, prefill="offered") == 1
                assert await metric(client, DEGRADED, reason="no_prefill") == 1
        assert engine_up == 1
        assert skipped.headers["x-kvtier-prefill"] == "skipped"
        assert resumed.headers["x-kvtier-prefill"] == "offered"
        assert re.fullmatch(r"prefill;dur=\d+\.\d", resumed.headers["server-timing"])
        [prefilled] = prefill.received  # only the second request was prefilled
        assert prefilled.body["kv_transfer_params"]["do_remote_decode"] is True
        assert decode.received[0].body == COMPLETION
        assert decode.received[1].body["kv_transfer_params"]["remote_engine_id"] == "p"

    run(scenario())
