"""``kvtier proxy --engine``: two ``kvtier serve`` engines behind one proxy, a multi-round chat
(12 users, a shared system prompt, histories growing over 6 rounds, 2 in flight), in tokens
(``bench/fleet_chat.py``: the random model's answers do not tokenize back). With ``kv-aware``
the fleet computes far fewer prompt tokens than with ``round-robin`` (vLLM's
``prompt_tokens_by_source``; the issue's goal is half: measured about 0.59 here, README),
neither engine serves twice the other's requests, and the outputs equal a single engine's
without kvtier.

Each engine has a core of its own (``taskset``, and vLLM's OpenMP threads bound to it), as
engines on machines of their own: on two shared cores one engine's steps starve the other's and
a router rightly sends the busy one less."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from kvtier.apps.bench.fleet_chat import Answer, chat_workload
from kvtier.apps.bench.servers import (
    KVTIER,
    WAIT_S,
    Server,
    free_port,
    launch,
    post,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)

pytestmark = pytest.mark.engine

TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
ANSWER = 48  # tokens per answer: a history grows by an answer and a short question per round


class Fleet(NamedTuple):
    engines: list[Server]
    work: Path
    model: Path


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    (work / "chat.jinja").write_text(TEMPLATE)
    engines = []
    try:
        for core, name in enumerate(("a", "b")):
            port = free_port()
            # a host tier smaller than the workload: 64 chunks of 32 tokens
            args = ["--chat-template", str(work / "chat.jinja")]
            extra = {"cpu_bytes_to_use": "2MiB"}
            command = serve_command(tiny_model, port, extra, args, max_model_len=2048)
            pinned = ["taskset", "-c", str(core), *command]
            bound = {"VLLM_CPU_OMP_THREADS_BIND": str(core)}
            engines.append(launch(pinned, port, work / f"{name}.log", bound))
        wait_healthy(*engines)
        yield Fleet(engines, work, tiny_model)
    finally:
        for engine in engines:
            stop(engine)


def _computed(fleet: Fleet) -> float:
    return sum(sample(e.url, "vllm:prompt_tokens_by_source_total", source="local_compute")
               for e in fleet.engines)  # fmt: skip


def _exact(proxy: Server, engine: Server) -> bool:
    """The proxy's index of ``engine`` is exact (its /health says, beside each engine's)."""
    with urllib.request.urlopen(proxy.url + "/health", timeout=WAIT_S) as answer:
        return bool(json.loads(answer.read())["index"][engine.url] == "exact")


def _run(fleet: Fleet, policy: str) -> tuple[list[Answer], float]:
    """The workload through a proxy of ``policy``, on engines whose caches were emptied: its
    answers, and the prompt tokens the fleet computed."""
    reset = "/reset_prefix_cache?reset_external=true"
    for engine in fleet.engines:
        wait(lambda e=engine: bool(post(e.url, reset)["success"]), WAIT_S, "the caches emptied")
    port = free_port()
    command = [KVTIER, "proxy", "--engine", *(e.url for e in fleet.engines), "--policy", policy,
               "--port", str(port), "--health-interval-s", "0.5"]  # fmt: skip
    proxy = launch(command, port, fleet.work / f"proxy-{policy}.log")
    try:
        wait_healthy(proxy)
        if policy == "kv-aware":  # both engines' events followed before the first request
            wait(lambda: all(_exact(proxy, e) for e in fleet.engines), WAIT_S,
                 "the proxy following both engines")  # fmt: skip
        before = _computed(fleet)
        with ThreadPoolExecutor(2) as pool:  # 2 in flight
            answers = chat_workload(proxy.url, users=12, rounds=6, pool=pool,
                                    answer_tokens=ANSWER, tokens=fleet.model)  # fmt: skip
        return answers, _computed(fleet) - before
    finally:
        stop(proxy)


def test_kv_aware_routing_computes_far_fewer_prompt_tokens_than_round_robin(
    fleet: Fleet, reference: Any
) -> None:
    spread, spread_computed = _run(fleet, "round-robin")
    aware, aware_computed = _run(fleet, "kv-aware")
    assert [a.tokens for a in aware] == [a.tokens for a in spread]  # the same conversations
    assert aware_computed <= 0.7 * spread_computed, (aware_computed, spread_computed)
    served = [sum(a.engine == e.url for a in aware) for e in fleet.engines]
    assert max(served) <= 2 * min(served), served
    prompts = [a.prompt for a in aware]
    assert reference(fleet.model, prompts, ANSWER) == [a.tokens for a in aware]
    assert sum(a.predicted for a in aware) > 0
