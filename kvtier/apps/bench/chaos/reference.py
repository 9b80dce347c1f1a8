"""The answers a chaos run's fleet must have given: one engine without kvtier, asked afresh.

    reference_answers(model, prompts, max_tokens, logs, in_flight) -> {prompt: tokens}
    compare(records, asks, reference) -> dict   identical / different counts, the first ids
                                                that differ

The engine is vLLM's own server with no KV connector (``servers.alone_command``), the fleet's
model and vLLM arguments, started after the fleet has stopped. Each distinct prompt is asked once,
whole, greedy, ``in_flight`` at a time. Answers are compared token for token (their text when
an answer said no token ids).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from kvtier.apps.bench.chaos.client import PATH, Record, body
from kvtier.apps.bench.chaos.cluster import MAX_MODEL_LEN
from kvtier.apps.bench.chaos.workload import Ask
from kvtier.apps.bench.common.servers import (
    WAIT_S,
    WORKER_IN_CORE,
    alone_command,
    launch,
    serve_command,
    stop,
    wait_healthy,
)
from kvtier.apps.ports import free_port

Prompt = tuple[int, ...]
Answer = tuple[list[int], str]  # token ids, text
SHOWN = 10  # ids of differing answers kept in the document


def reference_answers(
    model: Path, prompts: Iterable[Prompt], max_tokens: int, logs: Path, in_flight: int = 4
) -> dict[Prompt, Answer]:
    port = free_port()
    command = alone_command(serve_command(model, port, {}, (), "float32", MAX_MODEL_LEN))
    server = launch(command, port, logs / "reference.log", WORKER_IN_CORE)
    try:
        wait_healthy(server)
        with (
            httpx.Client(base_url=server.url, timeout=WAIT_S, trust_env=False) as client,
            ThreadPoolExecutor(in_flight) as pool,
        ):
            distinct = list(dict.fromkeys(prompts))
            answers = pool.map(lambda p: _ask(client, p, max_tokens), distinct)
            return dict(zip(distinct, answers, strict=True))
    finally:
        stop(server)


def _ask(client: httpx.Client, prompt: Prompt, max_tokens: int) -> Answer:
    response = client.post(PATH, json=body(list(prompt), max_tokens, stream=False))
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return list(choice.get("token_ids") or []), str(choice.get("text") or "")


def compare(
    records: Iterable[Record], asks: Mapping[int, Ask], reference: Mapping[Prompt, Answer]
) -> dict[str, Any]:
    """Every answered request against the reference's answer to its prompt."""
    identical, different = 0, []
    for record in records:
        if not record.ok:
            continue
        tokens, text = reference[tuple(asks[record.id].prompt)]
        same = record.tokens == tokens if record.tokens and tokens else record.text == text
        if same:
            identical += 1
        else:
            different.append(record.id)
    return {"compared": identical + len(different), "identical": identical,
            "different": len(different), "different_ids": different[:SHOWN]}  # fmt: skip
