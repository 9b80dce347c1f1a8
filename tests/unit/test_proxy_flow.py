"""A completion through the proxy: prefilled on one fake engine, decoded on another."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest
from proxy_fakes import FakeEngine, proxied, run, serving, stream_texts

from kvtier.apps.proxy.bodies import PREFILL_KV_PARAMS

COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 3, "min_tokens": 2}
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
    "max_completion_tokens": 3,
}
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
TEXTS = ["t0 ", "t1 ", "t2 "]
AUTH = "Bearer sk-1"
PREFILL_S = 0.05


def _offer(prefill: FakeEngine, number: int) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": prefill.name,
        "remote_request_id": f"{prefill.name}-{number}",
        "remote_block_ids": [[1, 2, 3]],
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_prefill_makes_one_token_and_decode_answers_with_its_kv(path: str, stream: bool) -> None:
    request = {**(CHAT if path.endswith("chat/completions") else COMPLETION)}
    request.update(STREAM if stream else {})
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    prefill.before_answer = lambda: asyncio.sleep(PREFILL_S)  # the prefill's forward

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                answer = await client.post(path, json=request, headers={"Authorization": AUTH})

        [prefilled], [decoded] = prefill.received, decode.received
        assert prefilled.path == decoded.path == path
        one_token = {"max_tokens": 1, "stream": False, "kv_transfer_params": PREFILL_KV_PARAMS}
        if "max_completion_tokens" in request:
            one_token["max_completion_tokens"] = 1
        dropped = ("min_tokens", "stream_options")
        assert prefilled.body == {k: v for k, v in request.items() if k not in dropped} | one_token
        assert decoded.body == {**request, "kv_transfer_params": _offer(prefill, 1)}
        assert prefilled.headers["x-request-id"] == decoded.headers["x-request-id"]
        assert {prefilled.headers["authorization"], decoded.headers["authorization"]} == {AUTH}

        assert answer.status_code == 200
        timing = re.fullmatch(r"prefill;dur=(\d+\.\d)", answer.headers["server-timing"])
        assert timing is not None and PREFILL_S * 1e3 <= float(timing[1]) < 1e3
        if stream:
            assert answer.headers["content-type"].startswith("text/event-stream")
            assert stream_texts(answer.text) == TEXTS
            assert answer.text.endswith("data: [DONE]\n\n")
        else:
            assert answer.json()["engine"] == "d"
            assert answer.json()["kv_transfer_params"] == _offer(prefill, 1)

    run(scenario())


def test_without_an_offer_the_decode_computes_the_prompt(caplog: pytest.LogCaptureFixture) -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    prefill.offer = False

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                for _ in range(2):
                    answer = await client.post("/v1/completions", json=COMPLETION)
                    assert answer.status_code == 200

    with caplog.at_level(logging.WARNING, logger="kvtier.apps.proxy"):
        run(scenario())
    assert [r.body for r in decode.received] == [COMPLETION, COMPLETION]
    warned = [r for r in caplog.records if "without kv_transfer_params" in r.getMessage()]
    assert len(warned) == 1  # once per prefill engine


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_an_engines_error_answer_is_passed_back(side: str) -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    (prefill if side == "prefill" else decode).error_status = 400

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                answer = await client.post("/v1/completions", json={**COMPLETION, **STREAM})
        assert answer.status_code == 400
        name = "p" if side == "prefill" else "d"
        refusal = {"message": f"{name} refuses", "type": "BadRequestError", "code": 400}
        assert answer.json() == {"error": refusal}
        assert len(decode.received) == (0 if side == "prefill" else 1)

    run(scenario())


def test_the_models_are_a_decode_engines() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                answer = await client.get("/v1/models")
        assert answer.status_code == 200
        assert answer.json() == {"object": "list", "data": [{"id": "fake-model", "by": "d"}]}

    run(scenario())


def test_a_body_that_is_not_a_json_object_is_refused_before_any_engine() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                not_json = await client.post("/v1/completions", content=b"{oops")
                a_list = await client.post("/v1/completions", json=[1])
        assert (not_json.status_code, a_list.status_code) == (400, 400)
        assert a_list.json()["error"]["message"] == "the request body is not a JSON object"
        assert prefill.received == decode.received == []

    run(scenario())
