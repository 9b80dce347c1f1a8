"""Storing a prompt's tail: its blocks after its last full chunk, the last one partly filled.

    key(state, num_tokens, tail_tokens) -> ChunkKey | None   the request's tail, if it has one
    offer(state, num_computed_tokens) -> TailOffer | None   the tail, once the prompt is computed

A tail is kept in the host tier only (never written to disk, never flushed at shutdown): it lets a
later hit on the same prompt leave the engine one token to compute, whatever the prompt's length.
Rows of its last block past the prompt's end are whatever the engine wrote there (decoded tokens,
possibly while the store read them); a load gives them to a request that overwrites them before
attention reads them. Its key (``ChunkKeyMaker.tail_key``) names the prefix and the tail's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.addresses import NULL_BLOCK
from kvtier.keys import ChunkKey, ChunkKeyMaker
from kvtier.scheduler.request import RequestState
from kvtier.scheduler.store_planner import TailOffer


class TailStore:
    def __init__(self, keys: ChunkKeyMaker, block_tokens: int) -> None:
        self.keys = keys
        self.factor = keys.block_size_factor
        self.block_tokens = block_tokens
        self.chunk_tokens = block_tokens * self.factor

    def key(
        self, state: RequestState, num_tokens: int | None, tail_tokens: Sequence[int] | None
    ) -> ChunkKey | None:
        """The key of the request's tail, when it has one kvtier can keep (a full block before
        it, tokens after its last full chunk, tokens that name its KV); remembered in ``state``
        for its store. The caller checks the model has a single KV cache group."""
        hashes = state.block_hashes
        if num_tokens is None or tail_tokens is None or not hashes:
            return None
        if num_tokens <= len(hashes) // self.factor * self.chunk_tokens:
            return None  # ends on a chunk boundary: no tail
        if len(tail_tokens) != num_tokens - len(hashes) * self.block_tokens:
            return None
        if state.tail_key is None or state.tail_end != num_tokens:
            state.tail_key = self.keys.tail_key(hashes[-1], tail_tokens, 0, state.key_salt)
            state.tail_end, state.tail_done = num_tokens, False
        return state.tail_key

    def offer(self, state: RequestState, num_computed_tokens: int) -> TailOffer | None:
        """``state``'s tail once the engine computed it (offered once; None: nothing to store)."""
        key = state.tail_key
        if key is None or state.tail_done or num_computed_tokens < state.tail_end:
            return None
        state.tail_done = True
        first = state.tail_end // self.block_tokens // self.factor * self.factor
        end = -(-state.tail_end // self.block_tokens)
        blocks = state.block_ids[0][first:end]
        if len(blocks) != end - first or NULL_BLOCK in blocks:
            return None
        return TailOffer(state, key, blocks, first)
