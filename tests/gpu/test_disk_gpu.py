"""The disk tier with CUDA engine tensors: loads land on the tensors' device, byte-exact; writes
come from a pinned host tier (needs CUDA).

Layout: FlashAttention's ``(2, num_blocks, block_size, kv_heads, head_size)``, so each layer is
two views (K and V); groups 0 and 1 alias the same layer, as in vLLM 0.32's hybrid models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from chunk_files import FP, chunk_keys, run_job, store_chunks

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks
from kvtier.keys import key_group
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import HEADER_BYTES
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
from kvtier.tiers.disk.files import DiskTier
from kvtier.tiers.host.buffers import HostTier

pytestmark = pytest.mark.gpu

NUM_BLOCKS, FACTOR, NUM_CHUNKS = 40, 3, 8
PAGE = 16 * 2 * 64 * 2  # bytes of one block in one view (K or V)

# group 0: 6 blocks from a chunk's start; group 1: 4 blocks starting 1 into a chunk
ENGINE = EngineBlocks(np.array([0, 1, 2, 3, 4, 5, 20, 21, 22, 23]), (6, 4), (0, 4))
CHUNK_GROUPS = (0, 0, 1, 1)
WHERE = {  # (group, engine block) -> (chunk position, sub-block)
    (0, 0): (0, 0),
    (0, 1): (0, 1),
    (0, 2): (0, 2),
    (0, 3): (1, 0),
    (0, 4): (1, 1),
    (0, 5): (1, 2),
    (1, 20): (2, 1),
    (1, 21): (2, 2),
    (1, 22): (3, 0),
    (1, 23): (3, 1),
}


def _setup(root: Path) -> tuple[torch.Tensor, DiskTier]:
    torch.manual_seed(0)
    kv = torch.randn(2, NUM_BLOCKS, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"full.0": kv, "swa.0": kv}, [["full.0"], ["swa.0"]], NUM_BLOCKS)
    assert layout.groups == ((0, 1), (0, 1)) and layout.page_bytes == (PAGE, PAGE)
    return kv, DiskTier(root, 0, FP, "flash attention test layout", layout, FACTOR)


def _row(layout: KVLayout, view: int, block: int) -> bytes:
    return layout.views[view][block].cpu().numpy().tobytes()


@pytest.mark.parametrize("readers", [1, 3])  # 3: files read side by side into the pinned half
def test_load_lands_on_the_engine_device_byte_exact(tmp_path: Path, readers: int) -> None:
    kv, tier = _setup(tmp_path)
    layout = tier.layout
    keys = chunk_keys(CHUNK_GROUPS)
    chunks = store_chunks(tier, keys)
    before = [view.clone() for view in layout.views]
    handler = TierLoadHandler(layout, tier, "disk", readers)
    assert handler.device == kv.device
    result = run_job(handler, 1, TierChunks("disk", keys), ENGINE)
    handler.shutdown()

    assert result.success and result.bad == ()
    assert kv.device.type == "cuda" and all(view.device == kv.device for view in layout.views)
    for (group, block), (position, sub) in WHERE.items():
        for i, view in enumerate(layout.groups[group]):
            assert _row(layout, view, block) == chunks[position][i][sub].tobytes()
    untouched = [b for b in range(NUM_BLOCKS) if b not in ENGINE.block_ids.tolist()]
    for rows, old in zip(layout.views, before):
        assert torch.equal(rows[untouched], old[untouched])


def test_a_bad_chunk_fails_the_job_and_leaves_the_blocks_after_it(tmp_path: Path) -> None:
    """The job's blocks are all recomputed (a failed load reports them all): the ones after
    the bad chunk are never written, and every chunk is still verified."""
    kv, tier = _setup(tmp_path)
    layout = tier.layout
    keys = chunk_keys(CHUNK_GROUPS)
    chunks = store_chunks(tier, keys)
    path = tier.path(keys[1])
    data = bytearray(path.read_bytes())
    data[HEADER_BYTES + 7] ^= 0x04
    path.write_bytes(bytes(data))
    before = [view.clone() for view in layout.views]
    handler = TierLoadHandler(layout, tier, "disk")
    result = run_job(handler, 1, TierChunks("disk", keys), ENGINE)
    handler.shutdown()

    assert (result.success, result.bad) == (False, (1,))
    assert not path.exists()
    assert chunks and all(tier.path(key).exists() for key in keys if key != keys[1])
    later = [3, 4, 5, 20, 21, 22, 23]
    for rows, old in zip(layout.views, before):
        assert torch.equal(rows[later], old[later])


def test_writes_from_a_pinned_host_tier_load_back_onto_the_device(tmp_path: Path) -> None:
    kv, tier = _setup(tmp_path)
    layout = tier.layout
    host = HostTier(layout, NUM_CHUNKS, FACTOR)
    assert host.pinning is not None and host.pinning.wait(60) and host.pinned
    host.memory_np[:] = np.random.default_rng(2).integers(0, 256, host.memory_np.shape, np.uint8)
    keys, slots = chunk_keys((0, 1)), [7, 2]
    writer = TierWriteHandler(host, tier, "disk")
    staged = run_job(
        writer, 1, HostChunks(np.array(slots[:1])), TierChunks("disk", keys[:1], staged=True)
    )
    written = run_job(writer, 2, HostChunks(np.array(slots[1:])), TierChunks("disk", keys[1:]))
    writer.shutdown()
    assert staged.success and written.success
    for key, slot in zip(keys, slots):
        out = [np.zeros(sum(tier.view_bytes(key_group(key))), dtype=np.uint8)]
        tier.read(key, out)
        assert out[0].tobytes() == host.record(slot, key_group(key)).tobytes()

    # chunk 0 fills blocks 30..32 of group 0; chunk 1 gives its first sub-block to block 10
    engine = EngineBlocks(np.array([30, 31, 32, 10]), (3, 1), (0, 6))
    loader = TierLoadHandler(layout, tier, "disk")
    assert run_job(loader, 3, TierChunks("disk", keys), engine).success
    loader.shutdown()
    pages = {30: (0, 7, 0), 31: (0, 7, 1), 32: (0, 7, 2), 10: (1, 2, 0)}
    for block, (group, slot, sub) in pages.items():
        for view in (0, 1):
            expected = host.page(group, view, slot, sub).tobytes()
            assert _row(layout, view, block) == expected
