"""What kvtier tells a router: which prefixes each tier can load, in the engine's block hashes.

A chunk key (``keys.py``) is a digest no router can match to a prompt. So when a chunk's store into
the host tier completes, while its request is at hand, the chunk is *described*: the engine's own
hashes of its blocks, the hash of the block before it (its parent), its token ids, its KV cache
group and what else names its KV (its request's ``block_tags``: an adapter, a salt). A described
chunk is *advertised* in each tier that holds it: a ``PrefixEvent`` stored when a tier starts
holding it, removed when it stops (evicted, found bad or gone, a reset, a store that forgot what
it held). The vLLM adapter turns them into vLLM's ``BlockStored``/``BlockRemoved``.

    describe(state, runs, keys)  a store job's chunks ((group, first, end) runs) just stored
    stored(tier, keys)           ``tier`` holds ``keys`` now (the host tier: its own events)
    removed(tier, keys)          ``tier`` no longer holds ``keys``
    written(tier, keys, holds)   a write to a lower tier finished: ``holds(key)`` says which it kept
    withdraw_all()               the keys were renamed: every chunk withdrawn from every tier
    take()        -> [PrefixEvent]  since the last call, oldest first

Only what a request can load is advertised: a chunk is loaded whole, so a router that matches a
prompt's blocks one by one must count a chunk's blocks only when it matches all of them (a prompt
that shares part of a chunk loads none of it). A prompt's tail (its blocks after its last full
chunk) is never advertised, and neither is a chunk found in a lower tier that no request loaded
into host memory yet (a disk tier's files from before a restart, another engine's Redis chunks):
nothing describes it. A chunk stored into host memory that a lower tier holds is advertised there
too. A description lives while some tier advertises the chunk or a lower tier is writing it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvtier.keys import ChunkKey
from kvtier.scheduler.request import RequestState
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.base.results import EventKind
from kvtier.tiers.host.index import ChunkManager

HOST = "cpu"  # the host tier's name (stats, provenance)


class PrefixEvent(NamedTuple):
    """One chunk's blocks became loadable from ``tier`` (``stored``) or stopped being."""

    stored: bool
    tier: str
    group: int
    block_hashes: tuple[bytes, ...]
    parent: bytes | None  # the hash of the block before the chunk's first (None: the first)
    token_ids: tuple[int, ...]  # empty in a removal
    tags: object = None  # what else names the blocks' KV (``RequestState.block_tags``'s)


@dataclass(slots=True)
class _Description:
    group: int
    block_hashes: tuple[bytes, ...]
    parent: bytes | None
    token_ids: tuple[int, ...]
    tags: object
    tiers: list[str] = field(default_factory=list)  # where it is advertised, in order


class PrefixEvents:
    def __init__(
        self,
        block_tokens: int,
        factor: int,
        lower: Sequence[tuple[str, Callable[[ChunkKey], bool]]] = (),
    ) -> None:
        """``factor`` engine blocks of ``block_tokens`` tokens per chunk; ``lower``: the chain's
        tiers, (name, holds) each."""
        self.block_tokens = block_tokens
        self.factor = factor
        self.lower = tuple(lower)
        self._described: dict[ChunkKey, _Description] = {}
        self._fresh: list[ChunkKey] = []  # described since the last ``take``
        self._events: list[PrefixEvent] = []

    def __len__(self) -> int:
        """Chunks described (the memory this costs: their hashes and token ids)."""
        return len(self._described)

    def describe(
        self, state: RequestState, runs: Sequence[tuple[int, int, int]], keys: Sequence[ChunkKey]
    ) -> None:
        """Describe the chunks ``first..end`` of group ``g`` for each run ``(g, first, end)`` of a
        store job of ``state`` that just completed, named ``keys`` (the runs' in order: the
        request's own may have been renamed since, ``RequestState.salt_apart``); those described
        already are kept."""
        hashes, tokens, tags = state.block_hashes, state.token_ids, state.block_tags
        chunk_tokens = self.block_tokens * self.factor
        named = iter(keys)
        for group, first, end in runs:
            for chunk, key in zip(range(first, end), named):
                start = chunk * self.factor
                if key in self._described or len(tokens) < (chunk + 1) * chunk_tokens:
                    continue  # described; or no tokens given (nothing a router could match)
                self._described[key] = _Description(
                    group,
                    tuple(hashes[start : start + self.factor]),
                    hashes[start - 1] if start else None,
                    tuple(tokens[chunk * chunk_tokens : (chunk + 1) * chunk_tokens]),
                    None if tags is None else tags(start, start + self.factor),
                )
                self._fresh.append(key)

    def stored(self, tier: str, keys: Sequence[ChunkKey]) -> None:
        """``tier`` holds ``keys`` now; a chunk stored into host memory is advertised in the
        lower tiers that hold it too."""
        for key in keys:
            description = self._described.get(key)
            if description is None:
                continue
            self._advertise(description, tier)
            if tier == HOST:
                for name, holds in self.lower:
                    if holds(key):
                        self._advertise(description, name)

    def removed(self, tier: str, keys: Sequence[ChunkKey]) -> None:
        """``tier`` no longer holds ``keys``."""
        for key in keys:
            description = self._described.get(key)
            if description is not None and tier in description.tiers:
                self._withdraw(key, description, tier)

    def written(
        self, tier: str, keys: Sequence[ChunkKey], holds: Callable[[ChunkKey], bool]
    ) -> None:
        """A write of ``keys`` to ``tier`` finished: advertise those it holds, withdraw (or
        forget) those it does not."""
        for key in keys:
            description = self._described.get(key)
            if description is None:
                continue
            if holds(key):
                self._advertise(description, tier)
            elif tier in description.tiers:
                self._withdraw(key, description, tier)
            elif not description.tiers:
                del self._described[key]

    def withdraw_all(self) -> None:
        """No chunk described is loadable here any more (the keys were renamed: a connector
        reset): each is withdrawn from every tier that advertised it, and forgotten."""
        for key, description in list(self._described.items()):
            for tier in list(description.tiers):
                self._withdraw(key, description, tier)
        self._described.clear()

    def take(self) -> list[PrefixEvent]:
        """The events since the last call, oldest first. A chunk described since then that no
        tier holds (removed before its store was seen) is forgotten."""
        for key in self._fresh:
            description = self._described.get(key)
            if description is not None and not description.tiers and not self._writing(key):
                del self._described[key]
        self._fresh.clear()
        events, self._events = self._events, []
        return events

    def _writing(self, key: ChunkKey) -> bool:
        return any(holds(key) for _, holds in self.lower)

    def _advertise(self, description: _Description, tier: str) -> None:
        if tier in description.tiers:
            return
        description.tiers.append(tier)
        self._events.append(
            PrefixEvent(True, tier, description.group, description.block_hashes,
                        description.parent, description.token_ids, description.tags)
        )  # fmt: skip

    def _withdraw(self, key: ChunkKey, description: _Description, tier: str) -> None:
        description.tiers.remove(tier)
        self._events.append(
            PrefixEvent(False, tier, description.group, description.block_hashes, None, ())
        )
        # kept while a lower tier is writing it (an evicted chunk's staged write)
        if not description.tiers and not self._writing(key):
            del self._described[key]


def tell_tier_events(
    prefixes: PrefixEvents | None, host: ChunkManager, lower: Sequence[TierIndex]
) -> None:
    """Hand what the tiers stored and removed to ``prefixes`` (read every step, so that nothing
    piles up when no router is told). A chunk stored into host memory is told in the lower
    tiers that hold it too: only one written before (this step plans none yet)."""
    for event in host.take_events():
        if prefixes is not None:
            keys: list[ChunkKey] = event.keys  # type: ignore[assignment]
            if event.kind is EventKind.STORED:
                prefixes.stored(HOST, keys)
            else:
                prefixes.removed(HOST, keys)
    for tier in lower:
        removed = tier.take_removed()
        if removed and prefixes is not None:
            prefixes.removed(tier.name, removed)
