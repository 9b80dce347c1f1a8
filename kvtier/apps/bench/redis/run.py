"""``kvtier bench redis``: the Redis tier against redis-py and a raw TCP stream, in one run.

One ``RedisServer`` on loopback (no persistence: ``--save "" --appendonly no``), started here. An
engine of the bench model's KV shape (8 layers, 8 KV heads, head_dim 64, bf16, vLLM's CPU layout,
32-token engine blocks), a host tier of random chunks: 64 MiB of them per round (16 MiB with
``quick``). Chunks of 16, 64 and 256 tokens (256 KiB, 1 MiB and 4 MiB): a 16-token
chunk is smaller than a 32-token engine block, so that row's engine has 16-token blocks (one
block per chunk). Per chunk size and round, three sides back to back (``rig.Rig``), in an order
rotated per round (the first round is a warm-up), for each of

    store   kvtier       ``RedisTier.write_many`` of every chunk, payloads viewing the host rows
            redis-py     one ``pipeline(transaction=False)`` of a SET per chunk, the chunk's bytes
                         given as one ready value (joined before the clock starts)
            raw stream   the same bytes, ``sendall`` on a loopback TCP connection by one thread,
                         ``recv_into`` a preallocated buffer by another: done when all arrived
    load    kvtier       every chunk into shuffled engine blocks through ``RedisLoadHandler``
                         (fetched, verified, scattered); the blocks are checked after the clock
            redis-py     one pipeline of a GET per chunk: values as ``bytes``, not scattered
            raw stream   as for store

The figures (``report.py``) are kvtier's throughput over each baseline's, per round, and their
median, min and max; goals: load / GET >= 2.0 and load / raw stream >= 0.5. After the rounds,
the parts of a load are timed alone (``Rig.phases``: fetch and verify, checksum, scatter).
``other_load_cores``: CPU taken meanwhile by anything but this process and redis-server (above
0.1 the timings are disturbed). The TTFT section (``ttft.py``: a prompt from Redis vs recompute
vs the host tier, the TTFT driver on a Redis tier) runs with ``ttft``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.utils
import torch
from rich.console import Console
from tqdm import tqdm

from kvtier.apps.bench.common.jobs import HEAD_DIM, KV_HEADS
from kvtier.apps.bench.common.redis_server import RedisServer
from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.timing import OtherLoad, median, own_cpu_seconds, time_call
from kvtier.apps.bench.redis import report
from kvtier.apps.bench.redis.rig import LAYERS, Rig
from kvtier.apps.bench.redis.ttft import TTFTOptions

CHUNK_TOKENS = (16, 64, 256)
SIDES = {
    "store": ("kvtier_store", "redispy_set", "raw_store"),
    "load": ("kvtier_load", "redispy_get", "raw_load"),
}


def run(
    out_dir: Path,
    quick: bool = False,
    rounds: int | None = None,
    device: str | None = None,
    url: str | None = None,
    ttft: bool = False,
    server: str | None = None,
    console: Console | None = None,
    ttft_options: TTFTOptions | None = None,
) -> dict[str, Any]:
    """Measure, print a table, write ``redis.json``, ``.md`` and ``.png`` under ``out_dir``.

    ``rounds`` after the warm-up (default 9; 3 with ``quick``). ``url``: a running server to use
    instead of starting one (its keys under ``kvtier-bench:`` are overwritten, then deleted);
    ``server``: the kind started, "redis" or "valkey" (None: redis-server, else valkey-server).
    ``ttft``: also the TTFT section (real engines, in this process: ``common.engine_env``
    applied; the bench model unless ``ttft_options`` says otherwise; minutes). Returns the JSON
    document. Raises RuntimeError when a load did not bring back the bytes stored.
    """
    payload = (16 << 20) if quick else (64 << 20)
    rounds = rounds or (3 if quick else 9)
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if url is None:  # kvtier's and redis-py's copies of one chunk size, with room to spare
            started_server = RedisServer(kind=server, maxmemory=4 * payload + (256 << 20),
                                         maxmemory_policy="noeviction")  # fmt: skip
            url = stack.enter_context(started_server).url
        client = stack.enter_context(redis.Redis.from_url(url))
        others = OtherLoad(lambda: own_cpu_seconds() + _server_cpu_seconds(client))
        sizes = []
        with tqdm(total=len(CHUNK_TOKENS) * (rounds + 1), desc="bench redis", unit="round") as bar:
            for tokens in CHUNK_TOKENS:
                sizes.append(measure_size(url, tokens, payload, rounds, target, bar.update))
        meta: dict[str, Any] = {
            "device": str(target), "server": _server_name(client.info("server")),
            "redis_py": redis.__version__, "hiredis": redis.utils.HIREDIS_AVAILABLE,
            "parser": _parser_name(client), "payload_mib": payload >> 20, "rounds": rounds,
            "layers": LAYERS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "bfloat16",
            "goals": report.GOALS, "other_load_cores": others.cores(), "sizes": sizes,
        }  # fmt: skip
        if ttft:
            meta["ttft"] = measure_ttft(url, ttft_options or TTFTOptions())
    rows = report.ratio_rows(sizes)
    meta["runtime_s"] = round(time.perf_counter() - started, 1)
    document = write_json(out_dir / "redis.json", "redis", rows, report.summary, **meta)
    report.plot(rows, meta, out_dir / "redis.png")
    report.print_table(rows, meta, console or Console())
    if ttft:
        report.print_ttft(meta["ttft"], console or Console())
    return document


def _server_name(info: dict[str, Any]) -> str:
    """ "valkey 8.0.1" or "redis 7.0.15" (Valkey also reports a Redis version, for clients)."""
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info['redis_version']}"


def measure_ttft(url: str, options: TTFTOptions) -> dict[str, Any]:
    """The TTFT section (``ttft.py``): a prompt served from Redis by another engine vs recompute
    vs the host tier, in real vLLM, against the server at ``url``."""
    from kvtier.apps.bench.redis import ttft

    return ttft.measure(url, options.tokens, options.repeats, options.model, options.dtype)


def measure_size(
    url: str,
    tokens: int,
    payload: int,
    rounds: int,
    device: torch.device,
    tick: Callable[[], object],
) -> dict[str, Any]:
    """Seconds of every side per round (warm-up dropped) for chunks of ``tokens`` tokens."""
    rig = Rig(url, tokens, payload, device)
    seconds: dict[str, list[float]] = {side: [] for sides in SIDES.values() for side in sides}
    try:
        for round_ in range(rounds + 1):
            calls = {"kvtier_store": rig.store, "redispy_set": rig.set, "raw_store": rig.raw.stream}
            _rotated(seconds, round_, calls)
            rig.prepare_load(round_)
            calls = {"kvtier_load": rig.load, "redispy_get": rig.get, "raw_load": rig.raw.stream}
            _rotated(seconds, round_, calls)
            rig.check_load()
            tick()
        phases = {name: [time_call(fn) for _ in range(rounds)] for name, fn in rig.phases().items()}
    finally:
        rig.close()
    return {
        "chunk_tokens": tokens, "engine_block_tokens": rig.block, "chunks": len(rig.keys),
        "chunk_bytes": rig.chunk_bytes, "payload_bytes": rig.chunk_bytes * len(rig.keys),
        "seconds": {side: [round(s, 5) for s in values] for side, values in seconds.items()},
        "load_phases_ms": {name: round(median(s) * 1e3, 2) for name, s in phases.items()},
    }  # fmt: skip


def _rotated(
    seconds: dict[str, list[float]], round_: int, calls: dict[str, Callable[[], None]]
) -> None:
    """Time each call back to back, starting with a different one each round; keep all but
    round 0's."""
    order = list(calls)
    for side in order[round_ % len(order) :] + order[: round_ % len(order)]:
        elapsed = time_call(calls[side])
        if round_ > 0:
            seconds[side].append(elapsed)


def _server_cpu_seconds(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _parser_name(client: redis.Redis) -> str:
    connection = client.connection_pool.get_connection()
    try:
        return type(connection._parser).__name__
    finally:
        client.connection_pool.release(connection)
