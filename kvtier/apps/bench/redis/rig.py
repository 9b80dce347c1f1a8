"""``kvtier bench redis``'s rig for one chunk size: the three sides of a round, and the parts of
a load.

    Rig(url, tokens, payload, device)   an engine of the bench model's KV shape, a host tier of
                                        random chunks, kvtier's Redis tier and loader, a redis-py
                                        client with the same chunks as joined values, and a raw
                                        stream of the same bytes (``common.loopback``)
    .store(), .set(), .raw.stream()     the store sides;  .load(), .get(), .raw.stream() the loads
    .prepare_load(round_), .check_load()  before and after a round's loads
    .phases()                           the parts of a load, each alone
    .close()                            every key of this size deleted, every connection closed
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import redis
import torch

from kvtier.addresses import EngineBlocks, TierChunks
from kvtier.apps.bench.common.jobs import HEAD_DIM, KV_HEADS, bench_layout, run_job
from kvtier.apps.bench.common.loopback import Loopback, no_delay
from kvtier.keys import LayoutFingerprint, make_key
from kvtier.tiers.base.chunk_format import Buffer, payload_checksum
from kvtier.tiers.base.record_scatter import RecordScatter
from kvtier.tiers.base.records import RecordLayout
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.io import RedisLoadHandler
from kvtier.tiers.redis.store import RedisStore
from kvtier.tiers.redis.tier import RedisTier

LAYERS, ENGINE_BLOCK = 8, 32
PREFIX = "kvtier-bench"


class Rig:
    """One chunk size: an engine, a host tier of random chunks, kvtier's tier and loader, a
    redis-py client with the same chunks as joined values, and a raw stream of the same bytes."""

    def __init__(self, url: str, tokens: int, payload: int, device: torch.device) -> None:
        self.block = min(tokens, ENGINE_BLOCK)
        factor = tokens // self.block
        self.chunk_bytes = LAYERS * factor * KV_HEADS * self.block * 2 * HEAD_DIM * 2
        chunks = max(1, payload // self.chunk_bytes)
        self.layout = bench_layout(LAYERS, self.block, 2 * chunks * factor, device)
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
        self.raw = Loopback([memory.reshape(-1).data.cast("B")], no_delay)
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
        run_job(self.loader, next(self._jobs), TierChunks("redis", self.keys), engine)

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

        def scatter() -> None:  # a record at a time, as ``TierLoadHandler`` on the CPU
            for chunk, payload in enumerate(self.payloads):
                ids = self.blocks[chunk * factor : (chunk + 1) * factor]
                records(payload[0], 0, 0, ids)

        phases = {"fetch_verify": fetch_verify, "checksum": checksum}
        if self.layout.device.type != "cpu":  # the GPU scatter is the copy engine's: not here
            return phases
        records = RecordScatter(self.layout, RecordLayout.of(self.layout, factor))
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
