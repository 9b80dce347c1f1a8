"""What a hit decision reads and answers (``hit_policy.py``), and the run of chunks it decides
on (``load_planner.py``): small typed values."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class GroupSpec:
    """One KV cache group as the scheduler half needs it."""

    block_tokens: int
    sliding_window: int | None = None  # tokens; None for full attention


class HitRun(NamedTuple):
    """Chunks ``first..host_end`` are in the host tier and ``first..end`` across the tiers;
    ``retry``: the run stops at a chunk whose store is in flight; ``sync_end`` (None: ``end``):
    the run's part a load may read before the forward; ``pending``: a remote tier is still
    looking the run up (it may be longer on a later step); ``parts``: each tier of the chain,
    in order, and the chunk where its part of the run ends (its part starts where the one
    before ended, the first at ``host_end``)."""

    host_end: int
    end: int
    retry: bool = False
    sync_end: int | None = None
    pending: bool = False
    parts: tuple[tuple[str, int], ...] = ()


class Below(NamedTuple):
    """The leading chunks of some keys the chain below host memory holds: ``chunks`` in all,
    ``sync`` of them in tiers read before the forward; ``pending``: a tier has not answered;
    ``counts``: each tier's chunks of them, in the chain's order."""

    chunks: int
    sync: int
    pending: bool
    counts: tuple[int, ...] = ()
