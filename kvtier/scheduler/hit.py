"""What a hit decision reads and answers (``hit_policy.py``): small typed values."""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_WAIT_TOKENS = 256  # min_async_load_tokens unset: what waiting a step is worth until the
# engine's costs are measured (the tokens a load that makes the request wait must add)


class HitRequest(NamedTuple):
    """What a lookup knows of the request: tokens the engine holds, its length (None: unknown,
    no cap and no synchronous load), chunks from the engine's hit to its last full chunk."""

    num_computed_tokens: int
    num_tokens: int | None
    first: int
    full: int

    def covered(self, end: int, chunk_tokens: int) -> int:
        """Tokens beyond the engine's hit that chunks ``first..end`` give: a hit stops before
        the last token; a chunk past ``full`` is the prompt's tail, to the prompt's end."""
        covered = end * chunk_tokens
        if self.num_tokens is not None:
            if end > self.full:  # the tail: to the end of the prompt
                covered = self.num_tokens
            covered = min(covered, self.num_tokens - 1)
        return max(0, covered - self.num_computed_tokens)


class HitPolicy(NamedTuple):
    chunk_tokens: int
    sync_capable: bool  # one KV cache group: a failed synchronous load is reported per block
    min_async_load_tokens: int | None  # set: a load that makes the request wait adds as many
    # tokens, and a read from a tier before the forward is shorter (None: the costs decide)

    @property
    def wait_tokens(self) -> int:
        """The tokens a load that makes the request wait must add, by the rules alone."""
        return self.min_async_load_tokens or DEFAULT_WAIT_TOKENS


class Declined(NamedTuple):
    """A tier's chunks (and their tokens) a hit leaves for the engine to compute: loading them
    was predicted slower."""

    tier: str
    chunks: int
    tokens: int


class Hit(NamedTuple):
    tokens: int | None  # beyond the engine's hit; None: ask again next step
    load_async: bool = False
    tiers: tuple[str, ...] = ()  # the tiers it loads from, when decided by cost
    declined: tuple[Declined, ...] = ()
