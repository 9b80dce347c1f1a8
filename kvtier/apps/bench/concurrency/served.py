"""``kvtier bench concurrency``, long miss: never-seen long documents through ``kvtier serve``
against vLLM's server without a connector (LMCache's long-doc-qa warm-up round).

Two servers alive together, the same model and vLLM arguments (``common.servers.serve_command``):
``kvtier serve`` with a host tier only, and vLLM's own server with no connector
(``vllm_alone``), their workers on as many cores (``SAME_CORES``), each in its engine core
process, as a one-GPU server runs it (``WORKER_IN_CORE``). Each pair: ``documents``
fresh documents of ``tokens`` tokens (never seen by either server; the same ones for both), sent
to one server ``in_flight`` at a time (streamed, ``max_tokens`` each), then to the other, the
order alternating per pair, with a pause between so a server's busy-polling engine has gone
idle before the other one is timed. A pair's ratio is kvtier's mean TTFT over the server
alone's. The first pair is a warm-up (first-call costs of prompts this long), not counted.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvtier.apps.bench.common.servers import (
    WAIT_S,
    WORKER_IN_CORE,
    Server,
    alone_command,
    launch,
    sample,
    serve_command,
    stop,
    wait_healthy,
)
from kvtier.apps.ports import free_port
from kvtier.apps.prompts import make_prompt

CONFIGS = ("kvtier", "alone")
IDLE_S = 2.0  # a vLLM engine busy-polls for ~1 s after its last step
LOG_LINES = 30  # of a server's log, told when a document sent to it fails
# vLLM on the CPU keeps cores off its worker's OpenMP threads for its other processes: one per
# rank, and one more per rank when a KV connector is configured (meant for NIXL). Both servers
# keep vLLM's default without a connector, so that both compute on as many cores.
SAME_CORES = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
SERVER_ENV = SAME_CORES | WORKER_IN_CORE  # both servers'


@dataclass(frozen=True)
class LongMiss:
    """The workload of the long-miss part (defaults: the full run)."""

    documents: int = 8
    tokens: int = 3000
    in_flight: int = 2
    max_tokens: int = 32
    pairs: int = 6
    host_bytes: str = "4GiB"  # kvtier's host tier
    max_model_len: int = 4096

    def __post_init__(self) -> None:
        if self.tokens + self.max_tokens > self.max_model_len or self.pairs < 1:
            raise ValueError(f"kvtier bench concurrency: documents must fit, pairs >= 1: {self}")


# kvtier serve publishes KV events unless told otherwise, vLLM alone does not: neither does here
NO_EVENTS = ("--kv-events-config", '{"enable_kv_cache_events": false}')


@contextmanager
def started(model: Path, dtype: str, work: LongMiss, logs: Path) -> Iterator[dict[str, Server]]:
    """Both servers, healthy; stopped on exit."""
    servers: dict[str, Server] = {}
    try:
        for config in CONFIGS:
            port = free_port()
            command = serve_command(model, port, {"cpu_bytes_to_use": work.host_bytes}, NO_EVENTS,
                                    dtype, work.max_model_len)  # fmt: skip
            if config == "alone":  # the same vLLM arguments, without kvtier's
                command = alone_command(command)
            servers[config] = launch(command, port, logs / f"{config}.log", SERVER_ENV)
        wait_healthy(*servers.values())
        yield servers
    finally:
        for server in servers.values():
            stop(server)


def measure_served(model: Path, dtype: str, work: LongMiss) -> dict[str, Any]:
    """Each pair's TTFTs and ratio (the JSON's ``long_miss``)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    ttfts: dict[str, list[list[float]]] = {config: [] for config in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-concurrency-") as logs:
        with started(model, dtype, work, Path(logs)) as servers:
            before = _counters(servers["kvtier"])
            for pair in tqdm(range(work.pairs + 1), desc="bench concurrency: long miss",
                             unit="pair"):  # fmt: skip
                documents = [make_prompt(tokenizer, work.tokens, seed=_seed(pair, d))
                             for d in range(work.documents)]  # fmt: skip
                order = CONFIGS if pair % 2 == 0 else CONFIGS[::-1]
                for config in order:
                    time.sleep(IDLE_S)
                    found = _round(servers[config], documents, work)
                    if pair:  # pair 0: the warm-up
                        ttfts[config].append(found)
            after = _counters(servers["kvtier"])
    return summarize(ttfts, work, {key: after[key] - before[key] for key in after})


def _seed(pair: int, document: int) -> int:
    return 9_000_017 + pair * 1_009 + document


def _round(server: Server, documents: list[list[int]], work: LongMiss) -> list[float]:
    """Every document's TTFT, ``in_flight`` requests at a time (a new one as one finishes); a
    request that fails or times out raises with the end of the server's log (which goes with
    the run's temporary directory)."""
    try:
        with ThreadPoolExecutor(work.in_flight) as pool:
            return list(pool.map(lambda doc: first_token_s(server.url, doc, work.max_tokens),
                                 documents))  # fmt: skip
    except (OSError, RuntimeError) as error:  # TimeoutError and URLError are OSErrors
        tail = "\n".join(server.log.read_text(errors="replace").splitlines()[-LOG_LINES:])
        raise RuntimeError(
            f"kvtier bench concurrency: a document sent to {server.url} failed ({error!r}); "
            f"the end of {server.log.name}:\n{tail}"
        ) from error


def first_token_s(url: str, prompt: list[int], max_tokens: int) -> float:
    """Seconds from sending a streamed completion to its first token; reads it to the end."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    started, first = time.perf_counter(), None
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        for line in response:
            text = line.decode().strip()
            if first is None and text.startswith("data: ") and text != "data: [DONE]":
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"kvtier bench concurrency: no token streamed from {url}")
    return first


def _counters(server: Server) -> dict[str, float]:
    """kvtier's host-tier counters on the server's /metrics: it stored, it found nothing."""
    return {
        name: sample(server.url, f"vllm:kvtier_{name}_total", tier="cpu")
        for name in ("stored_chunks", "hit_chunks")
    }


def summarize(
    ttfts: dict[str, list[list[float]]], work: LongMiss, counters: dict[str, float]
) -> dict[str, Any]:
    """Each pair's mean TTFT per server and the ratios kvtier / alone, from ``ttfts`` (per
    server, per pair, per document)."""
    means = {config: [sum(r) / len(r) for r in rounds] for config, rounds in ttfts.items()}
    ratios = [k / a for k, a in zip(means["kvtier"], means["alone"], strict=True)]
    return {
        **asdict(work),
        "ttft_s": {c: [[round(s, 4) for s in r] for r in rounds] for c, rounds in ttfts.items()},
        "mean_ttft_s": {c: [round(m, 4) for m in values] for c, values in means.items()},
        "ratios": [round(r, 4) for r in ratios],
        "kvtier_cpu": {name: int(value) for name, value in counters.items()},
    }
