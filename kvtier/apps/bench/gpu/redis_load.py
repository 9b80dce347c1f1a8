"""Redis-tier loads of the request into engine blocks, against a raw loopback stream.

    measure(shape, tokens, device, reps, clock, url=None)   redis_ratio

A real ``redis-server`` on 127.0.0.1 (``common/redis_server.py``: no persistence, room for the
records, no eviction), started here unless ``url`` names one; without a server binary, or when
it does not start, the figure is null with the reason. The request's chunks are stored into a
host tier by the connector's own store and written once as ``RedisTier`` records. A load is the
Redis tier's ``RedisLoadHandler`` (pipelined GETs received straight into its staging, verified,
moved into other engine blocks on the device; checked after the reps). The bound: the same
number of bytes over one raw TCP connection on loopback (``common/loopback.py``). Per rep the two
run back to back, their order alternating.
"""

from __future__ import annotations

import contextlib
import itertools

import torch

from kvtier.addresses import TierChunks
from kvtier.apps.bench.common.jobs import run_job
from kvtier.apps.bench.common.loopback import Loopback
from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, Unavailable, ratios, summary
from kvtier.apps.bench.gpu.host_copy import HostRig, mechanisms
from kvtier.apps.bench.gpu.shapes import Shape
from kvtier.keys import LayoutFingerprint

PREFIX = "kvtier-bench-gpu"


def measure(
    shape: Shape,
    tokens: int,
    device: torch.device,
    reps: int,
    clock: Clock,
    url: str | None = None,
) -> Measured:
    from kvtier.apps.bench.common.redis_server import RedisServer, redis_server_binary

    with contextlib.ExitStack() as stack:
        rig = HostRig(shape, tokens, device, only=mechanisms(device)[:1])
        stack.callback(rig.close)
        if url is None:
            if redis_server_binary() is None:
                raise Unavailable("no redis-server or valkey-server on PATH")
            room = 2 * rig.request.nbytes + (256 << 20)
            server = RedisServer(maxmemory=room, maxmemory_policy="noeviction")
            try:
                url = stack.enter_context(server).url
            except RuntimeError as error:  # the binary does not run here (its libc, say)
                raise Unavailable(f"{server.binary} did not start: {error}") from error
        rig.move(rig.mechanisms[0], store=True)
        return _measure(rig, url, reps, clock, stack)
    raise AssertionError("unreachable")  # for mypy: the with block returns or raises


def _measure(
    rig: HostRig, url: str, reps: int, clock: Clock, stack: contextlib.ExitStack
) -> Measured:
    from kvtier.tiers.redis.config import RedisConfig
    from kvtier.tiers.redis.io import RedisLoadHandler
    from kvtier.tiers.redis.store import RedisStore
    from kvtier.tiers.redis.tier import RedisTier

    layout = rig.engine.layout
    fingerprint = LayoutFingerprint(f"bench-gpu-{rig.shape.name}", "bfloat16", layout.describe(),
                                    0, 1, 0, rig.shape.chunk_tokens)  # fmt: skip
    digest = fingerprint.digest()
    store = RedisStore(RedisConfig(url, timeout_s=30.0, prefix=PREFIX))
    store.check()
    tier = RedisTier(store, 0, digest, fingerprint.describe(), layout, rig.shape.factor)
    stack.callback(tier.close)
    keys = rig.request.keys(digest)
    stack.callback(lambda: store.delete([tier.name(key) for key in keys]))
    written = tier.write_many(keys, [[record] for record in rig.records()])
    if None in written:
        raise RuntimeError(f"Redis refused {written.count(None)} of {len(keys)} records")
    loader = RedisLoadHandler(layout, tier)
    stack.callback(loader.shutdown)
    raw = Loopback.of(rig.request.nbytes)
    stack.callback(raw.close)
    jobs = itertools.count()
    source = TierChunks("redis", keys)

    def load() -> None:
        run_job(loader, next(jobs), source, rig.target)

    load()  # warm-up: connections, staging, the first touch of the target blocks
    raw.stream()
    seconds: dict[str, list[float]] = {"raw": [], "kvtier": []}
    for rep in range(reps):
        pair = [("raw", raw.stream), ("kvtier", load)]
        for side, fn in pair if rep % 2 == 0 else pair[::-1]:
            seconds[side].append(clock.seconds(fn))
    if not rig.loaded_intact():
        raise RuntimeError("a Redis load brought back other bytes than were written")
    nbytes = rig.request.nbytes
    details = {
        "bytes": nbytes, "records": len(keys), "record_bytes": tier.file_bytes(0),
        "server": url if "127.0.0.1" not in url else "redis-server on 127.0.0.1",
        "seconds": {name: summary(values) for name, values in seconds.items()},
        "gb_s": {name: round(nbytes / min(values) / 1e9, 2) for name, values in seconds.items()},
    }  # fmt: skip
    return Measured({"redis_ratio": ratios(seconds["raw"], seconds["kvtier"])}, {}, details)
