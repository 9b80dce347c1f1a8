"""One request of a chat run, sent as the OpenAI SDK sends it, and what became of it.

    Record(...)                                   one request's fate (``ok``: answered whole)
    body(prompt, max_tokens, stream) -> dict      a ``/v1/completions`` body: greedy, EOS ignored
    send(client, url, ask, max_tokens, timeout_s, clock) -> Record

Like the SDK, a request is sent again only when the proxy refused the connection (nothing was
sent): each such try is a ``reconnect``, not an error. Every other failure is the client's error,
its ``status`` the cause: ``http`` (a status >= 400), ``broken`` (the connection failed after it
was made), ``sse-error`` (a stream's error event), ``incomplete`` (a stream ended without
``[DONE]``), ``timeout`` (no whole answer within ``timeout_s`` of the first try, reconnects
included). ``started``: a streamed answer's first event had reached the client before the
failure. Time to first token: a stream's first data event; a whole answer's last byte.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvtier.apps.bench.chaos.workload import Ask

PATH = "/v1/completions"
RECONNECT_S = 0.25  # between tries whose connection was refused
STATUSES = ("ok", "http", "broken", "sse-error", "incomplete", "timeout")


@dataclass
class Record:
    id: int
    workload: str  # "chat" or "docs"
    target: str  # "fleet" or "pd"
    stream: bool
    prompt_tokens: int
    start_s: float  # on the run's clock
    end_s: float = 0.0
    ttft_s: float | None = None  # None: no token came
    status: str = "ok"
    why: str = ""
    started: bool = False  # a streamed answer's bytes reached the client before it failed
    reconnects: int = 0
    http_status: int | None = None
    route: str = ""  # the proxy's x-kvtier-route
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)  # kv_transfer_params["kvtier"]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, status: str, why: str) -> None:
        if status not in STATUSES[1:]:
            raise ValueError(f"a failure's status is one of {STATUSES[1:]}, got {status!r}")
        self.status, self.why = status, why[:300]


def body(prompt: list[int], max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True, "stream": stream}  # fmt: skip


async def send(
    client: httpx.AsyncClient,
    url: str,
    ask: Ask,
    max_tokens: int,
    timeout_s: float,
    clock: Callable[[], float],
) -> Record:
    """``ask`` to ``url``, within ``timeout_s``; never raises for the request's failure."""
    record = Record(ask.id, ask.workload, ask.target, ask.stream, len(ask.prompt), clock())
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    await _once(
                        client, url, body(ask.prompt, max_tokens, ask.stream), record, clock
                    )
                    break
                except httpx.ConnectError:  # refused: nothing was sent
                    record.reconnects += 1
                    await asyncio.sleep(RECONNECT_S)
    except TimeoutError:
        record.fail("timeout", f"no whole answer within {timeout_s:g} s")
    except httpx.TransportError as error:
        record.fail("broken", f"{type(error).__name__}: {error}")
    record.end_s = clock()
    return record


async def _once(
    client: httpx.AsyncClient,
    url: str,
    sent: dict[str, Any],
    record: Record,
    clock: Callable[[], float],
) -> None:
    async with client.stream("POST", url + PATH, json=sent) as response:
        record.route = response.headers.get("x-kvtier-route", "")
        record.http_status = response.status_code
        if response.status_code >= 400:
            answer = (await response.aread()).decode(errors="replace")
            record.fail("http", f"{response.status_code}: {_message(answer)}")
        elif record.stream:
            await _stream(response, record, clock)
        else:
            _whole(json.loads(await response.aread()), record)
            record.ttft_s = clock() - record.start_s


async def _stream(response: httpx.Response, record: Record, clock: Callable[[], float]) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            return
        try:
            event = json.loads(line.removeprefix("data: "))
        except json.JSONDecodeError:
            record.fail("sse-error", f"an event that is not JSON: {line[:100]}")
            return
        if "error" in event:
            record.fail("sse-error", _message(json.dumps(event)))
            return
        if record.ttft_s is None:
            record.ttft_s = clock() - record.start_s
        record.started = True
        for choice in event.get("choices", []):
            record.tokens += choice.get("token_ids") or []
            record.text += choice.get("text") or ""
    record.fail("incomplete", "the stream ended without [DONE]")


def _whole(answer: dict[str, Any], record: Record) -> None:
    choice = answer["choices"][0]
    record.tokens = list(choice.get("token_ids") or [])
    record.text = str(choice.get("text") or "")
    record.provenance = dict((answer.get("kv_transfer_params") or {}).get("kvtier") or {})


def _message(answer: str) -> str:
    """An error body's message (vLLM's ``{"error": {"message": ...}}``), else the body."""
    try:
        error = json.loads(answer).get("error")
    except (json.JSONDecodeError, AttributeError):
        return answer[:300]
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
