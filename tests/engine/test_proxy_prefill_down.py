"""``kvtier proxy`` degrades when its prefill engine dies: the decode engine computes the prompts.

Real processes (one prefill ``kvtier serve``, one decode ``kvtier serve``, ``kvtier proxy``) on
ephemeral ports. The prefill engine is stopped: every request after that is answered by the
decode engine alone, within the proxy's timeout, and says so (``x-kvtier-prefill``, the proxy's
``/metrics``). It is started again on its port: once the proxy's /health watch has seen it up,
a request's prompt is prefilled there and pulled by the decode engine again.

Its own pair of engines (test_pd's pair must outlive its tests; this one kills its prefill).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvtier.bench.servers import (
    KVTIER,
    WAIT_S,
    Server,
    free_port,
    launch,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.models import make_prompt

pytestmark = pytest.mark.engine

SECRET = "degrade-test-secret-of-32-bytes!"
MAX_TOKENS = 8
REQUESTS = 20  # after the prefill engine is gone
TIMEOUT_S = 60.0  # the proxy's --timeout-s: a bound on every request
HEALTH_S = 0.5  # the proxy's --health-interval-s
UP = "kvtier_proxy_engine_up"
DEGRADED = "kvtier_proxy_degraded_requests_total"


def test_a_killed_prefill_engine_degrades_to_the_decode_engine_and_transfers_resume(
    tiny_model: Path, tmp_path: Path
) -> None:
    ports = {role: free_port() for role in ("kv_producer", "kv_consumer", "proxy")}
    commands = {
        role: [*serve_command(tiny_model, ports[role], {"cpu_bytes_to_use": "64MiB"}),
               "--kv-role", role]
        for role in ("kv_producer", "kv_consumer")
    }  # fmt: skip
    env = {"KVTIER_TRANSFER_SECRET": SECRET}
    servers: list[Server] = []
    try:
        for role, command in commands.items():
            servers.append(launch(command, ports[role], tmp_path / f"{role}.log", env))
        prefill, decode = servers
        proxy_command = [KVTIER, "proxy", "--prefill", prefill.url, "--decode", decode.url,
                         "--port", str(ports["proxy"]), "--timeout-s", str(TIMEOUT_S),
                         "--health-interval-s", str(HEALTH_S)]  # fmt: skip
        proxy = launch(proxy_command, ports["proxy"], tmp_path / "proxy.log")
        servers.append(proxy)
        wait_healthy(prefill, decode, proxy)
        _wait_prefill_up(proxy)
        _assert_transferred(proxy.url, make_prompt(tiny_model, 300, seed=701))

        stop(prefill)
        for i in range(REQUESTS):
            prompt = make_prompt(tiny_model, 100 + 10 * i, seed=710 + i)
            started = time.monotonic()
            prefilled, tokens, kv = _complete(proxy.url, prompt, stream=i % 2 == 1)
            assert time.monotonic() - started < TIMEOUT_S
            assert prefilled in ("skipped", "failed"), (i, prefilled)
            assert len(tokens) == MAX_TOKENS
            if i % 2 == 0:  # not streamed: the decode engine says where the prompt came from
                assert kv is not None and kv.get("peer", 0) == 0, kv
        degraded = [sample(proxy.url, DEGRADED, reason=r) for r in ("no_prefill", "prefill_failed")]
        assert sum(degraded) == REQUESTS and degraded[0] > 0, degraded

        # started again only now: booting meanwhile, it could have prefilled some of the 20
        servers[0] = prefill = launch(commands["kv_producer"], ports["kv_producer"],
                                      tmp_path / "kv_producer-again.log", env)  # fmt: skip
        wait_healthy(prefill)
        _wait_prefill_up(proxy)
        _assert_transferred(proxy.url, make_prompt(tiny_model, 400, seed=702))
    finally:
        for server in reversed(servers):
            stop(server)


def _wait_prefill_up(proxy: Server) -> None:
    """Until the proxy's /health watch takes its one prefill engine for up (bounded)."""
    wait(lambda: sample(proxy.url, UP, side="prefill") == 1, WAIT_S,
         "the proxy to see the prefill engine up")  # fmt: skip


def _assert_transferred(url: str, prompt: list[int]) -> None:
    """A request through the proxy at ``url`` was prefilled, and its KV pulled by the decode."""
    prefilled, tokens, kv = _complete(url, prompt, stream=False)
    assert prefilled == "offered" and len(tokens) == MAX_TOKENS
    assert kv is not None and kv["peer"] > 0 and kv["failed_tokens"] == 0, kv


def _complete(
    url: str, prompt: list[int], stream: bool
) -> tuple[str | None, list[int], dict[str, Any] | None]:
    """``x-kvtier-prefill``, the tokens and (not streamed) the decode engine's kvtier params."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "return_token_ids": True, "ignore_eos": True, "stream": stream}  # fmt: skip
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S + 10) as response:
        prefilled = response.headers.get("x-kvtier-prefill")
        if not stream:
            answer = json.loads(response.read())
            kv = (answer.get("kv_transfer_params") or {}).get("kvtier")
            return prefilled, list(answer["choices"][0]["token_ids"]), kv
        tokens: list[int] = []
        for line in response:
            text = line.decode().strip()
            if text.startswith("data: ") and text != "data: [DONE]":
                tokens += json.loads(text[6:])["choices"][0].get("token_ids") or []
        return prefilled, tokens, None
