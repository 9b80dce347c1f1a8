"""Canonical block views of the engine's KV tensors, the groups that use them, and host sizing.

kvtier never interprets KV contents. It sees every layer tensor as one or more canonical
``(num_blocks, page_words)`` views: row ``b`` is the whole page of engine block ``b`` (the row
stride may exceed the page when the engine packs other data between blocks). A layout whose blocks
are not the outermost dimension (CUDA FlashAttention: ``(2, num_blocks, ...)``) yields one view
per leading index (K and V). Layers of different groups that alias one buffer map to the same view.

Views are typed in the widest integer word that divides the page, stride and offset (int64 for any
real KV page), which lets torch move 8 bytes per element instead of 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import product
from typing import NamedTuple

import torch

_WORDS = (torch.int64, torch.int32, torch.int16, torch.uint8)


class Placement(NamedTuple):
    """vLLM 0.32's ``KVCacheTensor``: where a set of layers lives in the one backing allocation."""

    size: int  # bytes of the backing allocation (the same for every placement of an engine)
    layers: tuple[str, ...]


@dataclass(frozen=True)
class KVLayout:
    """The engine's KV memory as kvtier copies it, for one worker rank.

    ``views[i]`` is ``(num_blocks, page_words)`` in ``word_dtype``; ``groups[g]`` lists the indices
    of the views that group ``g``'s layers live in (groups may share views). ``distinct_bytes``
    is the engine memory behind all views, each byte counted once.
    """

    views: tuple[torch.Tensor, ...]
    groups: tuple[tuple[int, ...], ...]
    num_blocks: int
    distinct_bytes: int
    orders: tuple[str, ...] = ()  # per view: how a page's dimensions lie ("": row-major)
    packing: str = ""  # how the attention kernel packs a page's values where its shape does not
    # tell ("": as the shape says): vLLM's CPU backend writes K and V in its ISA's own order

    @property
    def device(self) -> torch.device:
        return self.views[0].device if self.views else torch.device("cpu")

    @cached_property
    def page_bytes(self) -> tuple[int, ...]:
        """Bytes of one block's page in each view (computed once: jobs read it per view)."""
        return tuple(v.shape[1] * v.element_size() for v in self.views)

    @cached_property
    def group_block_bytes(self) -> tuple[int, ...]:
        """Bytes of one block in each group: its views' pages together."""
        return tuple(sum(self.page_bytes[view] for view in views) for views in self.groups)

    def bytes_per_block(self) -> int:
        """Engine bytes per block on this rank, aliased memory counted once (0 without blocks)."""
        return self.distinct_bytes // self.num_blocks if self.num_blocks else 0

    def describe(self) -> str:
        """The rank's layout as its fingerprints name it: what a chunk's bytes are, view by view.

        The one place it is written: a record of a tier and a peer transfer's identity are both
        checked against it, so they can never drift apart.
        """
        views = ",".join(f"{b}B" for b in self.page_bytes)
        described = f"views=[{views}] groups={[list(g) for g in self.groups]}"
        if any(self.orders):  # a page laid out other than row-major (vLLM's HND, NHD orders)
            described += f" orders=[{';'.join(self.orders)}]"
        if self.packing:
            described += f" packing={self.packing}"
        return described


def host_num_chunks(
    bytes_per_block: int, world_size: int, block_size_factor: int, cpu_bytes_to_use: int
) -> int:
    """How many chunks the host tier holds (DESIGN §4; vLLM PR #39617).

    ``cpu_bytes_to_use`` is the budget of the whole engine (all ranks); ``bytes_per_block`` is one
    rank's distinct engine bytes per block, so a chunk costs that times ``world_size`` times the
    factor.
    """
    chunk_bytes = bytes_per_block * world_size * block_size_factor
    return cpu_bytes_to_use // chunk_bytes if chunk_bytes > 0 else 0


def placement_bytes_per_block(placements: Sequence[Placement], num_blocks: int) -> int:
    """Bytes per block from the scheduler's view of the engine (no tensors there).

    In vLLM 0.32 every placement addresses the same backing allocation (groups overlay each other),
    so the distinct memory is that allocation, once: never ``sum(p.size)``.
    """
    if num_blocks == 0 or not placements:
        return 0
    sizes = {p.size for p in placements}
    if len(sizes) != 1:
        raise ValueError(
            f"kvtier: KV cache placements disagree on the backing size: {sorted(sizes)}"
        )
    return sizes.pop() // num_blocks


def distinct_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of memory behind ``tensors``, each byte once: the union of their storages' ranges."""
    ranges = sorted(
        {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors}
    )
    total, reach = 0, -1
    for start, nbytes in ranges:
        end = start + nbytes
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def build_layout(
    kv_caches: Mapping[str, torch.Tensor],
    group_layers: Sequence[Sequence[str]],
    num_blocks: int,
    block_dim: int | None = None,
    packing: str = "",
) -> KVLayout:
    """Build the canonical views of ``kv_caches`` (layer name -> tensor) for ``group_layers``.

    ``block_dim`` is the dimension indexing blocks; by default the outermost dimension of size
    ``num_blocks`` (pass it when that is ambiguous, e.g. a K/V-first layout with two blocks).
    ``packing``: how the attention kernel packs a page (``KVLayout.packing``).
    """
    views: list[torch.Tensor] = []
    orders: list[str] = []
    index: dict[tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype], int] = {}
    groups: list[tuple[int, ...]] = []
    for g, layers in enumerate(group_layers):
        members: list[int] = []
        for name in layers:
            if name not in kv_caches:
                raise ValueError(f"kvtier: group {g} names layer {name!r}, which has no KV tensor")
            order = page_order(kv_caches[name], num_blocks, block_dim)
            for view in block_views(kv_caches[name], num_blocks, block_dim):
                alias = (view.data_ptr(), tuple(view.shape), view.stride(), view.dtype)
                if alias not in index:
                    index[alias] = len(views)
                    views.append(view)
                    orders.append(order)
                if index[alias] not in members:
                    members.append(index[alias])
        groups.append(tuple(members))
    return KVLayout(
        views=tuple(views),
        groups=tuple(groups),
        num_blocks=num_blocks,
        distinct_bytes=distinct_storage_bytes(kv_caches.values()),
        orders=tuple(orders),
        packing=packing,
    )


def block_views(
    tensor: torch.Tensor, num_blocks: int, block_dim: int | None = None
) -> list[torch.Tensor]:
    """Canonical ``(num_blocks, page_words)`` views of one layer tensor (module docstring)."""
    dim = _find_block_dim(tensor, num_blocks) if block_dim is None else block_dim
    if not 0 <= dim < tensor.dim() or tensor.shape[dim] != num_blocks:
        raise ValueError(
            f"kvtier: dimension {dim} of a KV tensor of shape {tuple(tensor.shape)} "
            f"is not its {num_blocks} blocks"
        )
    item = tensor.element_size()
    inner = tensor.shape[dim + 1 :]
    page_bytes = math.prod(inner) * item
    if not _is_dense(inner, tensor.stride()[dim + 1 :]):
        raise ValueError(
            f"kvtier: a block's page is not contiguous in a KV tensor of shape "
            f"{tuple(tensor.shape)} and strides {tensor.stride()}"
        )
    block_stride = tensor.stride(dim) * item
    storage = tensor.untyped_storage()
    views = []
    for lead in product(*(range(n) for n in tensor.shape[:dim])):
        elements = int(tensor.storage_offset()) + sum(i * s for i, s in zip(lead, tensor.stride()))
        view = _word_view(
            storage, tensor.device, elements * item, num_blocks, page_bytes, block_stride
        )
        views.append(view)
    return views


def page_order(tensor: torch.Tensor, num_blocks: int, block_dim: int | None = None) -> str:
    """How a page's dimensions lie in memory: "" when row-major (its bytes in the order of the
    tensor's dimensions), else its shape and the order of its dimensions from outermost, e.g.
    ``"16x8x128:1,0,2"`` for a (block_size, heads, head_dim) page stored heads first (HND). Two
    engines whose pages differ only in this hold the same bytes in another order: their records
    must never be mixed, so this is part of the layout's description (``describe``)."""
    dim = _find_block_dim(tensor, num_blocks) if block_dim is None else block_dim
    shape, strides = tensor.shape[dim + 1 :], tensor.stride()[dim + 1 :]
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    outermost = sorted(dims, key=lambda d: -strides[d])
    if outermost == dims:
        return ""
    sizes = "x".join(str(n) for n in shape)
    return f"{sizes}:{','.join(str(d) for d in outermost)}"


def _find_block_dim(tensor: torch.Tensor, num_blocks: int) -> int:
    for dim, size in enumerate(tensor.shape):
        if size == num_blocks:
            return dim
    raise ValueError(
        f"kvtier: no dimension of size {num_blocks} (the number of blocks) "
        f"in a KV tensor of shape {tuple(tensor.shape)}"
    )


def _is_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether the dimensions ``shape`` with ``strides`` cover one contiguous span, in any order
    (vLLM's HND and NHD stride orders lay a page's heads and tokens out either way)."""
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(shape, strides) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _word_view(
    storage: torch.UntypedStorage,
    device: torch.device,
    offset: int,
    num_blocks: int,
    page_bytes: int,
    block_stride: int,
) -> torch.Tensor:
    # (num_blocks, page_bytes // word) in the widest word dividing page, stride and offset
    word = next(w for w in _WORDS if not (page_bytes | block_stride | offset) % _itemsize(w))
    size = _itemsize(word)
    return torch.tensor([], dtype=word, device=device).set_(
        storage, offset // size, (num_blocks, page_bytes // size), (block_stride // size, 1)
    )


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
