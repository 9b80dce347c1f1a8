"""A staged record's pages into CPU engine blocks (``kvtier/tiers/base/record_scatter.py``): for
every KV layout (``kv_layouts.py``), whole chunks and partial ones, exactly the record's pages
land in exactly the blocks named, and nothing else changes; one numpy copy a record, however many
views."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
from call_counts import Calls, profiled
from kv_layouts import LAYOUTS

from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.record_scatter import RecordScatter
from kvtier.tiers.base.records import RecordLayout

CPU = torch.device("cpu")


def _reference(
    layout: KVLayout, records: RecordLayout, record: np.ndarray, group: int, first: int,
    blocks: np.ndarray,
) -> None:  # fmt: skip
    """The record's pages view by view: what the load did before."""
    for view, offset in zip(layout.groups[group], records.offsets(group), strict=True):
        page = layout.page_bytes[view]
        at = offset + first * page
        engine = layout.views[view].numpy().view(np.uint8)
        engine[blocks] = record[at : at + len(blocks) * page].reshape(-1, page)


def _engine_bytes(caches: dict[str, torch.Tensor]) -> list[np.ndarray]:
    return [t.contiguous().view(torch.uint8).numpy().copy() for t in caches.values()]


@pytest.mark.parametrize("part", ["whole", "first", "last", "middle"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_record_lands_as_view_by_view_copies_put_it(name: str, part: str) -> None:
    factor = 1 if name == "mla" else 4
    expected_caches, groups, num_blocks = LAYOUTS[name](CPU)
    caches, _, _ = LAYOUTS[name](CPU)  # the same bytes, another copy
    rng = np.random.default_rng(len(name) + len(part))
    for group in range(len(groups)):
        layouts = [build_layout(c, groups, num_blocks) for c in (expected_caches, caches)]
        records = RecordLayout.of(layouts[0], factor)
        record = rng.integers(0, 256, records.record_bytes, dtype=np.uint8)
        first, count = {"whole": (0, factor), "first": (factor - 2, 2), "last": (0, 3),
                        "middle": (1, 2)}[part] if factor > 1 else (0, 1)  # fmt: skip
        blocks = rng.permutation(num_blocks)[:count].astype(np.int64)
        _reference(layouts[0], records, record, group, first, blocks)
        RecordScatter(layouts[1], records)(record, group, first, blocks)
        for want, got in zip(_engine_bytes(expected_caches), _engine_bytes(caches), strict=True):
            assert np.array_equal(want, got), (name, part, group)


def _calls(views: int) -> int:
    backing = torch.zeros(views // 2, 2, 16, 4, 8)  # one allocation, as vLLM's
    caches = {f"layer.{i}": backing[i] for i in range(views // 2)}
    layout = build_layout(caches, [list(caches)], 16)
    records = RecordLayout.of(layout, 4)
    scatter = RecordScatter(layout, records)
    record = np.ones(records.record_bytes, dtype=np.uint8)
    calls = Calls(RecordScatter.__call__.__code__)
    with profiled(calls):
        scatter(record, 0, 0, np.array([3, 9, 1, 12]))  # a whole chunk
        scatter(record, 0, 1, np.array([5, 6]))  # a partial one
    assert all(float(v.abs().sum()) > 0 for v in caches.values())  # every view was written
    return calls.count


def test_a_records_calls_are_the_same_at_any_number_of_views() -> None:
    counts = {views: _calls(views) for views in (8, 32, 128)}
    assert len(set(counts.values())) == 1, counts


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_whole_chunk_is_assigned_from_the_record_not_a_copy_of_it(name: str) -> None:
    """Whatever the storages (``separate``: one per layer, as the benches' engines), a whole chunk's
    rows go from the record itself: what the call allocates is indices, not the record's bytes
    (before, a layout of several storages built masks over every view and gathered the rows)."""
    factor = 1 if name == "mla" else 4
    caches, groups, num_blocks = LAYOUTS[name](CPU)
    layout = build_layout(caches, groups, num_blocks)
    records = RecordLayout.of(layout, factor)
    record = np.full(records.record_bytes, 7, dtype=np.uint8)
    scatter = RecordScatter(layout, records)
    for group in range(len(groups)):
        blocks = np.random.default_rng(group).permutation(num_blocks)[:factor].astype(np.int64)
        tracemalloc.start()
        try:
            scatter(record, group, 0, blocks)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < records.record_bytes // 4, (name, group, peak, records.record_bytes)
        for view in layout.groups[group]:
            assert np.all(layout.views[view].numpy().view(np.uint8)[blocks] == 7), (name, view)


def _mixed() -> dict[str, torch.Tensor]:
    """One group whose layers differ in page size (vLLM's ``UniformTypeKVCacheSpecs``): two
    carved from one allocation, one of its own."""
    shapes = [(2, 12, 16, 2, 32), (2, 12, 16, 1, 32)]
    sizes = [int(np.prod(shape)) for shape in shapes]
    backing = torch.arange(sum(sizes), dtype=torch.float32).to(torch.bfloat16)
    first = backing[: sizes[0]].view(shapes[0])
    second = backing[sizes[0] :].view(shapes[1])
    return {"l0": first, "l1": second, "l2": torch.ones(2, 12, 16, 4, 32, dtype=torch.bfloat16)}


@pytest.mark.parametrize(("first", "count"), [(0, 4), (1, 2), (0, 3), (3, 1)])
def test_views_of_several_page_sizes_and_storages_land_as_view_by_view_copies(
    first: int, count: int
) -> None:
    expected, caches = _mixed(), _mixed()
    layouts = [build_layout(c, [list(c)], 12) for c in (expected, caches)]
    records = RecordLayout.of(layouts[0], 4)
    assert len(set(layouts[0].page_bytes)) == 3
    record = np.random.default_rng(first).integers(0, 256, records.record_bytes, dtype=np.uint8)
    blocks = np.random.default_rng(count).permutation(12)[:count].astype(np.int64)
    _reference(layouts[0], records, record, 0, first, blocks)
    RecordScatter(layouts[1], records)(record, 0, first, blocks)
    for want, got in zip(_engine_bytes(expected), _engine_bytes(caches), strict=True):
        assert np.array_equal(want, got), (first, count)
