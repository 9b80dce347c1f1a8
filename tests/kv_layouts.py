"""Every KV layout vLLM hands a connector on CUDA, built small, on any device: the tests of
``kvtier.pages`` run them on the CPU (``tests/unit/test_pages.py``) and on a GPU
(``tests/gpu/test_pages_cuda.py``).

Each builder returns ``(kv_caches, group_layers, num_blocks)`` as vLLM would register them: the
layers' tensors carved from ONE allocation (vLLM 0.32's ``KVCacheTensor`` placements), filled
with random bytes. Sizes are the real ones where they matter (a page's bytes), shrunk elsewhere
(layers, blocks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NUM_BLOCKS = 24
Built = tuple[dict[str, torch.Tensor], list[list[str]], int]


def _backing(nbytes: int, device: torch.device, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)
    return noise.to(device)


def _layers(
    device: torch.device,
    layers: int,
    physical: tuple[int, ...],
    order: tuple[int, ...],
    dtype: torch.dtype,
    seed: int,
) -> list[torch.Tensor]:
    """``layers`` tensors of physical shape ``physical`` back to back in one allocation, each
    permuted by ``order`` into the logical shape vLLM's backend uses."""
    item = torch.empty((), dtype=dtype).element_size()
    per_layer = 1
    for n in physical:
        per_layer *= n
    backing = _backing(layers * per_layer * item, device, seed).view(dtype)
    return [
        backing[i * per_layer : (i + 1) * per_layer].view(physical).permute(order)
        for i in range(layers)
    ]


def flash_attn(device: torch.device, hnd: bool = False) -> Built:
    """FlashAttention: (2, blocks, block_size, heads, head_dim) bf16; HND stores heads first."""
    bs, heads, dim = 16, 2, 64
    physical = (2, NUM_BLOCKS, heads, bs, dim) if hnd else (2, NUM_BLOCKS, bs, heads, dim)
    order = (0, 1, 3, 2, 4) if hnd else (0, 1, 2, 3, 4)
    tensors = _layers(device, 3, physical, order, torch.bfloat16, seed=1)
    caches = {f"layer.{i}": t for i, t in enumerate(tensors)}
    return caches, [list(caches)], NUM_BLOCKS


def flashinfer(device: torch.device, hnd: bool = False) -> Built:
    """FlashInfer: (blocks, 2, block_size, heads, head_dim): a block's K and V adjacent."""
    bs, heads, dim = 16, 2, 64
    physical = (NUM_BLOCKS, 2, heads, bs, dim) if hnd else (NUM_BLOCKS, 2, bs, heads, dim)
    order = (0, 1, 3, 2, 4) if hnd else (0, 1, 2, 3, 4)
    tensors = _layers(device, 3, physical, order, torch.bfloat16, seed=2)
    caches = {f"layer.{i}": t for i, t in enumerate(tensors)}
    return caches, [list(caches)], NUM_BLOCKS


def mla(device: torch.device) -> Built:
    """MLA: one latent per token, (blocks, 64, 576) bf16: 72 KiB pages."""
    tensors = _layers(device, 2, (NUM_BLOCKS, 64, 576), (0, 1, 2), torch.bfloat16, seed=3)
    caches = {f"layer.{i}": t for i, t in enumerate(tensors)}
    return caches, [list(caches)], NUM_BLOCKS


def fp8(device: torch.device) -> Built:
    """An fp8 KV cache: FlashAttention's shape, one byte per value."""
    physical = (2, NUM_BLOCKS, 16, 2, 64)
    tensors = _layers(device, 3, physical, (0, 1, 2, 3, 4), torch.float8_e4m3fn, seed=4)
    caches = {f"layer.{i}": t for i, t in enumerate(tensors)}
    return caches, [list(caches)], NUM_BLOCKS


def tp_one_head(device: torch.device) -> Built:
    """A tensor-parallel rank holding one KV head: 4 KiB pages at head_dim 128, 16-token blocks."""
    tensors = _layers(device, 4, (2, NUM_BLOCKS, 16, 1, 128), (0, 1, 2, 3, 4), torch.bfloat16, 5)
    caches = {f"layer.{i}": t for i, t in enumerate(tensors)}
    return caches, [list(caches)], NUM_BLOCKS


def hybrid(device: torch.device) -> Built:
    """A hybrid model: a full-attention group and a sliding-window group whose layers alias the
    same memory (vLLM 0.32), each group's job with its own number of blocks."""
    tensors = _layers(device, 2, (2, NUM_BLOCKS, 16, 2, 64), (0, 1, 2, 3, 4), torch.bfloat16, 6)
    caches = {"full.0": tensors[0], "full.1": tensors[1]}
    caches |= {"swa.0": tensors[0], "swa.1": tensors[1]}
    return caches, [["full.0", "full.1"], ["swa.0", "swa.1"]], NUM_BLOCKS


def cross_layer(device: torch.device) -> Built:
    """Blocks outermost across layers (vLLM's layout with the layers dimension): all layers'
    K and V of a block adjacent, each layer a strided (2, blocks, bs, heads, dim) view."""
    layers, bs, heads, dim = 3, 16, 2, 64
    backing = _backing(NUM_BLOCKS * layers * 2 * bs * heads * dim * 2, device, 7)
    whole = backing.view(torch.bfloat16).view(NUM_BLOCKS, layers, 2, bs, heads, dim)
    caches = {f"layer.{i}": whole[:, i].permute(1, 0, 2, 3, 4) for i in range(layers)}
    return caches, [list(caches)], NUM_BLOCKS


def separate(device: torch.device) -> Built:
    """Each layer its own allocation (not how vLLM allocates; how tests and other engines may)."""
    caches = {f"layer.{i}": _layers(device, 1, (2, NUM_BLOCKS, 16, 2, 32), (0, 1, 2, 3, 4),
                                    torch.bfloat16, 10 + i)[0] for i in range(3)}  # fmt: skip
    return caches, [list(caches)], NUM_BLOCKS


LAYOUTS: dict[str, Callable[[torch.device], Built]] = {
    "flash_attn": flash_attn,
    "flash_attn_hnd": lambda device: flash_attn(device, hnd=True),
    "flashinfer": flashinfer,
    "flashinfer_hnd": lambda device: flashinfer(device, hnd=True),
    "mla": mla,
    "fp8": fp8,
    "tp_one_head": tp_one_head,
    "hybrid": hybrid,
    "cross_layer": cross_layer,
    "separate": separate,
}


def round_trip(
    name: str,
    device: torch.device,
    stage_bytes: int,
    staged: bool | None = None,
    mechanism: str = "dma",
    pinned: bool = True,
    host_piece: int = 0,
    grids: bool = False,
    triton: bool | None = None,
    programs: int | None = None,
) -> dict[str, int]:
    """Store a job of scattered blocks (its first and last chunks partial) into scattered host
    slots through ``PageMover`` (``staged``, ``mechanism``: how, see
    ``kvtier.pages.mover``), check every host page and every other host byte, then load the
    records into other blocks and check every engine tensor, logically. ``host_piece``: the
    host tier pinned in pieces of that many bytes (on CUDA), and no host copy over one's
    end. ``grids``: the pages given to the mover as ``PageGrid``s, as the host tier's
    handlers give them. ``triton``: the mover's kernels on or off (None: its default);
    ``programs``: a launch's (None: the kernels'). Returns what the plan did: its batches,
    gathers and host copies, the grids it was given, and what DMA stages of them
    (``staged_grids.py``)."""
    import numpy as np

    from kvtier.addresses import EngineBlocks, HostChunks
    from kvtier.layout import build_layout
    from kvtier.pages import PageMover, Pages
    from kvtier.pages.mechanism import Mechanisms
    from kvtier.pages.mover import Grids
    from kvtier.tiers.base.chunk_plan import plan_copy
    from kvtier.tiers.host.buffers import HostTier

    caches, groups, num_blocks = LAYOUTS[name](device)
    layout = build_layout(caches, groups, num_blocks)
    factor = 1 if name == "mla" else 4
    host = HostTier(layout, 12, factor, **({"pin_piece_bytes": host_piece} if host_piece else {}))
    if host.pinning is not None:  # all of it: a kernel must not address memory not pinned
        assert host.pinning.wait(60) and host.pinned
    rng = np.random.default_rng(len(name))
    host.memory_np[:] = rng.integers(0, 256, host.memory_np.shape, dtype=np.uint8)
    sizes = (9, 3) if len(groups) == 2 else (9,)
    starts = (2, 5) if len(groups) == 2 else (2,)
    order = rng.permutation(num_blocks)
    source, target = order[: sum(sizes)], order[sum(sizes) : 2 * sum(sizes)]
    spans = [-(-(n + s % factor) // factor) for n, s in zip(sizes, starts, strict=True)]
    slots = HostChunks(rng.permutation(12)[: sum(spans)].astype(np.int64))

    def pages_of(
        blocks: np.ndarray,
    ) -> tuple[Pages, Pages | Grids, list[tuple[int, int, int, int]]]:
        engine = EngineBlocks(blocks.astype(np.int64), sizes, starts)
        plan = plan_copy(engine, slots, factor)
        mapped = [(c.group, int(b), *divmod(int(r), factor))
                  for c in plan for b, r in zip(c.block_ids, c.host_rows, strict=True)]  # fmt: skip
        pages = Pages.join([host.page_map(c.group, c.block_ids, c.host_rows) for c in plan])
        given = [host.page_grid(c.group, c.block_ids, c.host_rows) for c in plan]
        return pages, given if grids else pages, mapped

    def page(view: int, block: int) -> np.ndarray:
        return layout.views[view][block].view(torch.uint8).cpu().numpy()

    more = {} if programs is None else {"programs": programs}
    mover = PageMover(layout.views, stage_bytes, Mechanisms.parse(mechanism), staged=staged,
                      host_piece=host_piece, triton=triton, **more)  # fmt: skip
    pages, given, mapped = pages_of(source)
    before = host.memory_np.copy()
    batches = mover.batches(pages)
    staged = mover.staged_batches(given) if grids else []  # the DMA mechanism's, on grids
    mover.store(given, host.memory.view(-1), pinned)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    written = np.zeros(before.shape, dtype=bool)
    for group, block, slot, sub in mapped:
        for view in layout.groups[group]:
            there = host.page(group, view, slot, sub)
            assert (there == page(view, block)).all(), (name, group, view, block, slot, sub)
            start = there.ctypes.data - host.memory_np[slot].ctypes.data
            written[slot, start : start + len(there)] = True
    assert (host.memory_np[~written] == before[~written]).all(), f"{name}: other host bytes"

    original = {layer: tensor.clone() for layer, tensor in caches.items()}
    _, moved, _ = pages_of(target)
    mover.load(moved, host.memory.view(-1), pinned)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    pairs = dict(zip(target.tolist(), source.tolist(), strict=True))
    for layer, tensor in caches.items():
        dim = next(d for d, n in enumerate(tensor.shape) if n == num_blocks)
        for block in range(num_blocks):
            expected = original[layer].select(dim, pairs.get(block, block))
            got = tensor.select(dim, block)
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), (layer, block)
    return {
        "batches": len(batches),
        "gathers": sum(len(b.gathers) for b in batches),
        "copies": sum(len(b.copies) for b in batches),
        "chunks": len(slots.slots),
        "grids": len(given) if grids else 0,  # PageGrids given each way
        "staged_batches": len(staged),  # given as grids: DMA's batches and their host copies
        "staged_grids": sum(len(b.grids) for b in staged),
        "staged_copies": sum(len(b.copies) for b in staged),
        "spaces": len(mover.spaces.tensors),
    }
