"""``kvtier bench fleet``, real: two ``kvtier serve`` engines behind ``kvtier proxy --engine``,
each routing policy in turn on a multi-round chat and a long-document QA.

    started_fleet(model, dtype, engine_blocks, host_chunks, logs) -> [Server]   (a context)
    run_policy(engines, policy, ask, logs, in_flight) -> Ran  one workload through one policy
    reset_caches(engines)                               each engine's caches emptied
    index_modes(proxy)                       -> [str]   the proxy's index mode of each engine
    measure_policies(work, workloads, policies, logs) -> {workload: {policy: [Ran]}}

Each engine has a core of its own (``taskset``, vLLM's OpenMP threads bound to it), as engines on
machines of their own (on two shared cores one engine's steps starve the other's). Both caches
are smaller than the workload: the engine's own (``engine_blocks`` blocks of 32 tokens: a GPU's
cache holds a fraction of a fleet's conversations) and kvtier's host tier (``host_chunks``
chunks). Before each policy the engines' caches are emptied (and one step taken, so that the
reset's events are published before the proxy replays them); the prompt tokens the fleet
computed are the engines' ``vllm:prompt_tokens_by_source_total{source="local_compute"}``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from tqdm import tqdm

from kvtier.apps.bench.common.servers import (
    KVTIER,
    WAIT_S,
    Server,
    launch,
    post,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.apps.models import model_path
from kvtier.apps.ports import free_port
from kvtier.apps.proxy.fleet_metrics import REASONS


@dataclass(frozen=True)
class RealWork:
    """The real part's workloads and fleet (defaults: the full run)."""

    model: str = "bench"
    dtype: str = "float32"  # outputs equal across policies (bfloat16's differ, loaded or not)
    repeats: int = 2
    engine_blocks: int = 160  # each engine's own cache, in blocks of 32 tokens
    host_chunks: int = 64  # each engine's host tier, in chunks of 32 tokens
    in_flight: int = 2
    users: int = 12
    rounds: int = 6
    answer_tokens: int = 32
    context_chars: int = 1200  # each user's own context (about 300 tokens)
    documents: int = 6
    document_tokens: int = 1500
    passes: int = 3
    question_tokens: int = 16

    def __post_init__(self) -> None:
        for key, value in asdict(self).items():
            if isinstance(value, int) and value < 1:
                raise ValueError(f"kvtier bench fleet: {key} must be >= 1, got {value}")


RESET = "/reset_prefix_cache?reset_external=true"  # the engine's cache and kvtier's
BLOCK_TOKENS = 32  # vLLM's block on the CPU, and kvtier's chunk here
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@dataclass(frozen=True)
class Ran:
    """One workload through one policy."""

    policy: str
    ttft_s: list[float]  # per request, in the order asked
    wall_s: float
    computed: int  # prompt tokens the fleet computed
    prompt_tokens: int
    served: list[int]  # requests per engine
    reasons: dict[str, int]  # the proxy's decisions by reason
    outputs: list[list[int]]  # each answer's token ids (equal across policies)


@contextmanager
def started_fleet(
    model: Path,
    dtype: str,
    engine_blocks: int,
    host_chunks: int,
    logs: Path,
    max_model_len: int = 4096,
    engines: int = 2,
    env: Mapping[str, str] | None = None,
) -> Iterator[list[Server]]:
    """``engines`` ``kvtier serve`` engines, each pinned to a core, healthy; stopped on exit
    (``env``: more of their environment, as ``launch``'s)."""
    (logs / "chat.jinja").write_text(TEMPLATE)
    host = f"{host_chunks * BLOCK_TOKENS * kv_bytes_per_token(model, dtype)}B"
    servers: list[Server] = []
    try:
        for core in range(engines):
            port = free_port()
            args = ["--chat-template", str(logs / "chat.jinja"), "--num-gpu-blocks-override",
                    str(engine_blocks)]  # fmt: skip
            command = serve_command(model, port, {"cpu_bytes_to_use": host}, args, dtype,
                                    max_model_len)  # fmt: skip
            pinned = ["taskset", "-c", str(core), *command]
            bound = {"VLLM_CPU_OMP_THREADS_BIND": str(core), **(env or {})}
            servers.append(launch(pinned, port, logs / f"engine-{core}.log", bound))
        wait_healthy(*servers)
        yield servers
    finally:
        for server in servers:
            stop(server)


def kv_bytes_per_token(model: Path, dtype: str) -> int:
    """The bytes one token's KV takes in every layer (keys and values), from ``config.json``."""
    config = json.loads((model / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads", heads)
    width = 4 if dtype == "float32" else 2
    return int(config["num_hidden_layers"] * 2 * kv_heads * head_dim * width)


Asked = tuple[list[float], list[list[int]], list[str], int]
# what a workload returns: TTFT per request, outputs, the engine of each, prompt tokens sent
Ask = Callable[[str, ThreadPoolExecutor], Asked]  # a workload: (the proxy's URL, a pool)


def measure_policies(
    work: RealWork, workloads: dict[str, Ask], policies: tuple[str, ...], logs: Path
) -> dict[str, dict[str, list[Ran]]]:
    """Every workload through every policy, ``work.repeats`` times on one fleet (the
    policies' order rotated per repeat)."""
    found: dict[str, dict[str, list[Ran]]] = {n: {p: [] for p in policies} for n in workloads}
    model = model_path(work.model)
    total = work.repeats * len(workloads) * len(policies)
    with (
        started_fleet(model, work.dtype, work.engine_blocks, work.host_chunks, logs) as engines,
        tqdm(total=total, desc="bench fleet: real", unit="run") as bar,
    ):
        for repeat in range(work.repeats):
            turn = repeat % len(policies)
            order = policies[turn:] + policies[:turn]
            for name, ask in workloads.items():
                for policy in order:
                    ran = run_policy(engines, policy, ask, logs, work.in_flight)
                    found[name][policy].append(ran)
                    bar.update()
    return found


def run_policy(
    engines: list[Server],
    policy: str,
    ask: Ask,
    logs: Path,
    in_flight: int,
    proxy_args: Sequence[str] = (),
) -> Ran:
    """``ask`` through a new proxy of ``policy`` (and ``proxy_args``), on engines whose caches
    were emptied."""
    reset_caches(engines)
    port = free_port()
    command = [KVTIER, "proxy", "--engine", *(e.url for e in engines), "--policy", policy,
               "--port", str(port), "--health-interval-s", "0.5", *proxy_args]  # fmt: skip
    proxy = launch(command, port, logs / f"proxy-{policy}.log")
    try:
        wait_healthy(proxy)
        if policy == "kv-aware":  # every engine's events followed before the first request
            exact = ["exact"] * len(engines)
            wait(lambda: index_modes(proxy) == exact, WAIT_S, "the proxy's index")
        before = computed(engines)
        started = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            ttfts, outputs, went, prompt_tokens = ask(proxy.url, pool)
        wall = time.perf_counter() - started
        done = computed(engines) - before
        reasons = _reasons(proxy)
    finally:
        stop(proxy)
    served = [went.count(e.url) for e in engines]
    return Ran(policy, ttfts, wall, int(done), prompt_tokens, served, reasons, outputs)


def reset_caches(engines: list[Server], step: bool = True) -> None:
    """Empty ``engines``' caches (their own and kvtier's). An engine publishes its events at
    its next step: with ``step``, one is taken, so that the reset is said before anything else
    (a proxy's replay included)."""
    for engine in engines:
        wait(partial(_reset, engine.url), WAIT_S, "the caches emptied")
        if step:
            post(engine.url, "/v1/completions", {"model": "tiny", "prompt": [1], "max_tokens": 1})


def _reset(url: str) -> bool:
    return bool(post(url, RESET)["success"])


def computed(engines: list[Server]) -> float:
    """The prompt tokens ``engines`` computed so far."""
    name = "vllm:prompt_tokens_by_source_total"
    return sum(sample(e.url, name, source="local_compute") for e in engines)


def index_modes(proxy: Server) -> list[str]:
    """The proxy's index mode of each engine (its /health), in order; none while it does not
    answer."""
    try:
        with urllib.request.urlopen(proxy.url + "/health", timeout=WAIT_S) as answer:
            return list(json.loads(answer.read())["index"].values())
    except OSError:
        return []


def _reasons(proxy: Server) -> dict[str, int]:
    """The proxy's decisions so far, by reason (its /metrics)."""
    counts = {r: sample(proxy.url, "kvtier_proxy_decisions_total", reason=r) for r in REASONS}
    return {reason: int(count) for reason, count in counts.items() if count}
