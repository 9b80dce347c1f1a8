"""A chunk tier's files written from random bytes, and a job run through its handlers, for the
disk tests on the CPU (``unit/disk_io_setup.py``) and on a GPU (``gpu/test_disk_gpu.py``).

    FP, KEY_FP                  the layout fingerprint in the file headers; the keys' own
    chunk_keys(groups)          a key per chunk, in order, of the groups given
    store_chunks(tier, keys)    a file of random bytes per key; each chunk's views as
                                ``(factor, page bytes)``
    run_job(handler, id, src, dst) -> TransferResult   submitted, waited for, reported
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvtier.addresses import TransferSpec
from kvtier.keys import ChunkKey, key_group, make_key
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.disk.files import DiskTier

FP = bytes(range(16))  # the layout fingerprint digest in the file headers
KEY_FP = bytes(range(100, 116))  # the fingerprint part of the chunk keys


def chunk_keys(groups: Sequence[int]) -> tuple[ChunkKey, ...]:
    return tuple(make_key(KEY_FP, position, group) for position, group in enumerate(groups))


def store_chunks(tier: DiskTier, keys: Sequence[ChunkKey]) -> list[list[np.ndarray]]:
    """Write a file of random bytes for every key; returns each chunk's views as (factor, page)."""
    rng = np.random.default_rng(1)
    chunks = []
    for key in keys:
        views = [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(key_group(key))]
        tier.write(key, views)
        chunks.append([view.reshape(tier.factor, -1) for view in views])
    return chunks


def run_job(
    handler: TierLoadHandler | TierWriteHandler, job_id: int, src: TransferSpec, dst: TransferSpec
) -> TransferResult:
    assert handler.transfer_async(job_id, src, dst)
    handler.wait([job_id])
    (result,) = handler.get_finished()
    assert result.job_id == job_id
    return result
