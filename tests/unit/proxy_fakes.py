"""Fake vLLM engines for the proxy's tests, served on ephemeral ports in the test's event loop.

    FakeEngine(name)   records each request (path, JSON body, headers) and answers like vLLM:
                       a request with ``do_remote_decode`` (a prefill) gets JSON offering its KV
                       in ``kv_transfer_params``; any other (a decode) gets JSON, or SSE ending in
                       ``data: [DONE]`` when ``stream`` is true, echoing the ``kv_transfer_params``
                       it got. Hooks make it wait (its answers, its /health), fail or die
                       mid-stream.
    serving(*apps)     each app on 127.0.0.1:<free port> for the ``async with``; yields the URLs
    closed_url()       a URL whose port is bound but not listening: connections are refused
    resetting()        a URL whose /health passes and whose other requests are reset (TCP RST)
    proxied(p, d)      the proxy for those URLs, served: a client of it and its Router
    metric(client, n)  a sample of the proxy's /metrics
    until(condition)   polls ``condition`` until true (at most ``WAIT_S``)
    run(scenario)      ``asyncio.run`` bounded by ``LIMIT_S``

Every wait is bounded: ``WAIT_S`` for one condition, ``LIMIT_S`` for a whole scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, NamedTuple

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client.parser import text_string_to_metric_families
from starlette.background import BackgroundTask
from starlette.responses import Response

from kvtier.apps.proxy import build_app
from kvtier.apps.proxy.router import Router

LIMIT_S = 30.0  # a whole scenario
WAIT_S = 10.0  # one wait on a condition inside a scenario

Hook = Callable[[], Awaitable[None]]


class Received(NamedTuple):
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


class FakeEngine:
    """One fake engine. Set the attributes before requests arrive."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.received: list[Received] = []
        self.offer = True  # a prefill answers with kv_transfer_params offering its KV
        self.error_status: int | None = None  # answer every completion with this error
        self.health_status = 200
        self.before_answer: Hook | None = None  # awaited before a completion is answered
        self.after_first_chunk: Hook | None = None  # awaited in a stream after its first event
        self.before_health: Hook | None = None  # awaited before /health is answered
        self.before_first_chunk: Hook | None = None  # awaited in a stream before its first event
        self.stream_closed = asyncio.Event()  # a stream's generator ended (finished or aborted)
        self.health_asked = asyncio.Event()  # its /health answered (all sent) at least once
        self.app = self._app()

    def _app(self) -> FastAPI:
        app = FastAPI()
        app.post("/v1/completions")(self._complete)
        app.post("/v1/chat/completions")(self._complete)
        app.get("/v1/models")(self._models)
        app.get("/health")(self._health)
        return app

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(Received(request.url.path, body, dict(request.headers)))
        if self.before_answer is not None:
            await self.before_answer()
        if self.error_status is not None:
            error = {"message": f"{self.name} refuses", "type": "BadRequestError", "code": 400}
            return JSONResponse({"error": error}, self.error_status)
        params = body.get("kv_transfer_params") or {}
        if params.get("do_remote_decode"):
            return JSONResponse(self._prefilled(body, len(self.received)))
        chat = request.url.path.endswith("/chat/completions")
        if body.get("stream"):
            return StreamingResponse(self._events(body, chat), media_type="text/event-stream")
        text = "".join(_token(i) for i in range(body["max_tokens"]))
        choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        return JSONResponse(
            {"engine": self.name, "choices": [choice], "kv_transfer_params": params or None}
        )

    def _prefilled(self, body: dict[str, Any], number: int) -> dict[str, Any]:
        answer: dict[str, Any] = {"engine": self.name, "choices": [{"text": _token(0)}]}
        if self.offer:
            answer["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.name,
                "remote_request_id": f"{self.name}-{number}",
                "remote_block_ids": [[1, 2, 3]],
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
            }
        return answer

    async def _events(self, body: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        params = body.get("kv_transfer_params")
        try:
            if self.before_first_chunk is not None:
                await self.before_first_chunk()
            for i in range(body["max_tokens"]):
                piece = {"delta": {"content": _token(i)}} if chat else {"text": _token(i)}
                event = {"engine": self.name, "choices": [piece], "kv_transfer_params": params}
                yield f"data: {json.dumps(event)}\n\n"
                if i == 0 and self.after_first_chunk is not None:
                    await self.after_first_chunk()
            yield "data: [DONE]\n\n"
        finally:
            self.stream_closed.set()

    async def _models(self) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "by": self.name}]})

    async def _health(self) -> Response:
        if self.before_health is not None:
            await self.before_health()

        async def answered() -> None:
            self.health_asked.set()

        return Response(status_code=self.health_status, background=BackgroundTask(answered))


def _token(i: int) -> str:
    return f"t{i} "


def stream_texts(sse: str) -> list[str]:
    """The texts of a completion stream's events (chat deltas or completion texts)."""
    texts = []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            choice = json.loads(line.removeprefix("data: "))["choices"][0]
            texts.append(choice["delta"]["content"] if "delta" in choice else choice["text"])
    return texts


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the test process keeps its signal handlers
        yield


@contextlib.asynccontextmanager
async def serving(*apps: Any) -> AsyncIterator[list[str]]:
    """Each app served on its own port. The sockets listen before this yields, so a request
    sent at once waits in the backlog until its server accepts it."""
    servers, tasks, urls = [], [], []
    for app in apps:
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on such sockets (else each answer's
        # body waits ~40 ms behind its headers: Nagle against the client's delayed ACK)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=1
        )
        servers.append(_Server(config))
        tasks.append(asyncio.create_task(servers[-1].serve(sockets=[sock])))
        urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
    try:
        yield urls
    finally:
        for server in servers:
            server.should_exit = True
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)


@contextlib.contextmanager
def closed_url() -> Iterator[str]:
    """A local URL nobody listens on, for the ``with`` (the port stays taken, never open)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def resetting() -> AsyncIterator[str]:
    """A local engine that answers ``GET /health`` with 200 and resets the connection of any
    other request once its head has arrived (SO_LINGER 0: an RST, not a FIN)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"GET /health "):
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
            linger = struct.pack("ii", 1, 0)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            writer.transport.abort()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT_S)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Return once ``condition()`` holds, checking it every few ms; fail after ``WAIT_S``."""
    try:
        async with asyncio.timeout(WAIT_S):
            while not condition():
                await asyncio.sleep(0.005)  # a poll interval: the condition is checked again
    except TimeoutError:
        raise AssertionError(f"waited {WAIT_S:g} s for {what}") from None


async def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    """The proxy's ``/metrics`` sample ``name`` with exactly these labels (KeyError: none)."""
    answer = await client.get("/metrics")
    assert answer.status_code == 200
    for family in text_string_to_metric_families(answer.text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    raise KeyError(f"{name}{labels} is not on /metrics")


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, LIMIT_S))


@contextlib.asynccontextmanager
async def proxied(
    prefill: list[str], decode: list[str], **limits: float
) -> AsyncIterator[tuple[httpx.AsyncClient, Router]]:
    """The proxy for these engine URLs, served, with a client of it and its ``Router``."""
    app = build_app(prefill, decode, **limits)
    async with serving(app) as [url], httpx.AsyncClient(base_url=url, timeout=WAIT_S) as client:
        yield client, app.state.router
