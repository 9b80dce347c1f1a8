"""Every KV layout vLLM hands a connector on CUDA (``tests/kv_layouts.py``), moved by
``kvtier.pages`` between CUDA engine memory and pinned host records, byte-exact both ways, on
scattered blocks and slots with partial first and last chunks, by each mechanism (needs CUDA)."""

from __future__ import annotations

import pytest
import torch
from kv_layouts import LAYOUTS, round_trip

from kvtier.pages import kernel

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mechanism", ["dma", "kernel"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_moves_byte_exact_both_ways(name: str, mechanism: str) -> None:
    done = round_trip(name, torch.device("cuda"), stage_bytes=64 << 20, mechanism=mechanism)
    assert done["gathers"] == done["spaces"]


@pytest.mark.parametrize("mechanism", ["dma", "kernel", "store=dma,load=kernel"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_moves_byte_exact_given_as_grids(name: str, mechanism: str) -> None:
    """As the host tier's handlers give pages: ``kernel``, the grid kernel computes every
    page's addresses on the device; ``dma``, it moves them into records staged on the device,
    then the copy engine (``staged_grids.py``); or each direction its own way."""
    done = round_trip(name, torch.device("cuda"), 64 << 20, mechanism=mechanism, grids=True,
                      host_piece=3 * 4096)  # fmt: skip
    assert done["chunks"] > 0


@pytest.mark.parametrize("mechanism", ["dma", "kernel"])
@pytest.mark.parametrize("name", ["flash_attn", "fp8", "mla", "hybrid", "tp_one_head"])
def test_grids_of_many_steps_a_program_are_byte_exact(name: str, mechanism: str) -> None:
    """Three programs a launch: each takes many steps, of several small pages (the compiled
    ``_grid_pages``: every page a row of one tile) or of one large page."""
    done = round_trip(name, torch.device("cuda"), 64 << 20, mechanism=mechanism, grids=True,
                      programs=3)  # fmt: skip
    assert done["grids"] > 0


@pytest.mark.parametrize("name", ["flash_attn", "mla", "hybrid", "separate"])
def test_staged_grids_reuse_the_staging_area_in_stream_order(name: str) -> None:
    done = round_trip(name, torch.device("cuda"), stage_bytes=3 * 4096, mechanism="dma",
                      grids=True, host_piece=3 * 4096)  # fmt: skip
    assert done["staged_batches"] > 1


@pytest.mark.parametrize("mechanism", ["dma", "kernel"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_moves_byte_exact_over_pinned_pieces(name: str, mechanism: str) -> None:
    """The host tier registered in pieces of 3 OS pages: CUDA refuses a copy over two, so every
    run of records over a piece's end must be cut there (at 8B scale on an H200 it was not)."""
    done = round_trip(name, torch.device("cuda"), 64 << 20, mechanism=mechanism,
                      host_piece=3 * 4096)  # fmt: skip
    assert done["gathers"] == done["spaces"]


@pytest.mark.parametrize("name", ["flash_attn", "mla", "separate"])
def test_batches_reuse_the_staging_area_in_stream_order(name: str) -> None:
    done = round_trip(name, torch.device("cuda"), stage_bytes=3 * 4096)
    assert done["batches"] > 1


def test_memory_not_pinned_moves_by_the_copy_engine() -> None:
    """The kernel reads host memory only when it is pinned; before, the DMA path moves it."""
    round_trip("flash_attn", torch.device("cuda"), 64 << 20, mechanism="kernel", pinned=False)
    round_trip("flash_attn", torch.device("cuda"), 64 << 20, mechanism="kernel", pinned=False,
               grids=True)  # fmt: skip


def test_triton_runs_here() -> None:
    """The GPU machine has Triton: the bounded-program kernel is what gathers, and it reaches
    registered host memory at its host addresses (the ``kernel`` mechanism, an engine's)."""
    assert kernel.available()
    assert kernel.reaches_host(torch.device("cuda"))
