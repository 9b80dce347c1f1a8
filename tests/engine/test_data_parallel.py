"""``kvtier serve --data-parallel-size 2``: two engines behind one server, each with kvtier (real
processes, loopback). vLLM's data-parallel engines share the server's config: each publishes its
KV events on sockets of its own, and as prefill engines with a ``transfer.port`` given, each rank
listens on a port of its own (engine d's rank i on port + d × its ranks + i), which a decode
engine pulls from. ``kvtier proxy`` given each engine (``URL#dp<rank>``) sends a prompt to the
one that holds its prefix.

One prefill server (two engines, ~45 s or more to start) and one decode server serve the module.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from harness import PARALLEL_ENV, SERVED_BLOCKS

from kvtier.apps.bench.common.servers import (
    KVTIER,
    WAIT_S,
    WORKER_IN_CORE,
    Server,
    launch,
    post,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.apps.bench.fleet.real.chat import Answer, ask
from kvtier.apps.bench.fleet.real.fleet import index_modes
from kvtier.apps.ports import free_port, free_ports_on
from kvtier.apps.prompts import make_prompt
from kvtier.apps.proxy.event_sources import sources

pytestmark = pytest.mark.engine

SECRET = "data-parallel-test-secret-32-byte"
ENGINES = 2
MAX_TOKENS = 8


class Fleet(NamedTuple):
    prefill: Server  # two data-parallel engines, one rank each
    decode: Server
    transfer_port: int  # the prefill server's transfer.port
    model: Path
    work: Path


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("dp")
    transfer_port = free_ports_on("127.0.0.1", ENGINES)
    prefill_port, decode_port = free_port(), free_port()
    extra: dict[str, Any] = {"cpu_bytes_to_use": "64MiB", "transfer": {"port": transfer_port}}
    args = [*SERVED_BLOCKS, "--data-parallel-size", str(ENGINES), "--kv-role", "kv_producer"]
    env = {"KVTIER_TRANSFER_SECRET": SECRET, **PARALLEL_ENV}  # OpenMP bound by hand, as TP=2
    prefill = launch(serve_command(tiny_model, prefill_port, extra, args), prefill_port,
                     work / "prefill.log", env)  # fmt: skip
    decode_args = [*SERVED_BLOCKS, "--kv-role", "kv_consumer"]
    decode = launch(serve_command(tiny_model, decode_port, {"cpu_bytes_to_use": "64MiB"},
                                  decode_args), decode_port, work / "decode.log",
                    {"KVTIER_TRANSFER_SECRET": SECRET, **WORKER_IN_CORE})  # fmt: skip
    try:
        wait_healthy(prefill, decode)
        yield Fleet(prefill, decode, transfer_port, tiny_model, work)
    finally:
        stop(prefill)
        stop(decode)


def test_each_engine_publishes_its_kv_events_on_sockets_of_its_own(fleet: Fleet) -> None:
    found = sources(fleet.prefill.url, WAIT_S)
    assert len(found) == ENGINES
    endpoints = {s.endpoint for s in found} | {s.replay for s in found}
    assert len(endpoints) == 2 * ENGINES, found
    for endpoint in endpoints:  # Unix sockets, each bound by its engine
        assert endpoint is not None and endpoint.startswith("ipc://")
        assert Path(endpoint.removeprefix("ipc://")).is_socket()


def test_a_prompt_prefilled_by_either_engine_is_pulled_from_its_own_listener(
    fleet: Fleet, reference: Any
) -> None:
    prompts = [make_prompt(fleet.model, 300 + 40 * rank, seed=900 + rank) for rank in range(2)]
    expected = reference(fleet.model, prompts, MAX_TOKENS, max_model_len=1024)
    for rank, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
        params = _prefill(fleet.prefill.url, prompt, rank)
        assert params["remote_ports"] == [fleet.transfer_port + rank]
        assert str(params["remote_engine_id"]).endswith(f"_dp{rank}")
        body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "return_token_ids": True, "ignore_eos": True,
                "kv_transfer_params": params}  # fmt: skip
        answer = post(fleet.decode.url, "/v1/completions", body)
        assert answer["choices"][0]["token_ids"] == want
        kv = answer["kv_transfer_params"]["kvtier"]
        assert kv["peer"] >= len(prompt) - 32 and kv["failed_tokens"] == 0, kv


def test_a_proxy_given_each_engine_sends_a_prompt_to_the_one_that_holds_its_prefix(
    fleet: Fleet, reference: Any
) -> None:
    """``kvtier proxy --engine URL#dp0 URL#dp1``: two documents spread over the two engines
    (none holds either: by load), then each document's follow-up goes to the engine that
    computed it, which finds its prefix in its own cache."""
    engines = [f"{fleet.prefill.url}#dp{rank}" for rank in range(ENGINES)]
    port = free_port()
    command = [KVTIER, "proxy", "--engine", *engines, "--port", str(port),
               "--health-interval-s", "0.5", "--health-timeout-s", str(WAIT_S)]  # fmt: skip
    proxy = launch(command, port, fleet.work / "proxy.log")
    try:
        wait(lambda: index_modes(proxy) == ["exact"] * ENGINES, WAIT_S, "an exact index")
        documents = [make_prompt(fleet.model, 300, seed=950 + d) for d in range(2)]
        with httpx.Client(base_url=proxy.url, timeout=WAIT_S, trust_env=False) as client:
            placed = [_ask(client, doc).engine for doc in documents]
            assert sorted(placed) == engines  # spread: one each
            more = [doc + make_prompt(fleet.model, 20, seed=960 + d, bos=False)
                    for d, doc in enumerate(documents)]  # fmt: skip
            again = [_ask(client, prompt) for prompt in more]
        assert [a.engine for a in again] == placed
        assert all(a.reason == "prefix" and a.predicted == 288 for a in again), again
        assert all(len(a.prompt) - a.computed >= 288 for a in again), again  # it held them
        assert [a.tokens for a in again] == reference(fleet.model, more, MAX_TOKENS,
                                                      max_model_len=1024)  # fmt: skip
    finally:
        stop(proxy)


def _ask(client: httpx.Client, prompt: list[int]) -> Answer:
    return ask(client, "tiny", {"prompt": prompt}, 0, 0, MAX_TOKENS)[0]


def _prefill(url: str, prompt: list[int], rank: int) -> dict[str, Any]:
    """``prompt`` prefilled by the server's engine ``rank`` (vLLM's ``X-data-parallel-rank``)."""
    asks = {"do_remote_decode": True, "do_remote_prefill": False}
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "kv_transfer_params": asks}  # fmt: skip
    headers = {"Content-Type": "application/json", "X-data-parallel-rank": str(rank)}
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        params: dict[str, Any] = json.loads(response.read())["kv_transfer_params"]
    return params
