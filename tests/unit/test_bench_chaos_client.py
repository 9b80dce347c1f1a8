"""``kvtier bench chaos``'s client, against scripted answers: it sends again only what the proxy
refused to connect, and records every other failure as the client's error, with its cause and
whether the answer had started streaming."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from kvtier.apps.bench.chaos.client import Record, send
from kvtier.apps.bench.chaos.workload import Ask

Handler = Callable[[httpx.Request], httpx.Response]


def _send(handler: Handler, stream: bool, timeout_s: float = 5.0) -> Record:
    ask = Ask(7, "docs", 0, 0, [1, 2, 3], stream, "fleet")

    async def go() -> Record:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport) as client:
            return await send(
                client, "http://proxy", ask, 2, timeout_s, asyncio.get_running_loop().time
            )

    return asyncio.run(go())


def _events(*events: object, done: bool = True) -> bytes:
    lines = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
    return b"".join(lines) + (b"data: [DONE]\n\n" if done else b"")


TOKEN = {"choices": [{"text": "a", "token_ids": [5]}]}
WHOLE = {
    "choices": [{"text": "ab", "token_ids": [5, 6]}],
    "kv_transfer_params": {"kvtier": {"prompt_tokens": 3, "cpu": 0, "computed": 3}},
}
ROUTE = {"x-kvtier-route": "http://127.0.0.1:1; prefix; predicted_cached_tokens=0"}


def test_a_whole_answer_carries_its_tokens_route_and_provenance() -> None:
    record = _send(lambda request: httpx.Response(200, json=WHOLE, headers=ROUTE), stream=False)
    assert record.ok and record.tokens == [5, 6] and record.text == "ab"
    assert record.provenance == {"prompt_tokens": 3, "cpu": 0, "computed": 3}
    assert record.route.startswith("http://127.0.0.1:1") and record.ttft_s is not None
    assert record.reconnects == 0 and not record.started


def test_a_refused_connection_is_sent_again_and_counted_as_a_reconnect() -> None:
    tries: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        if len(tries) < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, content=_events(TOKEN, TOKEN))

    record = _send(handler, stream=True)
    assert record.ok and record.reconnects == 2 and record.tokens == [5, 5]
    assert json.loads(tries[0].content)["stream"] is True


def test_an_error_status_is_a_client_error_with_the_proxys_message() -> None:
    body = {"error": {"message": "engine http://127.0.0.1:1 failed: ReadError", "code": 502}}
    record = _send(lambda request: httpx.Response(502, json=body), stream=True)
    assert record.status == "http" and record.http_status == 502 and not record.started
    assert record.why == "502: engine http://127.0.0.1:1 failed: ReadError"


def test_an_error_event_after_tokens_is_a_failure_of_an_answer_already_streaming() -> None:
    error = {"error": {"message": "engine failed mid-stream", "code": 502}}
    content = _events(TOKEN, error, done=False)
    record = _send(lambda request: httpx.Response(200, content=content), stream=True)
    assert record.status == "sse-error" and record.started and record.tokens == [5]
    assert "engine failed mid-stream" in record.why


def test_a_stream_that_ends_without_done_is_incomplete() -> None:
    content = _events(TOKEN, done=False)
    record = _send(lambda request: httpx.Response(200, content=content), stream=True)
    assert record.status == "incomplete" and record.started


def test_a_connection_broken_after_it_was_made_is_not_sent_again() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("connection reset", request=request)

    record = _send(handler, stream=False)
    assert record.status == "broken" and record.reconnects == 0 and "ReadError" in record.why


def test_a_proxy_that_refuses_until_the_timeout_ends_the_request_at_its_timeout() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    record = _send(handler, stream=False, timeout_s=0.6)
    assert record.status == "timeout" and record.reconnects >= 2
    assert 0.6 <= record.end_s - record.start_s < 1.5
