"""Why the proxy answers in place of an engine: one exception per cause, each its own response.

    ProxyError.response()   the HTTP answer to the client; ``event()`` the same as an SSE event,
                            for a stream whose headers already went out
    BadRequest              400: the client's body is not a JSON object
    EnginesDown             503: no engine of a side could be connected to
    EngineFailed            502 (504 when timed out): an engine broke off or never answered;
                            its ``cause``: ``BROKE``, ``STALLED`` (sent again elsewhere while
                            nothing reached the client) or ``TIMED_OUT`` (the request's time)
    EngineAnswered          an engine's own error answer (4xx/5xx), passed back unchanged

Bodies follow vLLM's ``ErrorResponse``: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.responses import Response

BROKE = "broke"  # the engine broke off: reset, closed, or an answer cut short
STALLED = "stalled"  # it went down, or sent no first byte in time, while it had the request
TIMED_OUT = "timed_out"  # the request's own time ran out
HEDGED = "hedged"  # not a failure: its first byte was late, so it went to a second engine too


class ProxyError(Exception):
    """A request the proxy answers itself, with ``status`` and ``message``."""

    status = 500
    kind = "ProxyError"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.kind, "param": None,
                          "code": self.status}}  # fmt: skip

    def response(self) -> Response:
        content = json.dumps(self.body()).encode()
        return Response(content, self.status, media_type="application/json")

    def event(self) -> bytes:
        """The error as one server-sent event (what vLLM sends when a stream fails)."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


class BadRequest(ProxyError):
    status = 400
    kind = "BadRequestError"


class EnginesDown(ProxyError):
    """Every engine of ``side`` refused or timed out a connection; ``reasons``: URL -> why."""

    status = 503
    kind = "ServiceUnavailableError"

    def __init__(self, side: str, reasons: Mapping[str, str]) -> None:
        down = ", ".join(f"{url} ({reason})" for url, reason in reasons.items())
        super().__init__(f"{side} engine(s) down: {down}")
        self.side = side
        self.reasons = dict(reasons)

    def body(self) -> dict[str, object]:
        return {**super().body(), "side": self.side, "down": self.reasons}


class EngineFailed(ProxyError):
    """The ``side`` engine at ``url`` was connected to but failed: broke off, or too slow."""

    kind = "BadGatewayError"

    def __init__(
        self, side: str, url: str, reason: str, timed_out: bool, cause: str | None = None
    ) -> None:
        super().__init__(f"{side} engine {url} failed: {reason}")
        self.url = url
        self.reason = reason
        self.cause = cause or (TIMED_OUT if timed_out else BROKE)
        self.status = 504 if timed_out else 502
        self.kind = "GatewayTimeoutError" if timed_out else "BadGatewayError"


class EngineAnswered(ProxyError):
    """An engine answered with an error: its status, headers and body go to the client as
    they came."""

    def __init__(self, side: str, answer: Response) -> None:
        super().__init__(f"{side} engine answered HTTP {answer.status_code}")
        self.status = answer.status_code
        self.answer = answer

    def response(self) -> Response:
        return self.answer
