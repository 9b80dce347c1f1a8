"""A request's block hashes, one per engine block, whatever unit vLLM hashes by.

    hashes_per_block(vllm_config, kv_cache_config) -> int   vLLM's hashes per engine block
    block_hashes(request, per_block) -> Sequence[bytes]      one per full engine block
    tokens_name_kv(request) -> bool                          its tokens alone name its KV

vLLM hashes a request's tokens every ``hash_block_size`` tokens (``Request.block_hashes``, sized
by vLLM's ``resolve_kv_cache_block_sizes``): the engine's block, except in a model of several KV
cache groups given a finer ``prefix_match_unit`` (hits inside a block). The hashes are chained,
so the one that ends an engine block names the whole prefix up to that block's end: kvtier's
core, which keys a chunk by one hash per engine block, is handed every ``per_block``-th of them
(``EveryNth``), read through to the engine's own list as it grows. Handed them all, it would take
a hash of 16 tokens' prefix for a block of 64 and serve one prompt's KV to another. A unit
that does not divide the engine's block (decode context parallelism) is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


class EveryNth(Sequence[bytes]):
    """Hashes ``n - 1``, ``2n - 1``, … of ``hashes``, read when asked (``hashes`` may grow)."""

    __slots__ = ("_hashes", "_n")

    def __init__(self, hashes: Sequence[bytes], n: int) -> None:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        self._hashes, self._n = hashes, n

    def __len__(self) -> int:
        return len(self._hashes) // self._n

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        hashes, n = self._hashes, self._n
        if isinstance(index, slice):
            return [hashes[(j + 1) * n - 1] for j in range(*index.indices(len(self)))]
        size = len(self)
        j = index + size if index < 0 else index
        if not 0 <= j < size:
            raise IndexError(f"block {index} of {size}")
        return hashes[(j + 1) * n - 1]


def per_block(engine_block: int, hash_tokens: int, why: str = "") -> int:
    """Hashes per engine block of ``engine_block`` tokens, vLLM hashing every ``hash_tokens``;
    ``ValueError`` (naming ``why``: the settings that made that unit) unless it divides it."""
    if hash_tokens < 1 or engine_block % hash_tokens:
        raise ValueError(
            f"kvtier: vLLM hashes prompts every {hash_tokens} tokens{why}, which does not "
            f"divide the engine's block of {engine_block} tokens: kvtier keys a chunk by the "
            "hash that ends each block and cannot run here"
        )
    return engine_block // hash_tokens


def hashes_per_block(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> int:
    """How many of ``Request.block_hashes`` one engine block spans (1 where this vLLM cannot
    say: it then hashes by the block)."""
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    except ImportError:
        return 1
    _, hash_tokens = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    cache, parallel = vllm_config.cache_config, vllm_config.parallel_config
    why = (
        f" (prefix_match_unit={getattr(cache, 'prefix_match_unit', None)}, "
        f"decode_context_parallel_size="
        f"{getattr(parallel, 'decode_context_parallel_size', 1)})"
    )
    return per_block(cache.block_size, hash_tokens, why)


def block_hashes(request: Request, per_block: int) -> Sequence[bytes]:
    """``request``'s hashes, one per full engine block: its own list where vLLM hashes by the
    block, else a view of every ``per_block``-th."""
    hashes: Sequence[bytes] = request.block_hashes
    return hashes if per_block == 1 else EveryNth(hashes, per_block)


def tokens_name_kv(request: Request) -> bool:
    """Whether the request's token ids alone name its KV (not so with images or prompt
    embeddings: their KV depends on more than the token ids, and so its tail's key)."""
    return not request.mm_features and request.prompt_embeds is None
