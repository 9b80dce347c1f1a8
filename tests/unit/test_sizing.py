"""Host sizing (DESIGN §4, vLLM PR #39617): distinct engine memory, budget of the whole engine."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.layout import (
    Placement,
    build_layout,
    host_num_chunks,
    placement_bytes_per_block,
)
from kvtier.tiers.host.buffers import HostTier


@st.composite
def engines(draw: st.DrawFn) -> dict[str, object]:
    return {
        "pages": draw(st.lists(st.sampled_from([64, 128, 256, 512]), min_size=1, max_size=4)),
        "num_groups": draw(st.integers(1, 3)),
        "num_blocks": draw(st.integers(0, 12)),
        "world_size": draw(st.integers(1, 8)),
        "factor": draw(st.integers(1, 8)),
        "budget": draw(st.integers(0, 1 << 22)),
    }


@settings(max_examples=200, deadline=None)
@given(engines())
def test_host_chunks_follow_the_formula(engine: dict[str, object]) -> None:
    pages: list[int] = engine["pages"]  # type: ignore[assignment]
    groups, blocks = int(engine["num_groups"]), int(engine["num_blocks"])  # type: ignore[call-overload]
    world, factor = int(engine["world_size"]), int(engine["factor"])  # type: ignore[call-overload]
    budget = int(engine["budget"])  # type: ignore[call-overload]

    # One backing allocation, layer-outer; every group aliases the same tensors (vLLM 0.32).
    backing = torch.zeros(blocks * sum(pages), dtype=torch.uint8)
    tensors, at = [], 0
    for page in pages:
        tensors.append(backing[at : at + blocks * page].view(blocks, page))
        at += blocks * page
    caches = {f"g{g}.l{i}": t for g in range(groups) for i, t in enumerate(tensors)}
    group_layers = [[f"g{g}.l{i}" for i in range(len(pages))] for g in range(groups)]

    expected = budget // (sum(pages) * world * factor) if blocks else 0

    layout = build_layout(caches, group_layers, blocks)
    assert host_num_chunks(layout.bytes_per_block(), world, factor, budget) == expected

    placements = [Placement(backing.numel(), tuple(layers)) for layers in group_layers]
    per_block = placement_bytes_per_block(placements, blocks)
    assert host_num_chunks(per_block, world, factor, budget) == expected

    host = HostTier(layout, expected, factor)
    assert host.memory.shape[0] == host.num_chunks == expected
    assert host.nbytes * world <= budget


def test_no_blocks_means_no_chunks() -> None:
    assert host_num_chunks(0, world_size=2, block_size_factor=4, cpu_bytes_to_use=1 << 30) == 0
    assert placement_bytes_per_block([Placement(0, ("a",))], num_blocks=0) == 0
