"""``kvtier bench redis``: the Redis tier against redis-py and a raw TCP stream, in one run.

One ``RedisServer`` on loopback (no persistence: ``--save "" --appendonly no``), started here. An
engine of the bench model's KV shape (8 layers, 8 KV heads, head_dim 64, bf16, vLLM's CPU layout,
32-token engine blocks), a host tier of random chunks: 64 MiB of them per round (16 MiB with
``quick``). Chunks of 16, 64 and 256 tokens (256 KiB, 1 MiB and 4 MiB): a 16-token
chunk is smaller than a 32-token engine block, so that row's engine has 16-token blocks (one
block per chunk). Per chunk size and round, three sides back to back, in an order rotated per
round (the first round is a warm-up), for each of

    store   kvtier       ``RedisTier.write_many`` of every chunk, payloads viewing the host rows
            redis-py     one ``pipeline(transaction=False)`` of a SET per chunk, the chunk's bytes
                         given as one ready value (joined before the clock starts)
            raw stream   the same bytes, ``sendall`` on a loopback TCP connection by one thread,
                         ``recv_into`` a preallocated buffer by another: done when all arrived
    load    kvtier       every chunk into shuffled engine blocks through ``RedisLoadHandler``
                         (fetched, verified, scattered); the blocks are checked after the clock
            redis-py     one pipeline of a GET per chunk: values as ``bytes``, not scattered
            raw stream   as for store

The figures (``redis_report.py``) are kvtier's throughput over each baseline's, per round, and
their median, min and max; goals: load / GET >= 2.0 and load / raw stream >= 0.5. After the
rounds, the parts of a load are timed alone (``_Rig.phases``: fetch and verify, checksum,
scatter): where kvtier's load time goes. ``other_load_cores``: CPU taken meanwhile by anything but
this process and redis-server (above 0.1 the timings are disturbed). The TTFT section (a 4k-token
prompt from Redis vs recompute vs the host tier, ``redis_ttft.py``) runs with ``ttft``.

Over 300 lines because its three sides (kvtier, redis-py, raw TCP) are timed in one loop, so
that each round compares them under the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis
import redis.utils
import torch
from rich.console import Console
from tqdm import tqdm

from kvtier.addresses import EngineBlocks, TierChunks
from kvtier.apps.bench import redis_report
from kvtier.apps.bench.redis_server import RedisServer
from kvtier.apps.bench.report import median, time_call, write_json
from kvtier.apps.bench.ttft_timing import OtherLoad, own_cpu_seconds
from kvtier.keys import LayoutFingerprint, make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import Buffer, payload_checksum
from kvtier.tiers.base.handler import TransferHandler
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.io import RedisLoadHandler
from kvtier.tiers.redis.store import RedisStore
from kvtier.tiers.redis.tier import RedisTier

LAYERS, KV_HEADS, HEAD_DIM, ENGINE_BLOCK = 8, 8, 64, 32
CHUNK_TOKENS = (16, 64, 256)
SIDES = {
    "store": ("kvtier_store", "redispy_set", "raw_store"),
    "load": ("kvtier_load", "redispy_get", "raw_load"),
}
PREFIX = "kvtier-bench"


def run(
    out_dir: Path,
    quick: bool = False,
    rounds: int | None = None,
    device: str | None = None,
    url: str | None = None,
    ttft: bool = False,
    server: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure, print a table, write ``redis.json`` and ``redis.png`` under ``out_dir``.

    ``rounds`` after the warm-up (default 9; 3 with ``quick``). ``url``: a running server to use
    instead of starting one (its keys under ``kvtier-bench:`` are overwritten, then deleted);
    ``server``: the kind started, "redis" or "valkey" (None: redis-server, else valkey-server).
    ``ttft``: also the TTFT section (real engines of the bench model; minutes). Returns the JSON
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
            "goals": redis_report.GOALS, "other_load_cores": others.cores(), "sizes": sizes,
        }  # fmt: skip
        if ttft:
            meta["ttft"] = measure_ttft(url)
    rows = redis_report.ratio_rows(sizes)
    meta["runtime_s"] = round(time.perf_counter() - started, 1)
    write_json(out_dir / "redis.json", "redis", rows, **meta)
    redis_report.plot(rows, meta, out_dir / "redis.png")
    redis_report.print_table(rows, meta, console or Console())
    if ttft:
        redis_report.print_ttft(meta["ttft"], console or Console())
    return {**meta, "rows": rows}


def _server_name(info: dict[str, Any]) -> str:
    """ "valkey 8.0.1" or "redis 7.0.15" (Valkey also reports a Redis version, for clients)."""
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"redis {info['redis_version']}"


def measure_ttft(url: str, tokens: int = 4096, repeats: int = 3) -> dict[str, Any]:
    """The TTFT section (``redis_ttft.py``): a ``tokens``-token prompt served from Redis by
    another engine vs recompute vs the host tier, in real vLLM, against the server at ``url``."""
    import tempfile

    from kvtier.apps.bench import redis_ttft

    with tempfile.TemporaryDirectory(prefix="kvtier-bench-redis-") as work:
        return redis_ttft.measure(Path(work), url, tokens, repeats, "bench", "bfloat16")


def measure_size(
    url: str,
    tokens: int,
    payload: int,
    rounds: int,
    device: torch.device,
    tick: Callable[[], object],
) -> dict[str, Any]:
    """Seconds of every side per round (warm-up dropped) for chunks of ``tokens`` tokens."""
    rig = _Rig(url, tokens, payload, device)
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


class _Rig:
    """One chunk size: an engine, a host tier of random chunks, kvtier's tier and loader, a
    redis-py client with the same chunks as joined values, and a raw stream of the same bytes."""

    def __init__(self, url: str, tokens: int, payload: int, device: torch.device) -> None:
        self.block = min(tokens, ENGINE_BLOCK)
        factor = tokens // self.block
        self.chunk_bytes = LAYERS * factor * KV_HEADS * self.block * 2 * HEAD_DIM * 2
        chunks = max(1, payload // self.chunk_bytes)
        self.layout = _engine(self.block, 2 * chunks * factor, device)
        host = HostTier(self.layout, chunks, factor)
        rng = np.random.default_rng(tokens)
        memory = host.memory_np
        memory[:] = np.frombuffer(rng.bytes(memory.size), dtype=np.uint8).reshape(memory.shape)
        # per view: every chunk's pages as (chunks * factor, page bytes)
        self.host_rows = [
            torch.from_numpy(np.ascontiguousarray(host.pages(0, i, np.dtype(np.uint8)))).reshape(
                chunks * factor, -1
            )
            for i in range(len(self.layout.views))
        ]
        shape = f"(kv_heads={KV_HEADS},block={self.block},2*head={2 * HEAD_DIM})"
        fingerprint = LayoutFingerprint("bench-redis", "bfloat16", f"cpu:{LAYERS} layers:{shape}",
                                        0, 1, 0, tokens)  # fmt: skip
        digest = fingerprint.digest()
        store = RedisStore(RedisConfig(url, timeout_s=30.0, prefix=PREFIX))
        store.check()
        self.tier = RedisTier(store, 0, digest, fingerprint.describe(), self.layout, factor)
        self.keys = tuple(make_key(digest, i, 0) for i in range(chunks))
        self.payloads: list[list[Buffer]] = [[host.record(c, 0)] for c in range(chunks)]
        self.values = [host.record(c, 0).tobytes() for c in range(chunks)]
        self.names = [f"{PREFIX}:redis-py:{tokens}:{c}" for c in range(chunks)]
        self.client = redis.Redis.from_url(url, socket_timeout=30.0)
        self.got: list[bytes | None] = []
        self.raw = _RawStream([memory.reshape(-1).data.cast("B")])
        self.loader = RedisLoadHandler(self.layout, self.tier)
        self.blocks = np.empty(0, dtype=np.int64)
        self._jobs = iter(range(1 << 62))

    def store(self) -> None:
        self.tier.write_many(self.keys, self.payloads)

    def set(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for name, value in zip(self.names, self.values, strict=True):
            pipe.set(name, value)
        pipe.execute()

    def prepare_load(self, round_: int) -> None:
        """Zero the engine, pick this round's shuffled blocks (every page stays touched)."""
        for view in self.layout.views:
            view.zero_()
        count = len(self.keys) * self.tier.factor
        picked = np.random.default_rng(round_).permutation(self.layout.num_blocks)[:count]
        self.blocks = picked.astype(np.int64)
        self.got = []

    def load(self) -> None:
        engine = EngineBlocks(self.blocks, (len(self.blocks),), (0,))
        _job(self.loader, next(self._jobs), TierChunks("redis", self.keys), engine)

    def get(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for name in self.names:
            pipe.get(name)
        self.got = pipe.execute()

    def phases(self) -> dict[str, Callable[[], None]]:
        """The parts of a load, each alone over every chunk, on this thread: ``fetch_verify``
        (``RedisTier.prefetch`` ``read_ahead`` ahead and ``read`` into one staging chunk: the
        GETs, the receive, the header and checksum checks), ``checksum`` (xxh3 of the payload,
        part of ``fetch_verify``) and ``scatter`` (the staged rows into the engine blocks)."""
        staging = [np.empty(sum(self.tier.view_bytes(0)), dtype=np.uint8)]  # one record
        rows = [rows.numpy() for rows in self.host_rows]
        factor = self.tier.factor

        def fetch_verify() -> None:
            ahead = self.tier.read_ahead
            for key in self.keys[:ahead]:
                self.tier.prefetch(key)
            for n, key in enumerate(self.keys):
                if n + ahead < len(self.keys):
                    self.tier.prefetch(self.keys[n + ahead])
                self.tier.read(key, staging)

        def checksum() -> None:
            for payload in self.payloads:
                payload_checksum(payload)

        def scatter() -> None:  # a chunk at a time, as ``TierLoadHandler._scatter`` on the CPU
            for first in range(0, len(self.blocks), factor):
                ids = self.blocks[first : first + factor]
                for view, source in zip(engine, rows, strict=True):
                    view[ids] = source[first : first + factor]

        phases = {"fetch_verify": fetch_verify, "checksum": checksum}
        if self.layout.device.type != "cpu":  # the GPU scatter is the copy engine's: not here
            return phases
        engine = [view.numpy().view(np.uint8) for view in self.layout.views]
        return phases | {"scatter": scatter}

    def check_load(self) -> None:
        """Raise RuntimeError unless every side brought back the bytes stored."""
        ids = torch.from_numpy(self.blocks).to(self.layout.device)
        for view, rows in zip(self.layout.views, self.host_rows, strict=True):
            if not torch.equal(view.index_select(0, ids).cpu().view(torch.uint8), rows):
                raise RuntimeError("kvtier bench redis: kvtier loaded other bytes than it stored")
        if self.got != self.values:
            raise RuntimeError("kvtier bench redis: redis-py GET returned other bytes")
        if not self.raw.arrived_intact():
            raise RuntimeError("kvtier bench redis: the raw stream delivered other bytes")
        self.got = []

    def close(self) -> None:
        """Stop the loader, delete every key of this chunk size, close every connection."""
        self.loader.shutdown()
        self.raw.close()
        self.client.delete(*self.names, *(self.tier.name(key) for key in self.keys))
        self.client.close()
        self.tier.close()


def _engine(block: int, num_blocks: int, device: torch.device) -> KVLayout:
    """vLLM's CPU layout per layer, ``(num_blocks, kv_heads, block, 2*head_dim)``."""
    caches = {
        f"layer.{i}": torch.ones(num_blocks, KV_HEADS, block, 2 * HEAD_DIM,
                                 dtype=torch.bfloat16, device=device)
        for i in range(LAYERS)
    }  # fmt: skip
    return build_layout(caches, [list(caches)], num_blocks)


def _job(handler: TransferHandler, job_id: int, src: TierChunks, dst: EngineBlocks) -> None:
    assert handler.transfer_async(job_id, src, dst)
    handler.wait([job_id])
    (result,) = handler.get_finished()
    if not result.success:
        raise RuntimeError(f"kvtier bench redis: job {job_id} failed: {result}")


class _RawStream:
    """The bound: ``sources`` over one loopback TCP connection, into one preallocated buffer."""

    def __init__(self, sources: list[memoryview]) -> None:
        self.sources = sources
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self.sender = socket.create_connection(listener.getsockname())
            self.receiver, _ = listener.accept()
        for sock in (self.sender, self.receiver):  # as redis-py's connections
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray(sum(s.nbytes for s in sources))

    def stream(self) -> None:
        """Send every source on a thread; return once the last byte is in ``buffer``."""
        thread = threading.Thread(target=self._send)
        thread.start()
        view = memoryview(self.buffer)
        while view.nbytes:
            got = self.receiver.recv_into(view)
            if not got:
                raise ConnectionError("kvtier bench redis: the raw sender closed early")
            view = view[got:]
        thread.join()

    def _send(self) -> None:
        for source in self.sources:
            self.sender.sendall(source)

    def arrived_intact(self) -> bool:
        at = 0
        for source in self.sources:
            if self.buffer[at : at + source.nbytes] != source:
                return False
            at += source.nbytes
        return True

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


def _server_cpu_seconds(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _parser_name(client: redis.Redis) -> str:
    connection = client.connection_pool.get_connection()
    try:
        return type(connection._parser).__name__
    finally:
        client.connection_pool.release(connection)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvtier.apps.bench.redis")
    parser.add_argument("--quick", action="store_true", help="16 MiB a round, 3 rounds: seconds")
    parser.add_argument("--rounds", type=int, default=None, help="after a warm-up (default 9)")
    parser.add_argument("--device", default=None, help="engine device (default: cuda if any)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    run(args.out, quick=args.quick, rounds=args.rounds, device=args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
