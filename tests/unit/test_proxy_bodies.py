"""What each side is asked: the client's body rewritten for prefill and for decode."""

from __future__ import annotations

from typing import Any

from kvtier.apps.proxy.bodies import PREFILL_KV_PARAMS, decode_body, offered_params, prefill_body

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 50,
    "max_completion_tokens": 50,
    "min_tokens": 5,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.5,
}
OFFER = {"do_remote_prefill": True, "remote_engine_id": "p", "remote_block_ids": [[1]]}


def test_the_prefill_makes_one_token_unstreamed_and_keeps_its_kv() -> None:
    assert prefill_body(CHAT) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "temperature": 0.5,
        "kv_transfer_params": PREFILL_KV_PARAMS,
    }
    assert CHAT["max_tokens"] == 50 and "stream_options" in CHAT  # the client's is unchanged


def test_the_prefill_params_are_nixl_connectors() -> None:
    assert PREFILL_KV_PARAMS == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }


def test_max_completion_tokens_is_set_only_when_given() -> None:
    assert "max_completion_tokens" not in prefill_body({"prompt": "x", "max_tokens": 9})


def test_an_offer_needs_do_remote_prefill() -> None:
    assert offered_params({"kv_transfer_params": OFFER}) == OFFER
    assert offered_params({"kv_transfer_params": None}) is None
    assert offered_params({"choices": []}) is None
    assert offered_params({"kv_transfer_params": {"kvtier": {"computed": 3}}}) is None
    assert offered_params(["not", "an", "answer"]) is None


def test_the_decode_gets_the_clients_request_with_the_offer() -> None:
    given = {**CHAT, "kv_transfer_params": {"mine": 1}}
    assert decode_body(given, OFFER) == {**CHAT, "kv_transfer_params": OFFER}
    assert decode_body(given, None) == CHAT
