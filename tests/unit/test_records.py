"""A chunk's record (``tiers/host/records.py``): what a host slot, a disk file and a Redis record
hold, byte for byte as chunk files were written before records existed (each view's pages back
to back, view after view), so a disk tier written by an earlier kvtier is read as it is; a page
laid out in another order is another layout, never mixed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks
from kvtier.keys import make_key
from kvtier.layout import build_layout
from kvtier.pages.grid import record_grid
from kvtier.tiers.base.chunk_io import TierLoadHandler
from kvtier.tiers.base.records import RecordLayout
from kvtier.tiers.disk.files import DiskTier
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io import engine_host_handlers

NUM_BLOCKS, FACTOR = 16, 2
FP = bytes(range(16))


def _layout() -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    torch.manual_seed(3)
    backing = torch.randn(2, 2, NUM_BLOCKS, 4, 2, 8)  # two layers' (2, blocks, 4, 2, 8)
    caches = {"a.0": backing[0], "a.1": backing[1], "b.0": torch.randn(NUM_BLOCKS, 3, 16)}
    return caches, [["a.0", "a.1"], ["b.0"]]


def test_a_record_lays_each_views_pages_back_to_back_view_after_view() -> None:
    records = RecordLayout((256, 256, 96), ((0, 1), (2,)), FACTOR)
    assert records.view_bytes(0) == [512, 512] and records.group_bytes(1) == 192
    assert records.record_bytes == 1024
    assert records.offsets(0) == (0, 512)
    # blocks 5 and 6 <-> sub-block 1 of slot 0 and sub-block 0 of slot 1, views outer
    grid = record_grid((0, 1), records.offsets(0), np.array([5, 6]), np.array([1, 2]), FACTOR,
                       records.record_bytes)  # fmt: skip
    assert grid.pages(np.array(records.page_bytes)).host.tolist() == [256, 1024, 768, 1536]


def test_a_stored_chunk_is_the_payload_chunk_files_always_held() -> None:
    caches, groups = _layout()
    layout = build_layout(caches, groups, NUM_BLOCKS)
    host = HostTier(layout, 4, FACTOR)
    store, load = engine_host_handlers(layout, host, lanes=1)
    engine = EngineBlocks(np.array([9, 4, 11, 12]), (2, 2), (0, 0))
    assert store.transfer_async(1, engine, HostChunks(np.array([3, 1])))
    (result,) = store.get_finished()
    assert result.success

    def old_payload(group: int, blocks: list[int]) -> bytes:  # per view, its pages
        return b"".join(
            layout.views[view][block].numpy().tobytes()
            for view in layout.groups[group]
            for block in blocks
        )

    assert host.record(3, 0).tobytes() == old_payload(0, [9, 4])
    assert host.record(1, 1).tobytes() == old_payload(1, [11, 12])
    store.shutdown()
    load.shutdown()


def test_a_file_written_view_by_view_loads_into_the_right_blocks(tmp_path: Path) -> None:
    """The way an earlier kvtier wrote a chunk file: one buffer per view of its group."""
    caches, groups = _layout()
    layout = build_layout(caches, groups, NUM_BLOCKS)
    tier = DiskTier(tmp_path, 0, FP, "test layout", layout, FACTOR)
    key = make_key(FP, 7, 0)
    rng = np.random.default_rng(0)
    views = [rng.integers(0, 256, n, dtype=np.uint8) for n in tier.view_bytes(0)]
    tier.write(key, views)
    loader = TierLoadHandler(layout, tier, "disk")
    assert loader.transfer_async(1, TierChunks("disk", (key,)), EngineBlocks(
        np.array([5, 2]), (2, 0), (0, 0)))  # fmt: skip
    loader.wait([1])
    (result,) = loader.get_finished()
    loader.shutdown()
    assert result.success
    for i, view in enumerate(layout.groups[0]):
        pages = views[i].reshape(FACTOR, -1)
        for sub, block in enumerate([5, 2]):
            assert layout.views[view][block].numpy().tobytes() == pages[sub].tobytes()


def test_pages_in_another_order_are_another_layout() -> None:
    """HND and NHD pages of the same shape hold the same bytes in another order: their
    descriptions (and so the fingerprints records are checked against) differ, while a
    row-major page's description is the one records were always written under."""
    nhd = torch.zeros(2, NUM_BLOCKS, 4, 2, 8)
    hnd = torch.zeros(2, NUM_BLOCKS, 2, 4, 8).permute(0, 1, 3, 2, 4)
    plain = build_layout({"a": nhd}, [["a"]], NUM_BLOCKS).describe()
    assert plain == "views=[256B,256B] groups=[[0, 1]]"
    other = build_layout({"a": hnd}, [["a"]], NUM_BLOCKS).describe()
    assert other != plain and "orders=[4x2x8:1,0,2;4x2x8:1,0,2]" in other


def test_pages_an_attention_kernel_packs_otherwise_are_another_layout() -> None:
    """vLLM's CPU kernels write a block's K and V in their ISA's order (AMX tiles, VEC rows) in
    tensors of one shape: the packing is part of the description, so a record written by an
    engine of one ISA is refused by an engine of another."""
    cache = torch.zeros(2, NUM_BLOCKS, 4, 2, 8)
    plain = build_layout({"a": cache}, [["a"]], NUM_BLOCKS).describe()
    amx = build_layout({"a": cache}, [["a"]], NUM_BLOCKS, packing="amx").describe()
    vec = build_layout({"a": cache}, [["a"]], NUM_BLOCKS, packing="vec").describe()
    assert amx == f"{plain} packing=amx"
    assert len({plain, amx, vec}) == 3
