"""``kvtier serve``: vLLM's OpenAI server with kvtier (host and disk tiers), read over HTTP only.

One server for the module (a real process, as a user starts it: ~30 s): kvtier's series on
``/metrics`` move after kvtier hits, vLLM counts the hits under ``source="host"`` and
``source="disk"``, a completion's ``kv_transfer_params`` names the tokens each tier served, and
kvtier's lines and its stats line reach the server's log. Stopped, it leaves no socket behind.

A host hit: send a prompt, wait for its stores, empty the engine's own prefix cache
(``POST /reset_prefix_cache``, a dev endpoint), send it again. A disk hit: also wait for the
chunks to reach the disk (the idle engine writes them), and reset with ``reset_external=true``,
which empties kvtier's host tier too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from harness import SERVED_BLOCKS, prompts

from kvtier.apps.bench.common.servers import (
    WAIT_S,
    launch,
    post,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.apps.bench.common.servers import Server as Running
from kvtier.apps.ports import free_port
from kvtier.apps.prompts import make_prompt
from kvtier.apps.proxy.event_sources import sources

pytestmark = pytest.mark.engine

PROMPT = 450  # tokens: 14 chunks of 32 (448) loadable; the last token is computed


VLLM_SOCKET = re.compile(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")  # vLLM's: a uuid4


class Server(NamedTuple):
    url: str
    log: Path
    model: Path
    running: Running
    temp: Path  # its TMPDIR


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("serve")
    temp = Path(tempfile.mkdtemp(prefix="kt-"))  # short: a socket's path holds 107 bytes
    template = work / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    port = free_port()
    disk = {"path": str(work / "tier"), "bytes": "64MiB"}  # a reset keeps it (and the others')
    extra = {"cpu_bytes_to_use": "64MiB", "disk": disk, "reset_keeps_tiers": True}
    command = serve_command(
        tiny_model, port, extra, ["--chat-template", str(template), *SERVED_BLOCKS]
    )
    running = launch(command, port, work / "server.log", {"TMPDIR": str(temp)})
    try:
        wait_healthy(running)
        yield Server(running.url, running.log, tiny_model, running, temp)
    finally:
        stop(running)
        shutil.rmtree(temp)


def test_the_default_multiprocess_engine_computes_as_one_process_does(
    server: Server, reference: Any
) -> None:
    """vLLM's default mode, as ``kvtier serve`` runs it: the scheduler half in the engine-core
    process, the worker half in its worker process, both importing kvtier.vllm from the installed
    package. Outputs equal the in-process engine's (one rank computes as it does), computed, then
    loaded from kvtier's host tier."""
    token_prompts = prompts(server.model, [300, 200, 450], seed=61)
    expected = reference(server.model, token_prompts)
    assert [_generate(server, prompt)[0] for prompt in token_prompts] == expected
    _reset(server, external=False)  # the engine's cache only: the second pass loads from kvtier
    again = [_generate(server, prompt) for prompt in token_prompts]
    assert [tokens for tokens, _ in again] == expected
    for prompt, (_, found) in zip(token_prompts, again, strict=True):
        assert found["cpu"] >= len(prompt) // 32 * 32 - 32 and found["failed_tokens"] == 0, found


def test_a_host_hit_is_counted_and_named(server: Server) -> None:
    prompt = make_prompt(server.model, PROMPT, seed=101)
    first = _complete(server, prompt)
    assert first == {"prompt_tokens": PROMPT, "engine_cached_tokens": 0, "cpu": 0, "disk": 0,
                     "failed_tokens": 0, "computed": PROMPT, "load_ms": 0.0}  # fmt: skip
    wait(lambda: sample(server.url, "vllm:kvtier_stored_chunks_total", tier="cpu") >= 14, WAIT_S,
          "the prompt's chunks stored in host memory")  # fmt: skip
    before = sample(server.url, "vllm:prompt_tokens_cached_by_source_total", source="host")
    _reset(server, external=False)  # the engine's cache only
    again = _complete(server, prompt)
    assert again["cpu"] >= 448 and again["disk"] == 0  # 14 chunks (and maybe the prompt's tail)
    assert again["computed"] == PROMPT - again["cpu"] >= 1
    assert again["load_ms"] > 0
    wait(lambda: sample(server.url, "vllm:kvtier_loaded_tokens_total", tier="cpu") >= 448, WAIT_S,
          "kvtier's loaded tokens on /metrics")  # fmt: skip
    assert sample(server.url, "vllm:kvtier_hit_chunks_total", tier="cpu") >= 14
    assert sample(server.url, "vllm:kvtier_loaded_bytes_total", tier="cpu") > 0
    assert sample(server.url, "vllm:kvtier_load_seconds_count", tier="cpu") >= 1
    assert sample(server.url, "vllm:kvtier_used_bytes", tier="cpu") > 0
    hosted = sample(server.url, "vllm:prompt_tokens_cached_by_source_total", source="host")
    assert hosted - before == again["cpu"]


def test_a_disk_hit_after_a_connector_reset_is_counted_and_named(server: Server) -> None:
    prompt = make_prompt(server.model, 448, seed=102)  # 14 whole chunks: no tail (host-only)
    before = {tier: sample(server.url, "vllm:kvtier_stored_chunks_total", tier=tier)
              for tier in ("cpu", "disk")}  # fmt: skip
    assert _complete(server, prompt)["computed"] == 448

    def all_on_disk() -> bool:
        stored = {tier: sample(server.url, "vllm:kvtier_stored_chunks_total", tier=tier) - was
                  for tier, was in before.items()}  # fmt: skip
        return stored["cpu"] >= 14 and stored["disk"] >= stored["cpu"]

    wait(all_on_disk, WAIT_S, "the prompt's chunks written to disk")
    cached = sample(server.url, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    # reaches kvtier's reset_cache: the host tier is emptied, the disk tier kept
    _reset(server, external=True)
    again = _complete(server, prompt)
    assert again["cpu"] == 0 and again["disk"] >= 447  # the last token is computed
    assert again["computed"] == 448 - again["disk"]
    wait(lambda: sample(server.url, "vllm:kvtier_loaded_tokens_total", tier="disk") >= 448, WAIT_S,
          "kvtier's disk loads on /metrics")  # fmt: skip
    assert sample(server.url, "vllm:kvtier_load_seconds_count", tier="disk") >= 1
    on_disk = sample(server.url, "vllm:prompt_tokens_cached_by_source_total", source="disk")
    assert on_disk - cached == again["disk"]


def test_chat_completions_carry_the_provenance_too(server: Server) -> None:
    message = {"role": "user", "content": "where did my prompt's KV come from?"}
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0.0, "messages": [message]}
    found = post(server.url, "/v1/chat/completions", body)["kv_transfer_params"]["kvtier"]
    counted = found["engine_cached_tokens"] + found["cpu"] + found["disk"] + found["computed"]
    assert counted == found["prompt_tokens"] > 0


def test_kvtier_lines_and_the_stats_line_reach_the_server_log(server: Server) -> None:
    _complete(server, make_prompt(server.model, 100, seed=103))  # traffic in this interval
    _reset(server, external=True)
    lines = re.compile(r"KV Transfer metrics: .*cpu_")

    def logged() -> bool:
        return bool(lines.search(server.log.read_text(errors="replace")))

    wait(logged, WAIT_S, "vLLM's 'KV Transfer metrics' line with kvtier's fields")
    text = server.log.read_text(errors="replace")
    assert re.search(r"\(EngineCore.*INFO .*kvtier: host tier of \d+ chunks", text)
    assert "kvtier: reset dropped" in text
    assert "does not implement the `build_kv_connector_stats`" not in text


def test_a_stopped_server_leaves_no_socket_behind(server: Server) -> None:
    """The last of the server's tests: it stops the server. Running, its Unix sockets (vLLM's,
    named by uuid, and kvtier's KV-event pair) are in a directory of their own in its TMPDIR;
    stopped as a user stops it (SIGTERM), it leaves none there (it left nine per start)."""
    (events,) = sources(server.url, WAIT_S)
    directory = Path(events.endpoint.removeprefix("ipc://")).parent
    assert directory.parent == server.temp, events
    named = {path.name for path in directory.iterdir() if path.is_socket()}
    assert {"inproc-kv-events", "inproc-kv-events-replay"} <= named, named
    assert any(VLLM_SOCKET.fullmatch(name) for name in named), named
    stop(server.running)
    assert server.running.process.returncode == 0, server.log.read_text()[-3000:]
    left = [path for path in server.temp.rglob("*") if path.is_socket() or path == directory]
    assert left == []


# ---- HTTP ---------------------------------------------------------------------------------


def _generate(server: Server, prompt: list[int]) -> tuple[list[int], dict[str, Any]]:
    """Eight greedy tokens, and where the prompt's KV came from."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    answer = post(server.url, "/v1/completions", body)
    return list(answer["choices"][0]["token_ids"]), answer["kv_transfer_params"]["kvtier"]


def _complete(server: Server, prompt: list[int]) -> dict[str, Any]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0.0}
    params = post(server.url, "/v1/completions", body)["kv_transfer_params"]
    found: dict[str, Any] = params["kvtier"]
    return found


def _reset(server: Server, external: bool) -> None:
    """Empty the engine's prefix cache (``external``: kvtier's host tier too), once the blocks of
    finished requests are free (they wait for their stores: the reset fails until then)."""
    path = "/reset_prefix_cache" + ("?reset_external=true" if external else "")
    wait(lambda: bool(post(server.url, path)["success"]), WAIT_S, f"POST {path} to succeed")


# `kvtier serve MODEL --help` in a fresh interpreter, counting whole-heap collections (explicit or
# the collector's own) until vLLM has printed its help
_COUNTED_HELP = """
import gc, sys
whole = []
gc.callbacks.append(lambda phase, info: whole.append(phase) if phase == "start"
                    and info["generation"] == 2 else None)
from kvtier.apps.cli import main
try:
    main(["serve", sys.argv[1], "--help"])
except SystemExit:
    pass
print(f"whole-heap collections: {len(whole)}", file=sys.stderr)
"""


def test_vllms_import_in_kvtier_serve_scans_the_heap_once(tiny_model: Path) -> None:
    """vLLM's import makes ~700k objects; inside ``frozen_imports`` the heap is scanned once on
    the way to vLLM's help, where the collector's own passes scanned it nine times."""
    done = subprocess.run([sys.executable, "-c", _COUNTED_HELP, str(tiny_model)],
                          capture_output=True, text=True, timeout=WAIT_S)  # fmt: skip
    found = re.search(r"whole-heap collections: (\d+)", done.stderr)
    assert found is not None and "usage: vllm serve" in done.stdout, done.stderr[-3000:]
    assert int(found.group(1)) <= 2, found.group(0)
