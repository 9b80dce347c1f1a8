"""What each side is asked: the client's request body, rewritten for prefill and for decode.

prefill_body(request)        one token, not streamed, asking the engine to keep its KV
                             for a remote decode (vLLM NixlConnector's fields)
offered_params(answer)       the ``kv_transfer_params`` a prefill answer offers, or None
decode_body(request, offer)  the client's request as given, with the prefill's offer
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# what vLLM's disaggregated-serving proxy sends a prefill engine: "decode elsewhere"
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# what a one-token prefill must not carry: vLLM rejects min_tokens > max_tokens, and
# stream_options without stream
DECODE_ONLY_FIELDS = ("min_tokens", "min_completion_tokens", "stream_options")


def prefill_body(request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` for a prefill engine: ``max_tokens`` 1 (``max_completion_tokens`` too when
    given), ``stream`` off, the decode-only fields dropped. ``request`` is not changed."""
    body = {key: value for key, value in request.items() if key not in DECODE_ONLY_FIELDS}
    body["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    return body


def offered_params(answer: object) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a prefill engine's answer when they offer its KV to a decode
    engine (``do_remote_prefill`` set); None when the engine offers nothing (no connector, or
    one that does not hand KV over)."""
    if not isinstance(answer, dict):
        return None
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None
    return params


def decode_body(request: Mapping[str, Any], offer: dict[str, Any] | None) -> dict[str, Any]:
    """``request`` for a decode engine: unchanged but for ``kv_transfer_params``, the prefill's
    ``offer`` (absent without one: the decode engine then computes the prompt itself)."""
    body = {key: value for key, value in request.items() if key != "kv_transfer_params"}
    if offer is not None:
        body["kv_transfer_params"] = offer
    return body
