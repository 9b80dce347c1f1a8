"""The one way kvtier moves engine pages and host memory (``kvtier.pages``), on CPU tensors: every
KV layout vLLM hands a connector on CUDA (``tests/kv_layouts.py``), byte-exact both ways, on
scattered blocks and scattered host slots, partial first and last chunks included; and what the
plan is made of (one gather per storage, one host copy per run of adjacent records)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kv_layouts import LAYOUTS, round_trip

from kvtier.layout import build_layout
from kvtier.pages import PageMover, Pages, grid, kernel
from kvtier.pages.mechanism import GPU_COPY_ENV, Mechanism, Mechanisms, gpu_mechanisms
from kvtier.pages.plan import plan_batches
from kvtier.pages.spaces import Spaces
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.pinning import Pinning

CPU = torch.device("cpu")


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_moves_byte_exact_both_ways(name: str, staged: bool) -> None:
    """``direct``: the CPU engine's path; ``staged``: a GPU's (gather into a staging area laid
    out as host memory, then one host copy per run), run here on CPU tensors."""
    done = round_trip(name, CPU, stage_bytes=64 << 20, staged=staged)
    assert done["batches"] == 1
    assert done["spaces"] == (3 if name == "separate" else 1)  # vLLM: one allocation
    assert done["gathers"] == done["spaces"]


@pytest.mark.parametrize("name", ["flash_attn", "mla", "hybrid", "separate"])
def test_a_job_larger_than_the_staging_area_moves_in_batches(name: str) -> None:
    done = round_trip(name, CPU, stage_bytes=3 * 4096, staged=True)
    assert done["batches"] > 1


def _host(factor: int, host_piece: int = 0) -> tuple[HostTier, PageMover]:
    backing = torch.zeros(2, 2, 32, 16, 2, 64, dtype=torch.bfloat16)  # one allocation, as vLLM's
    caches = {f"l{i}": backing[i] for i in range(2)}
    layout = build_layout(caches, [list(caches)], 32)
    return HostTier(layout, 16, factor), PageMover(layout.views, host_piece=host_piece)


def test_whole_chunks_in_consecutive_slots_are_one_host_copy() -> None:
    host, mover = _host(4)
    pages = host.page_map(0, np.arange(12), np.arange(20, 32))  # slots 5, 6, 7, whole
    (batch,) = mover.batches(pages)
    assert batch.copies.tolist() == [[5 * host.record_bytes, 0, 3 * host.record_bytes]]


def test_whole_chunks_in_scattered_slots_are_one_host_copy_each() -> None:
    host, mover = _host(4)
    rows = np.concatenate([np.arange(4) + 4 * s for s in (9, 2, 14)])
    (batch,) = mover.batches(host.page_map(0, np.arange(12), rows))
    record = host.record_bytes
    assert sorted(batch.copies[:, 0].tolist()) == [2 * record, 9 * record, 14 * record]
    assert (batch.copies[:, 2] == record).all()
    assert len(batch.gathers) == 1 and batch.gathers[0].staged is None  # one index_select


def test_a_partial_chunk_is_copied_view_by_view() -> None:
    """Sub-blocks 1..3 of a slot: in each of the 4 views (2 layers, K and V) a run of 3 pages,
    not adjacent to the next view's: one copy per view, never the whole record."""
    host, mover = _host(4)
    (batch,) = mover.batches(host.page_map(0, np.array([7, 8, 9]), np.array([1, 2, 3]) + 4 * 6))
    page = host.records.page_bytes[0]
    assert len(batch.copies) == 4
    assert (batch.copies[:, 2] == 3 * page).all()


def test_pages_are_rows_of_one_unit_however_the_layout_lies() -> None:
    caches = {"a": torch.zeros(2, 8, 16, 2, 64, dtype=torch.bfloat16)}
    views = build_layout(caches, [["a"]], 8).views
    spaces = Spaces.of(views)
    assert spaces.unit == 4096 and (spaces.units == 1).all()  # a page per row
    space, first = spaces.rows_of(np.array([0, 1]), np.array([3, 3]))
    assert space.tolist() == [0, 0] and first.tolist() == [3, 8 + 3]  # V after all K blocks


def test_batches_stay_within_the_staging_area() -> None:
    host, mover = _host(4)
    pages = host.page_map(0, np.arange(32), np.arange(32))
    page = host.records.page_bytes[0]
    batches = plan_batches(pages, mover.spaces, mover.page_bytes, 5 * page)
    assert all(batch.nbytes <= 5 * page for batch in batches)
    assert sum(batch.nbytes for batch in batches) == 32 * 4 * page
    staged = np.concatenate([b.copies[:, 0] for b in batches])
    assert len(np.unique(staged)) == len(staged)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_cut_host_copies_move_byte_exact(name: str) -> None:
    """A host tier pinned in pieces of 3 OS pages: every run over a piece's end is two copies."""
    whole = round_trip(name, CPU, stage_bytes=64 << 20, staged=True)
    cut = round_trip(name, CPU, stage_bytes=64 << 20, staged=True, host_piece=3 * 4096)
    assert cut["copies"] > whole["copies"]


def test_no_host_copy_crosses_a_pinned_piece() -> None:
    """CUDA refuses a copy over two registrations ("invalid argument", an H200 at 8B scale:
    runs of 8 MiB records over the 256 MiB pieces the tier is pinned in)."""
    piece = 10 * 4096  # not a divisor of the 64 KiB record: pieces end inside records too
    host, mover = _host(4, host_piece=piece)
    pages = host.page_map(0, np.arange(12), np.arange(20, 32))  # slots 5, 6, 7: one run
    (batch,) = mover.batches(pages)
    at, staged, size = batch.copies.T
    assert (at // piece == (at + size - 1) // piece).all()
    assert size.sum() == 3 * host.record_bytes
    assert at[0] == 5 * host.record_bytes and (at[1:] == at[:-1] + size[:-1]).all()
    assert staged[0] == 0 and (staged[1:] == staged[:-1] + size[:-1]).all()
    assert len(batch.copies) == len(range(at[0] // piece, (at[-1] + size[-1] - 1) // piece + 1))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_moves_byte_exact_given_as_grids(name: str) -> None:
    """The host tier's handlers give the mover grids; without the grid kernel they are pages."""
    round_trip(name, CPU, stage_bytes=64 << 20, staged=True, grids=True)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_grid_tables_say_the_pages_of_the_page_map(name: str) -> None:
    """What the grid kernel computes on the device (``grid.addresses``, its reference) from
    ``V + K`` table entries is each page's engine and host address, as the page table says."""
    caches, groups, num_blocks = LAYOUTS[name](CPU)
    layout = build_layout(caches, groups, num_blocks)
    factor = 1 if name == "mla" else 4
    host = HostTier(layout, 12, factor)
    base = host.memory.data_ptr()
    rng = np.random.default_rng(0)
    picks = [(g, rng.permutation(num_blocks)[:7], rng.permutation(12 * factor)[:7])
             for g in range(len(groups))]  # fmt: skip
    table = grid.view_table(layout.views)
    found = grid.tables([host.page_grid(*pick) for pick in picks], table, base)
    assert found is not None
    views = layout.views
    for index, pick in enumerate(picks):
        pages = host.page_map(*pick)
        engine, hosted, size = grid.addresses(*found.of(index), base)
        pairs = zip(pages.views.tolist(), pages.blocks.tolist(), strict=True)
        item = [v.element_size() for v in views]
        assert engine.tolist() == [views[v].data_ptr() + b * views[v].stride(0) * item[v]
                                   for v, b in pairs]  # fmt: skip
        assert hosted.tolist() == (base + pages.host).tolist()
        assert size.tolist() == [views[v].shape[1] * views[v].element_size()
                                 for v in pages.views.tolist()]  # fmt: skip
    assert grid.tables([host.page_grid(*picks[0])], table, base + 4) is None  # not in words


def test_no_pages_is_no_batch() -> None:
    host, mover = _host(2)
    assert mover.batches(Pages.join([])) == []
    assert mover.store(Pages.join([]), host.memory.view(-1)) == 0


def test_on_the_cpu_a_host_run_is_one_copy_cut_for_the_lanes() -> None:
    """Whole chunks in slots 5..7 (one run of 3 records): pieces of about a record each, which
    lanes may run in any order."""
    backing = torch.randint(-(2**15), 2**15, (2, 2, 32, 16, 2, 64), dtype=torch.int16)
    caches = {f"l{i}": backing[i] for i in range(2)}
    layout = build_layout(caches, [list(caches)], 32)
    host, mover = HostTier(layout, 16, 4), PageMover(layout.views)
    pages = host.page_map(0, np.arange(12), np.arange(20, 32))
    pieces = mover.pieces(pages, host.memory.view(-1), True, host.record_bytes)
    assert len(pieces) == 3
    for piece in reversed(pieces):
        piece()
    for block in range(12):
        for view in range(4):
            page = layout.views[view][block].view(torch.uint8).numpy()
            assert (host.page(0, view, 5 + block // 4, block % 4) == page).all()


def test_direct_copies_refuse_a_staged_mover() -> None:
    host, _ = _host(2)
    mover = PageMover([torch.zeros(32, 4096, dtype=torch.bfloat16)], staged=True)
    with pytest.raises(ValueError, match="on the CPU"):
        mover.pieces(host.page_map(0, np.arange(2), np.arange(2)), host.memory.view(-1), True, 1)


@pytest.mark.parametrize("piece", [0, 1000, 4096 + 8])
def test_a_pinning_piece_that_is_not_whole_os_pages_is_refused(piece: int) -> None:
    """Two registrations may not share a page of memory; the error names the value."""
    with pytest.raises(ValueError, match=f"piece_bytes .* got {piece}"):
        Pinning(torch.empty(1 << 16, dtype=torch.uint8), CPU, piece)


def test_a_gpu_moves_pages_by_the_kernel_unless_the_environment_says_dma(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views = [torch.zeros(4, 8, dtype=torch.int64)]
    kernel_, dma = Mechanism.KERNEL, Mechanism.DMA
    monkeypatch.delenv(GPU_COPY_ENV, raising=False)
    assert PageMover(views).mechanisms == (kernel_, kernel_)
    monkeypatch.setenv(GPU_COPY_ENV, " DMA ")
    assert PageMover(views).mechanisms == (dma, dma)
    assert PageMover(views, mechanism=kernel_).mechanisms == (kernel_, kernel_)  # named
    both = Mechanisms(store=dma, load=kernel_)
    assert PageMover(views, mechanism=both).mechanisms == both


@pytest.mark.parametrize(
    ("value", "store", "load"),
    [("store=dma,load=kernel", "dma", "kernel"), (" Load = DMA ", "kernel", "dma"),
     ("store=dma", "dma", "kernel"), ("", "kernel", "kernel"), ("kernel", "kernel", "kernel")],
)  # fmt: skip
def test_each_direction_may_have_its_own_mechanism(
    monkeypatch: pytest.MonkeyPatch, value: str, store: str, load: str
) -> None:
    monkeypatch.setenv(GPU_COPY_ENV, value)
    chosen = gpu_mechanisms()
    assert chosen == (Mechanism(store), Mechanism(load))
    assert Mechanisms.parse(str(chosen)) == chosen  # what bench gpu reports, taken back


@pytest.mark.parametrize("value", ["fast", "store=fast", "copy=dma", "store:dma", "dma,kernel"])
def test_a_mechanism_that_is_neither_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(GPU_COPY_ENV, value)
    with pytest.raises(ValueError, match=f"KVTIER_GPU_COPY must be .* got {value!r}"):
        PageMover([torch.zeros(4, 8, dtype=torch.int64)])


def test_a_gpu_the_driver_cannot_vouch_for_never_has_the_kernel_touch_host_memory() -> None:
    """Without a CUDA driver to ask (this machine), ``reaches_host`` says no rather than fail:
    an engine there would move host memory by the copy engine."""
    assert kernel.reaches_host(torch.device("cuda", 0)) is False
