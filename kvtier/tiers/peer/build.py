"""The peer tier's two halves, built from its config section and the engine's role
(``TierSpec`` builders): nothing for ``kv_both``; a prefill engine's offers and each rank's
listener for ``kv_producer``; a decode engine's pulls and each rank's puller for
``kv_consumer``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.tiers.base.spec import SchedulerContext, WorkerContext
from kvtier.tiers.peer.config import TransferConfig

if TYPE_CHECKING:  # built only when the tier is (a config is parsed without them)
    from kvtier.tiers.peer.planner import PeerPlanner
    from kvtier.tiers.peer.worker import PeerWorkerTier

BOTH = "kv_both"
PRODUCER = "kv_producer"


def request_source(ctx: SchedulerContext[TransferConfig]) -> PeerPlanner | None:
    """The scheduler half's offers (a prefill engine) or pulls (a decode engine)."""
    from kvtier.tiers.peer.planner import PeerPlanner
    from kvtier.tiers.peer.roles import PeerConsumer, PeerProducer

    if ctx.role == BOTH:
        return None
    windows = list(ctx.windows)
    if ctx.role == PRODUCER:
        producer = PeerProducer(ctx.engine_id or "kvtier", ctx.config.hold_s, ctx.tp_size,
                                ctx.world_size, ctx.block_tokens, windows)  # fmt: skip
        return PeerPlanner(producer=producer)
    consumer = PeerConsumer(ctx.block_tokens, len(windows), ctx.tp_size, ctx.world_size, windows)
    return PeerPlanner(consumer=consumer)


def worker_tier(ctx: WorkerContext[TransferConfig]) -> PeerWorkerTier | None:
    """A prefill rank's listener, or a decode rank's puller, named by what must match between
    the two ranks: the KV's meaning and its shape (the rank's fingerprint)."""
    from kvtier.tiers.peer.net import PeerIdentity
    from kvtier.tiers.peer.worker import PeerSettings, peer_worker_tier

    if ctx.role == BOTH:
        return None
    fingerprint, config = ctx.fingerprint, ctx.config
    identity = PeerIdentity((
        ("weights", fingerprint.weights or fingerprint.model),  # not the path: see keys.py
        ("dtype", fingerprint.dtype),
        ("block_tokens", str(fingerprint.chunk_tokens // ctx.factor)),
        ("tp_size", str(fingerprint.tp_size)),
        ("tp_rank", str(fingerprint.tp_rank)),
        ("layout", fingerprint.layout),
    ))  # fmt: skip
    settings = PeerSettings(
        identity=identity,
        secret=config.secret_bytes(),
        rank=ctx.rank,
        host=config.host,
        reach_host=config.reach_host,
        port=config.port + ctx.server_rank if config.port else 0,
        timeout_s=config.timeout_s,
        connections=config.connections,
    )
    return peer_worker_tier(ctx.layout, settings, producer=ctx.role == PRODUCER)
