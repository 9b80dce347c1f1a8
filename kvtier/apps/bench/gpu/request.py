"""The request every figure moves: ``tokens`` tokens in scattered engine blocks and host slots.

Request.of(shape, tokens, num_blocks, seed)   per group its blocks (a sliding group only
                                              its window, at the request's end), scattered
                                              over the engine; its chunks' host slots a
                                              random permutation of a tier twice its size
.engine / .slots / .chunk_groups / .nbytes    its ``EngineBlocks``, ``HostChunks``, each
                                              chunk's group, the bytes it moves
.elsewhere(num_blocks, seed)                  the same request in other engine blocks
.keys(digest)                                 its chunks' keys, in ``slots`` order
engine_blocks_for(shape, tokens)              engine blocks an engine needs for two copies
same_pages(left, a, right, b)                 whether blocks ``a`` of one engine hold, byte
                                              for byte, what blocks ``b`` of another hold
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.apps.bench.gpu.shapes import Shape
from kvtier.keys import ChunkKey, make_key
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_plan import chunks_spanned


@dataclass(frozen=True)
class Request:
    engine: EngineBlocks
    slots: HostChunks
    chunk_groups: tuple[int, ...]  # per chunk, in slot order: its group
    host_chunks: int  # slots of the host tier the slots are drawn from
    nbytes: int  # bytes of the request's pages, every view of every block

    @classmethod
    def of(cls, shape: Shape, layout: KVLayout, tokens: int, seed: int) -> Request:
        sizes, starts = group_blocks(shape, tokens)
        spans = [chunks_spanned(n, s, shape.factor) for n, s in zip(sizes, starts, strict=True)]
        rng = np.random.default_rng(seed)
        blocks = rng.permutation(layout.num_blocks)[: sum(sizes)].astype(np.int64)
        host_chunks = 2 * sum(spans)
        slots = rng.permutation(host_chunks)[: sum(spans)].astype(np.int64)
        groups = tuple(g for g, span in enumerate(spans) for _ in range(span))
        nbytes = sum(n * sum(layout.page_bytes[v] for v in layout.groups[g])
                     for g, n in enumerate(sizes))  # fmt: skip
        engine = EngineBlocks(blocks, tuple(sizes), tuple(starts))
        return cls(engine, HostChunks(slots), groups, host_chunks, nbytes)

    def elsewhere(self, num_blocks: int, seed: int) -> EngineBlocks:
        """The request's groups in other scattered blocks of an engine of ``num_blocks``,
        none of them the request's own."""
        rng = np.random.default_rng(seed)
        free = np.setdiff1d(np.arange(num_blocks), self.engine.block_ids)
        count = len(self.engine.block_ids)
        if len(free) < count:
            raise ValueError(f"{num_blocks} blocks hold no second copy of {count}")
        blocks = rng.permutation(free)[:count].astype(np.int64)
        return EngineBlocks(blocks, self.engine.group_sizes, self.engine.block_indices)

    def keys(self, digest: bytes) -> tuple[ChunkKey, ...]:
        return tuple(make_key(digest, i, g) for i, g in enumerate(self.chunk_groups))

    def group_ids(self, engine: EngineBlocks) -> list[list[int]]:
        """``engine``'s block ids as one list per group (the peer tier's form)."""
        bounds = np.cumsum([0, *engine.group_sizes])
        return [engine.block_ids[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:])]


def group_blocks(shape: Shape, tokens: int) -> tuple[list[int], list[int]]:
    """Per group: the request's blocks and the logical index of its first."""
    if tokens % shape.chunk_tokens:
        raise ValueError(f"--tokens: {tokens} is not a multiple of {shape.chunk_tokens}")
    blocks = tokens // shape.block_tokens
    sizes, starts = [blocks], [0]
    if shape.sliding_layers:
        window = min(shape.window_tokens, tokens) // shape.block_tokens
        sizes.append(window)
        starts.append(blocks - window)
    return sizes, starts


def engine_blocks_for(shape: Shape, tokens: int) -> int:
    """An engine's blocks: room for the request twice (a load lands in other blocks)."""
    return 2 * sum(group_blocks(shape, tokens)[0]) + 8


def same_pages(left: KVLayout, a: EngineBlocks, right: KVLayout, b: EngineBlocks) -> bool:
    """Group by group, view by view: blocks ``a`` of ``left`` against blocks ``b`` of
    ``right`` (two engines of one shape, or one engine twice)."""
    bounds = np.cumsum([0, *a.group_sizes])
    for g, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        ids_a = torch.from_numpy(a.block_ids[start:stop]).to(left.device)
        ids_b = torch.from_numpy(b.block_ids[start:stop]).to(right.device)
        for view in left.groups[g]:
            got = left.views[view].index_select(0, ids_a)
            want = right.views[view].index_select(0, ids_b)
            if not torch.equal(got, want):
                return False
    return True
