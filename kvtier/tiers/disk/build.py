"""The disk tier's two halves, built from its config section (``TierSpec`` builders)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvtier.tiers.base.spec import SchedulerContext, WorkerContext, WorkerTier
from kvtier.tiers.disk.config import DiskConfig

if TYPE_CHECKING:  # built only when the tier is (a config is parsed without them)
    from kvtier.tiers.disk.index import DiskIndex

NAME = "disk"


def scheduler_index(ctx: SchedulerContext[DiskConfig]) -> DiskIndex:
    """The directory's index, built from its file names (a restarted engine finds its chunks)."""
    from kvtier.tiers.disk.index import DiskIndex

    config = ctx.config
    return DiskIndex(
        Path(config.path), config.bytes, ctx.world_size, ctx.fingerprint,
        ctx.chunk_bytes * ctx.world_size, write_through=config.write_through,
    )  # fmt: skip


def worker_tier(ctx: WorkerContext[DiskConfig]) -> WorkerTier:
    """This rank's files: named by its rank, checked against its fingerprint."""
    from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
    from kvtier.tiers.disk.files import DiskTier, default_readers

    files = DiskTier(
        Path(ctx.config.path), ctx.rank, ctx.fingerprint.digest(), ctx.fingerprint.describe(),
        ctx.layout, ctx.factor,
    )  # fmt: skip
    readers = ctx.config.readers or default_readers(ctx.layout.device.type)
    return WorkerTier(
        NAME,
        load=TierLoadHandler(ctx.layout, files, NAME, readers),
        write=TierWriteHandler(ctx.host, files, NAME),
        flush=files,
    )
