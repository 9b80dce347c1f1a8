"""``kvtier serve``: vLLM's OpenAI server with kvtier (host and disk tiers), read over HTTP only.

One server for the module (a real process, as a user starts it: ~30 s): kvtier's series on
``/metrics`` move after kvtier hits, vLLM counts the hits under ``source="host"`` and
``source="disk"``, a completion's ``kv_transfer_params`` names the tokens each tier served, and
kvtier's lines and its stats line reach the server's log.

A host hit: send a prompt, wait for its stores, empty the engine's own prefix cache
(``POST /reset_prefix_cache``, a dev endpoint), send it again. A disk hit: also wait for the
chunks to reach the disk (the idle engine writes them), and reset with ``reset_external=true``,
which empties kvtier's host tier too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from kvtier.models import make_prompt

pytestmark = pytest.mark.engine

PROMPT = 450  # tokens: 14 chunks of 32 (448) loadable; the last token is computed
START_S = 600.0  # a shared 2-core machine: ~30 s when quiet
WAIT_S = 120.0


class Server(NamedTuple):
    url: str
    log: Path
    model: Path


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("serve")
    template = work / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    port = _free_port()
    extra = {"cpu_bytes_to_use": "64MiB", "disk": {"path": str(work / "tier"), "bytes": "64MiB"}}
    command = [
        str(Path(sys.executable).with_name("kvtier")), "serve", str(tiny_model),
        "--kvtier", json.dumps(extra), "--port", str(port), "--served-model-name", "tiny",
        "--dtype", "float32", "--max-model-len", "1024", "--block-size", "32", "--seed", "0",
        "--enforce-eager", "--gpu-memory-utilization", "0.3", "--chat-template", str(template),
    ]  # fmt: skip
    env = os.environ | {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",  # the server's own processes (conftest: "0")
        "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
        "VLLM_LOG_STATS_INTERVAL": "1",  # the stats line every second while busy
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "INFO",
        "NO_COLOR": "1",
    }
    log = work / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _healthy(url, process, log), START_S, "the server to answer /health")
        yield Server(url, log, tiny_model)
    finally:
        _stop(process)


def test_a_host_hit_is_counted_and_named(server: Server) -> None:
    prompt = make_prompt(server.model, PROMPT, seed=101)
    first = _complete(server, prompt)
    assert first == {"prompt_tokens": PROMPT, "engine_cached_tokens": 0, "cpu": 0, "disk": 0,
                     "failed_tokens": 0, "computed": PROMPT, "load_ms": 0.0}  # fmt: skip
    _wait(lambda: _sample(server, "vllm:kvtier_stored_chunks_total", tier="cpu") >= 14, WAIT_S,
          "the prompt's chunks stored in host memory")  # fmt: skip
    before = _sample(server, "vllm:prompt_tokens_cached_by_source_total", source="host")
    _reset(server, external=False)  # the engine's cache only
    again = _complete(server, prompt)
    assert again["cpu"] >= 448 and again["disk"] == 0  # 14 chunks (and maybe the prompt's tail)
    assert again["computed"] == PROMPT - again["cpu"] >= 1
    assert again["load_ms"] > 0
    _wait(lambda: _sample(server, "vllm:kvtier_loaded_tokens_total", tier="cpu") >= 448, WAIT_S,
          "kvtier's loaded tokens on /metrics")  # fmt: skip
    assert _sample(server, "vllm:kvtier_hit_chunks_total", tier="cpu") >= 14
    assert _sample(server, "vllm:kvtier_loaded_bytes_total", tier="cpu") > 0
    assert _sample(server, "vllm:kvtier_load_seconds_count", tier="cpu") >= 1
    assert _sample(server, "vllm:kvtier_used_bytes", tier="cpu") > 0
    hosted = _sample(server, "vllm:prompt_tokens_cached_by_source_total", source="host")
    assert hosted - before == again["cpu"]


def test_a_disk_hit_after_a_connector_reset_is_counted_and_named(server: Server) -> None:
    prompt = make_prompt(server.model, 448, seed=102)  # 14 whole chunks: no tail (host-only)
    before = {tier: _sample(server, "vllm:kvtier_stored_chunks_total", tier=tier)
              for tier in ("cpu", "disk")}  # fmt: skip
    assert _complete(server, prompt)["computed"] == 448

    def all_on_disk() -> bool:
        stored = {tier: _sample(server, "vllm:kvtier_stored_chunks_total", tier=tier) - was
                  for tier, was in before.items()}  # fmt: skip
        return stored["cpu"] >= 14 and stored["disk"] >= stored["cpu"]

    _wait(all_on_disk, WAIT_S, "the prompt's chunks written to disk")
    cached = _sample(server, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    # reaches kvtier's reset_cache: the host tier is emptied, the disk tier kept
    _reset(server, external=True)
    again = _complete(server, prompt)
    assert again["cpu"] == 0 and again["disk"] >= 447  # the last token is computed
    assert again["computed"] == 448 - again["disk"]
    _wait(lambda: _sample(server, "vllm:kvtier_loaded_tokens_total", tier="disk") >= 448, WAIT_S,
          "kvtier's disk loads on /metrics")  # fmt: skip
    assert _sample(server, "vllm:kvtier_load_seconds_count", tier="disk") >= 1
    on_disk = _sample(server, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    assert on_disk - cached == again["disk"]


def test_chat_completions_carry_the_provenance_too(server: Server) -> None:
    message = {"role": "user", "content": "where did my prompt's KV come from?"}
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0.0, "messages": [message]}
    found = _post(server, "/v1/chat/completions", body)["kv_transfer_params"]["kvtier"]
    counted = found["engine_cached_tokens"] + found["cpu"] + found["disk"] + found["computed"]
    assert counted == found["prompt_tokens"] > 0


def test_kvtier_lines_and_the_stats_line_reach_the_server_log(server: Server) -> None:
    _complete(server, make_prompt(server.model, 100, seed=103))  # traffic in this interval
    _reset(server, external=True)
    lines = re.compile(r"KV Transfer metrics: .*cpu_")

    def logged() -> bool:
        return bool(lines.search(server.log.read_text(errors="replace")))

    _wait(logged, WAIT_S, "vLLM's 'KV Transfer metrics' line with kvtier's fields")
    text = server.log.read_text(errors="replace")
    assert re.search(r"\(EngineCore.*INFO .*kvtier: host tier of \d+ chunks", text)
    assert "kvtier: reset dropped" in text
    assert "does not implement the `build_kv_connector_stats`" not in text


# ---- HTTP ---------------------------------------------------------------------------------


def _complete(server: Server, prompt: list[int]) -> dict[str, Any]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0.0}
    params = _post(server, "/v1/completions", body)["kv_transfer_params"]
    found: dict[str, Any] = params["kvtier"]
    return found


def _reset(server: Server, external: bool) -> None:
    """Empty the engine's prefix cache (``external``: kvtier's host tier too), once the blocks of
    finished requests are free (they wait for their stores: the reset fails until then)."""
    path = "/reset_prefix_cache" + ("?reset_external=true" if external else "")
    _wait(lambda: bool(_post(server, path)["success"]), WAIT_S, f"POST {path} to succeed")


def _post(server: Server, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(server.url + path, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return json.loads(response.read())


def _sample(server: Server, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples on /metrics whose labels include ``labels``."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"([^{\s]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match[1] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match[3])
    return total


def _healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        tail = log.read_text(errors="replace")[-6000:]
        raise AssertionError(f"kvtier serve exited with {process.returncode}:\n{tail}")
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)  # a poll interval: the condition is checked again


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (vLLM's engine processes too), then SIGKILL."""
    for sig, timeout in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)  # the group the server leads (start_new_session)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue
