"""How the grid kernel is launched for a size of page (``kernel.launch_for``), as measured on an
H200 (``bench/results/gpu.md``), and what a launch asks of a job's addresses."""

from __future__ import annotations

import numpy as np
import torch

from kvtier.layout import build_layout
from kvtier.pages import PageMover, grid, kernel
from kvtier.pages.kernel import Launch, launch_for
from kvtier.tiers.host.buffers import HostTier


def test_large_pages_go_one_a_step_of_32_kib_by_32_programs() -> None:
    for page in (32 << 10, 72 << 10, 20 << 10):  # an 8B model's, MLA's, one between
        assert launch_for(page) == Launch(pages=1, block=4096, warps=8, programs=32), page
    assert launch_for(16 << 10) == Launch(pages=2, block=4096, warps=8, programs=64)


def test_small_pages_go_several_a_step_by_many_programs() -> None:
    """A 70B model's tensor-parallel rank: 4 KiB pages, four a step of 16 KiB, 256 programs;
    the smallest pages fill a step up to ``MAX_PAGES``."""
    assert launch_for(4 << 10) == Launch(pages=4, block=2048, warps=4, programs=256)
    assert launch_for(8 << 10).pages == 2
    assert launch_for(12 << 10).pages == 1  # no power of two of them fills a step
    assert launch_for(512).pages == launch_for(64).pages == kernel.MAX_PAGES
    for page in (64, 512, 4 << 10, 6 << 10, 12 << 10, 16 << 10, 100 << 10):
        launch = launch_for(page)
        assert launch.block // launch.pages * 8 >= min(page, kernel.LARGE_PAGE), page


def test_several_pages_a_step_need_16_byte_addresses_one_needs_words() -> None:
    """Several pages a step move 16-byte vectors: a job whose addresses are words but not
    16-byte multiples gets no tables for them (the mover then moves it page by page)."""
    assert launch_for(4 << 10).word == 16 and launch_for(32 << 10).word == 8
    kv = torch.zeros(2, 8, 16, 1, 128, dtype=torch.bfloat16)  # 4 KiB pages
    layout = build_layout({"a": kv}, [["a"]], 8)
    host = HostTier(layout, 4, 2)
    pages = host.page_grid(0, np.arange(4), np.arange(4))
    table = grid.view_table(layout.views)
    base = host.memory.data_ptr()
    assert grid.tables([pages], table, base, word=16) is not None
    assert grid.tables([pages], table, base + 8, word=16) is None
    assert grid.tables([pages], table, base + 8) is not None  # words: one page a step


def test_a_mover_launches_for_its_largest_page_and_may_name_its_programs() -> None:
    views = [torch.zeros(8, 2048, dtype=torch.int16), torch.zeros(8, 16384, dtype=torch.int16)]
    assert PageMover(views, triton=False).launch == launch_for(32 << 10)
    assert PageMover(views[:1], triton=False).launch == launch_for(4 << 10)
    assert PageMover(views[:1], triton=False, programs=3).launch.programs == 3
