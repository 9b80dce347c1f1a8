"""An engine's answer, handed to the client as it came: status, headers and bytes.

    relay(exchange, more) -> Response   a server-sent-event stream goes through chunk by chunk
                                        (``StreamRelay``) once its first piece has come; any
                                        other body is read whole, then sent; ``more``: headers
                                        of the proxy's own to add
    passthrough_headers(answer)   the answer's headers, less those of its own connection

The stream's bytes are not parsed. Until ``relay`` returns, nothing has gone to the client: an
engine that fails before (``EngineFailed``) leaves the request free to go elsewhere
(``resend.py``). An engine that fails mid-stream ends the stream with an error event; a client
that goes away closes the engine's connection (vLLM aborts the request).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from kvtier.apps.proxy.errors import ProxyError
from kvtier.apps.proxy.upstream import Exchange

logger = logging.getLogger(__name__)

# about the hop from the engine, not the answer; the server sets its own
CONNECTION_HEADERS = frozenset(
    b"connection keep-alive proxy-authenticate proxy-authorization te trailer transfer-encoding "
    b"upgrade content-length date server".split()
)


async def relay(exchange: Exchange, more: Sequence[tuple[bytes, bytes]] = ()) -> Response:
    """The client's response for ``exchange`` (which it closes, now or when the stream ends)."""
    answer = exchange.response
    if answer.is_success and answer.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            await exchange.first()
        except BaseException:
            await exchange.close()
            raise
        return StreamRelay(exchange, more)
    response = Response(await exchange.read(), answer.status_code)
    response.raw_headers.extend([*passthrough_headers(answer), *more])
    return response


def passthrough_headers(answer: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in answer.headers.raw if k.lower() not in CONNECTION_HEADERS]


class StreamRelay(Response):
    """Streams an engine's event stream to the client as it arrives."""

    def __init__(self, exchange: Exchange, more: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.status_code = exchange.response.status_code
        self.raw_headers = [*passthrough_headers(exchange.response), *more]
        self.background = None
        self.exchange = exchange

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_cancel_on_disconnect, receive, group.cancel_scope)
                await self._stream(send)
                group.cancel_scope.cancel()
        except OSError:  # ASGI 2.4 servers raise it from send: the client went away
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await self.exchange.close()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})  # fmt: skip
        at_event_end = True
        try:
            async for chunk in self.exchange.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                at_event_end = chunk.endswith(b"\n\n")
        except ProxyError as exc:
            logger.warning("stream ended early: %s", exc.message)
            # end a partly sent event first, so that the error is an event of its own
            tail = exc.event() if at_event_end else b"\n\n" + exc.event()
            await send({"type": "http.response.body", "body": tail, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    message: Message = {}
    while message.get("type") != "http.disconnect":
        message = await receive()
    scope.cancel()
