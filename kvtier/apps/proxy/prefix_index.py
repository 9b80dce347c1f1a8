"""Which engine can load which prompt prefix, from which tier: the proxy's index, built from events.

Each engine hashes its blocks with its own seed (vLLM's ``PYTHONHASHSEED`` or a random one), so
the index is keyed by the tokens themselves: a block's *digest* chains its parent's digest and its
token ids (``xxh3_64``), and a request's blocks are digested the same way from its tokens. An
event's block hashes are mapped to digests per engine, through the hash of the block before
(``parent_block_hash``): a block whose parent the engine never told is not placed (counted).

    apply(engine, events) -> int         place the engine's events; how many blocks could not be
    drop(engine)                         forget what the engine holds (it died, or is rebuilt)
    digests(tokens)       -> [int]       a request's full blocks
    runs(digests, engines) -> {engine: Run}   per engine, the leading blocks it can load, by tier

A tier told as shared (``REDIS``) holds a block for every engine. Memory is bounded: at most
``max_blocks`` hashes per engine are remembered, the least recently told forgotten first (with
what the engine holds of them: an index that cannot place a removal must not keep the block).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import xxhash

from kvtier.apps.proxy.kv_events import Event, Kind

ENGINE = "GPU"  # the engine's own memory
SHARED = frozenset({"REDIS"})  # tiers every engine of the fleet loads from
_ROOT = 0  # the digest before a prompt's first block
MAX_BLOCKS = 1 << 20  # hashes remembered per engine


@dataclass
class Run:
    """An engine's leading loadable blocks of a request, counted by the tier it loads each from
    (the cheapest that holds it)."""

    blocks: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.blocks.values())


class PrefixIndex:
    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.block_size = 0  # tokens per block, from the first event that says (0: none yet)
        self._digest: dict[str, OrderedDict[int | bytes, int]] = {}  # engine -> hash -> digest
        self._holders: dict[int, dict[str, set[str]]] = {}  # digest -> engine -> tiers
        self.unplaced = 0  # blocks whose parent was never told

    def __len__(self) -> int:
        """Blocks some engine holds."""
        return len(self._holders)

    def hashes(self, engine: str) -> int:
        return len(self._digest.get(engine, ()))

    def apply(self, engine: str, events: Iterable[Event]) -> int:
        """Place ``engine``'s events, in order; the blocks that could not be placed."""
        known = self._digest.setdefault(engine, OrderedDict())
        missed = 0
        for event in events:
            if event.group != 0:
                continue  # one group indexes a prefix (hybrid models: the first)
            if event.kind is Kind.CLEARED:
                self._forget_tier(engine, ENGINE)
            elif event.kind is Kind.REMOVED:
                for block_hash in event.block_hashes:
                    digest = known.get(block_hash)
                    if digest is not None:
                        self._unhold(engine, digest, event.medium)
            else:
                missed += self._stored(engine, known, event)
        self.unplaced += missed
        return missed

    def _stored(self, engine: str, known: OrderedDict[int | bytes, int], event: Event) -> int:
        size = event.block_size
        if not self.block_size:
            self.block_size = size
        if size != self.block_size or len(event.token_ids) != size * len(event.block_hashes):
            return len(event.block_hashes)  # another block size, or no token ids: unusable
        digest = _ROOT if event.parent is None else known.get(event.parent)
        if digest is None:
            return len(event.block_hashes)
        for i, block_hash in enumerate(event.block_hashes):
            digest = _chain(digest, event.token_ids[i * size : (i + 1) * size])
            known[block_hash] = digest
            known.move_to_end(block_hash)
            self._holders.setdefault(digest, {}).setdefault(engine, set()).add(event.medium)
        while len(known) > self.max_blocks:
            _, old = known.popitem(last=False)
            self._unhold(engine, old, None)
        return 0

    def _unhold(self, engine: str, digest: int, tier: str | None) -> None:
        """``engine`` no longer holds ``digest`` in ``tier`` (None: in any)."""
        holders = self._holders.get(digest)
        tiers = holders.get(engine) if holders is not None else None
        if holders is None or tiers is None:
            return
        if tier is None:
            tiers.clear()
        else:
            tiers.discard(tier)
        if not tiers:
            del holders[engine]
            if not holders:
                del self._holders[digest]

    def _forget_tier(self, engine: str, tier: str) -> None:
        for digest in list(self._digest.get(engine, {}).values()):
            self._unhold(engine, digest, tier)

    def drop(self, engine: str) -> None:
        """Forget everything ``engine`` told."""
        for digest in self._digest.pop(engine, {}).values():
            self._unhold(engine, digest, None)

    def digests(self, tokens: Sequence[int]) -> list[int]:
        """The digests of ``tokens``' full blocks (none before a block size is known)."""
        size = self.block_size
        if not size:
            return []
        digest, out = _ROOT, []
        for start in range(0, len(tokens) - size + 1, size):
            digest = _chain(digest, tokens[start : start + size])
            out.append(digest)
        return out

    def runs(self, digests: Sequence[int], engines: Iterable[str]) -> dict[str, Run]:
        """Per engine, its leading blocks of ``digests`` that it holds or a shared tier holds."""
        runs = {engine: Run() for engine in engines}
        alive = set(runs)
        for digest in digests:
            holders = self._holders.get(digest, {})
            shared = next((t for tiers in holders.values() for t in tiers if t in SHARED), None)
            for engine in list(alive):
                tiers = holders.get(engine)
                tier = _cheapest(tiers) if tiers else shared
                if tier is None:
                    alive.discard(engine)
                    continue
                blocks = runs[engine].blocks
                blocks[tier] = blocks.get(tier, 0) + 1
            if not alive:
                break
        return runs


_ORDER = {ENGINE: 0, "CPU": 1, "DISK": 2}  # cheapest first; other tiers after these


def _cheapest(tiers: set[str]) -> str:
    return min(tiers, key=lambda tier: _ORDER.get(tier, 3))


def _chain(parent: int, tokens: Sequence[int]) -> int:
    return xxhash.xxh3_64_intdigest(array("q", tokens).tobytes(), seed=parent)
