"""Disk -> engine loads on CPU tensors, byte-exact, several groups (``disk_io_setup.py``: the
layout and the cases); a bad chunk fails its load before its blocks and every bad one is named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from chunk_files import chunk_keys, run_job, store_chunks
from disk_io_setup import (
    CASES,
    DAMAGE,
    NUM_BLOCKS,
    TRIMMED,
    disk_layout,
    disk_tier,
    engine_bytes,
    flip_payload_byte,
    group_page_bytes,
    remove_file,
)

from kvtier.addresses import EngineBlocks, TierChunks
from kvtier.keys import key_group
from kvtier.pages import PageMover
from kvtier.tiers.base.chunk_io import TierLoadHandler, staged_grids
from kvtier.tiers.base.chunk_reads import ChunkRead
from kvtier.tiers.base.records import RecordLayout

# ---- TierLoadHandler ---------------------------------------------------------------------------


@pytest.mark.parametrize("readers", [1, 3])
@pytest.mark.parametrize("case", CASES)
def test_load_puts_every_block_and_nothing_else(tmp_path: Path, case: str, readers: int) -> None:
    factor, engine, groups, where = CASES[case]
    tier = disk_tier(tmp_path, factor)
    layout = tier.layout
    keys = chunk_keys(groups)
    chunks = store_chunks(tier, keys)
    before = engine_bytes(layout)
    handler = TierLoadHandler(layout, tier, "disk", readers)
    result = run_job(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert result.success and result.bad == ()
    after = engine_bytes(layout)
    loaded: set[tuple[int, int]] = set()
    for (group, block), (position, sub) in where.items():
        for i, view in enumerate(layout.groups[group]):
            assert after[view][block] == chunks[position][i][sub].tobytes()
            loaded.add((view, block))
    for view in range(len(layout.views)):
        for block in range(NUM_BLOCKS):
            if (view, block) not in loaded:
                assert after[view][block] == before[view][block]
    assert handler.bad_chunks == 0
    assert all(tier.path(key).exists() for key in keys)  # a load leaves the files in place


@pytest.mark.parametrize(
    "case",
    [
        "factor 1",
        "factor 3, group 2 trimmed at both ends",
        "factor 3, every group mid-chunk",
    ],
)
def test_load_reports_the_bytes_it_put_in_the_engine(tmp_path: Path, case: str) -> None:
    # as the engine <-> host handlers do: TierStats.loaded_bytes means the same for every tier
    factor, engine, groups, where = CASES[case]
    tier = disk_tier(tmp_path, factor)
    keys = chunk_keys(groups)
    store_chunks(tier, keys)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    result = run_job(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()
    assert result.bytes == group_page_bytes(tier.layout, [group for group, _ in where])


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_bad_chunk_fails_the_load_before_its_blocks(tmp_path: Path, damage: str) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = disk_tier(tmp_path, factor)
    layout = tier.layout
    keys = chunk_keys(groups)
    chunks = store_chunks(tier, keys)
    DAMAGE[damage](tier, keys, 1)  # the second of four chunks: engine blocks 3, 4, 5
    before = engine_bytes(layout)
    handler = TierLoadHandler(layout, tier, "disk")
    result = run_job(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert not result.success
    assert result.bad == (1,)
    assert result.bytes == group_page_bytes(layout, [0, 0, 0])  # chunk 0 only
    assert handler.bad_chunks == 1
    assert not tier.path(keys[1]).exists()
    assert [tier.path(keys[p]).exists() for p in (0, 2, 3)] == [True, True, True]
    after = engine_bytes(layout)
    for i, view in enumerate(layout.groups[0]):  # views 0 and 1, shared with group 2
        for block, sub in [(0, 0), (1, 1), (2, 2)]:  # chunk 0 was verified and loaded
            assert after[view][block] == chunks[0][i][sub].tobytes()
        for block in [3, 4, 5, 9, 10, 11, 12]:  # the bad chunk's blocks and those after it
            assert after[view][block] == before[view][block]
    assert after[2] == before[2]  # group 1's view


def test_a_failed_load_names_every_bad_chunk_of_its_job(tmp_path: Path) -> None:
    # one pass over a damaged tier drops every bad file, not only the first of each job
    factor, engine, groups, _ = TRIMMED
    tier = disk_tier(tmp_path, factor)
    layout = tier.layout
    keys = chunk_keys(groups)
    chunks = store_chunks(tier, keys)
    flip_payload_byte(tier, keys, 1)
    remove_file(tier, keys, 3)  # unreadable counts as bad too
    before = engine_bytes(layout)
    handler = TierLoadHandler(layout, tier, "disk")
    result = run_job(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert not result.success
    assert result.bad == (1, 3)  # positions in the job's key order
    assert handler.bad_chunks == 2
    assert [tier.path(key).exists() for key in keys] == [True, False, True, False]
    assert result.bytes == group_page_bytes(layout, [0, 0, 0])  # chunk 0, before the first bad one
    after = engine_bytes(layout)
    for i, view in enumerate(layout.groups[0]):
        for block, sub in [(0, 0), (1, 1), (2, 2)]:
            assert after[view][block] == chunks[0][i][sub].tobytes()
        for block in [3, 4, 5, 9, 10, 11, 12]:  # chunk 2 was verified, not loaded: recomputed
            assert after[view][block] == before[view][block]


def test_a_load_of_only_bad_chunks_names_them_all_and_loads_nothing(tmp_path: Path) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = disk_tier(tmp_path, factor)
    keys = chunk_keys(groups)
    store_chunks(tier, keys)
    for position in range(len(keys)):
        flip_payload_byte(tier, keys, position)
    before = engine_bytes(tier.layout)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    result = run_job(handler, 1, TierChunks("disk", keys), engine)
    handler.shutdown()

    assert (result.success, result.bad, result.bytes) == (False, (0, 1, 2, 3), 0)
    assert handler.bad_chunks == 4
    assert not any(tier.path(key).exists() for key in keys)
    assert engine_bytes(tier.layout) == before


def test_a_load_after_a_failed_one_is_whole(tmp_path: Path) -> None:
    factor, engine, groups, where = TRIMMED
    tier = disk_tier(tmp_path, factor)
    keys = chunk_keys(groups)
    store_chunks(tier, keys)
    flip_payload_byte(tier, keys, 3)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert not run_job(handler, 1, TierChunks("disk", keys), engine).success
    chunks = store_chunks(tier, keys)  # written again
    assert run_job(handler, 2, TierChunks("disk", keys), engine).success
    handler.shutdown()
    after = engine_bytes(tier.layout)
    for (group, block), (position, sub) in where.items():
        for i, view in enumerate(tier.layout.groups[group]):
            assert after[view][block] == chunks[position][i][sub].tobytes()


def test_a_key_of_another_group_is_refused(tmp_path: Path) -> None:
    factor, engine, _, _ = TRIMMED
    tier = disk_tier(tmp_path, factor)
    keys = chunk_keys((0, 0, 0, 2))  # position 2 starts group 2's chunks but is keyed for group 0
    store_chunks(tier, keys)
    before = engine_bytes(tier.layout)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert not handler.transfer_async(1, TierChunks("disk", keys), engine)
    handler.shutdown()
    assert handler.get_finished() == []
    assert engine_bytes(tier.layout) == before


def test_a_key_count_other_than_the_chunks_spanned_is_refused(tmp_path: Path) -> None:
    factor, engine, groups, _ = TRIMMED
    tier = disk_tier(tmp_path, factor)
    keys = chunk_keys(groups)
    store_chunks(tier, keys)
    handler = TierLoadHandler(tier.layout, tier, "disk")
    assert not handler.transfer_async(1, TierChunks("disk", keys[:3]), engine)
    assert not handler.transfer_async(2, TierChunks("disk", (*keys, keys[3])), engine)
    handler.shutdown()
    assert handler.get_finished() == []


OUTSIDE_THE_LAYOUT = {
    "an engine block past the last": (
        EngineBlocks(np.array([0, NUM_BLOCKS]), group_sizes=(0, 2, 0), block_indices=(0, 0, 0)),
        (1, 1),
    ),
    "a fourth group": (
        EngineBlocks(np.array([0]), group_sizes=(0, 0, 0, 1), block_indices=(0, 0, 0, 0)),
        (3,),
    ),
}


@pytest.mark.parametrize("spec", list(OUTSIDE_THE_LAYOUT))
def test_a_load_outside_the_layout_is_refused(tmp_path: Path, spec: str) -> None:
    engine, groups = OUTSIDE_THE_LAYOUT[spec]
    tier = disk_tier(tmp_path, 1)
    keys = chunk_keys(groups)
    for key in keys:
        if key_group(key) < len(tier.layout.groups):
            store_chunks(tier, [key])
    handler = TierLoadHandler(tier.layout, tier, "disk")
    try:
        assert not handler.transfer_async(1, TierChunks("disk", keys), engine)
    finally:
        handler.shutdown()


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("case", CASES)
def test_a_gpu_moves_staged_records_as_grids(case: str, staged: bool) -> None:
    """What a load on a GPU hands its ``PageMover`` (``staged_grids``: a grid per group), moved
    here on CPU tensors, by the mover's GPU steps (``staged``) and its CPU ones: each block gets
    its page of its record's slot, slots in another order than the job's chunks."""
    factor, _, groups, where = CASES[case]
    layout = disk_layout()
    records = RecordLayout.of(layout, factor)
    subs: dict[int, list[tuple[int, int]]] = {}  # chunk position -> [(sub-block, block)]
    for (_, block), (position, sub) in where.items():
        subs.setdefault(position, []).append((sub, block))
    reads = [ChunkRead(position, groups[position], np.array([b for _, b in sorted(pairs)]),
                       min(pairs)[0]) for position, pairs in sorted(subs.items())]  # fmt: skip
    slots = list(range(len(reads)))[::-1]
    stage = torch.randint(0, 256, (len(reads), records.record_bytes), dtype=torch.uint8)
    grids = staged_grids(records, list(zip(slots, reads, strict=True)), records.record_bytes)
    assert len(grids) == len({read.group for read in reads})
    PageMover(layout.views, staged=staged).load(grids, stage.view(-1))
    for slot, read in zip(slots, reads, strict=True):
        for view, offset in zip(layout.groups[read.group], records.offsets(read.group)):
            page = layout.page_bytes[view]
            for sub, block in enumerate(read.block_ids.tolist(), start=read.first):
                want = stage[slot, offset + sub * page : offset + (sub + 1) * page]
                assert torch.equal(layout.views[view][block].view(torch.uint8), want)
