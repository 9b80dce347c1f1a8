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

A tier told as shared (``REDIS``) holds a block for every engine. Memory follows what the engines
hold: a hash is forgotten once its engine holds its block in no tier (removed, cleared), and at
most ``max_blocks`` hashes per engine are remembered, the least recently told forgotten first
(with what the engine holds of them: an index that cannot place a removal must not keep the
block).

Who holds a block is one ``_Holders`` object shared by every block held alike (interned: the
blocks of a system prompt every engine holds, or of one conversation one engine holds, share
one), so ``runs`` does its per-engine work once per stretch of blocks held alike, not per block.
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


@dataclass(slots=True)
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
        self._holders: dict[int, _Holders] = {}  # digest -> who holds it (none: not there)
        self._interned: dict[frozenset[tuple[str, str]], _Holders] = {}  # each in use, once
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
                        if not self._holds(engine, digest):  # in no tier of it: forgotten
                            del known[block_hash]
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
        digests = _chained(digest, event.token_ids, size)
        for block_hash, digest in zip(event.block_hashes, digests):
            known[block_hash] = digest
            known.move_to_end(block_hash)
            self._hold(engine, digest, event.medium)
        while len(known) > self.max_blocks:
            _, old = known.popitem(last=False)
            self._unhold(engine, old, None)
        return 0

    def _hold(self, engine: str, digest: int, tier: str) -> None:
        held = self._holders.get(digest)
        if held is None:
            self._place(digest, None, frozenset(((engine, tier),)))
        elif (engine, tier) not in held.pairs:
            self._place(digest, held, held.pairs | {(engine, tier)})

    def _unhold(self, engine: str, digest: int, tier: str | None) -> None:
        """``engine`` no longer holds ``digest`` in ``tier`` (None: in any)."""
        held = self._holders.get(digest)
        if held is None:
            return
        if tier is None:
            pairs = frozenset(pair for pair in held.pairs if pair[0] != engine)
            if len(pairs) < len(held.pairs):
                self._place(digest, held, pairs)
        elif (engine, tier) in held.pairs:
            self._place(digest, held, held.pairs - {(engine, tier)})

    def _place(self, digest: int, old: _Holders | None, pairs: frozenset[tuple[str, str]]) -> None:
        """``digest`` is held as ``pairs`` says (empty: by none), no longer as ``old``."""
        if old is not None:
            old.uses -= 1
            if not old.uses:
                del self._interned[old.pairs]
        if not pairs:
            del self._holders[digest]
            return
        held = self._interned.get(pairs)
        if held is None:
            held = self._interned[pairs] = _Holders(pairs)
        held.uses += 1
        self._holders[digest] = held

    def _holds(self, engine: str, digest: int) -> bool:
        held = self._holders.get(digest)
        return held is not None and held.holds(engine)

    def _forget_tier(self, engine: str, tier: str) -> None:
        known = self._digest.get(engine, OrderedDict())
        for block_hash, digest in list(known.items()):
            self._unhold(engine, digest, tier)
            if not self._holds(engine, digest):
                del known[block_hash]

    def drop(self, engine: str) -> None:
        """Forget everything ``engine`` told."""
        for digest in self._digest.pop(engine, {}).values():
            self._unhold(engine, digest, None)

    def digests(self, tokens: Sequence[int]) -> list[int]:
        """The digests of ``tokens``' full blocks (none before a block size is known)."""
        size = self.block_size
        if not size:
            return []
        return _chained(_ROOT, tokens[: len(tokens) // size * size], size)

    def runs(self, digests: Sequence[int], engines: Iterable[str]) -> dict[str, Run]:
        """Per engine, its leading blocks of ``digests`` that it holds or a shared tier holds."""
        runs = {engine: Run() for engine in engines}
        alive = {engine: run.blocks for engine, run in runs.items()}  # still in their run
        stretch, count = None, 0  # blocks held alike, not yet counted
        for digest in digests:
            held = self._holders.get(digest)
            if held is None:
                break
            if held is not stretch:
                if stretch is not None:
                    alive = stretch.extend(alive, count)
                    if not alive:
                        break
                stretch, count = held, 0
            count += 1
        if stretch is not None and alive:
            stretch.extend(alive, count)
        return runs


_ORDER = {ENGINE: 0, "CPU": 1, "DISK": 2}  # cheapest first; other tiers after these


class _Holders:
    """The engines holding a block, and in which tiers: one object per way of holding, shared
    by every block held that way (``pairs``: (engine, tier) each)."""

    __slots__ = ("pairs", "uses", "_cheapest", "_shared")

    def __init__(self, pairs: frozenset[tuple[str, str]]) -> None:
        self.pairs = pairs
        self.uses = 0  # blocks held this way
        self._cheapest: dict[str, str] | None = None  # per engine, its cheapest tier (lazily)
        self._shared: str | None = None  # a shared tier among them

    def holds(self, engine: str) -> bool:
        """``engine`` holds the blocks held this way (in some tier of its own)."""
        return engine in self._by_engine()

    def _by_engine(self) -> dict[str, str]:
        cheapest = self._cheapest
        if cheapest is None:
            cheapest = self._cheapest = {}
            for engine, tier in sorted(self.pairs, key=_rank, reverse=True):
                cheapest[engine] = tier  # the cheapest, sorted last, stays
            shared = sorted((tier for _, tier in self.pairs if tier in SHARED), key=_tier_rank)
            self._shared = shared[0] if shared else None
        return cheapest

    def extend(self, alive: dict[str, dict[str, int]], count: int) -> dict[str, dict[str, int]]:
        """Add ``count`` blocks held this way to the runs of the ``alive`` engines (engine ->
        blocks per tier); the engines whose runs go on."""
        cheapest = self._by_engine()
        shared_tier = self._shared
        if shared_tier is not None:
            for engine, blocks in alive.items():
                tier = cheapest.get(engine, shared_tier)
                blocks[tier] = blocks.get(tier, 0) + count
            return alive
        if len(cheapest) < len(alive):
            alive = {engine: alive[engine] for engine in cheapest if engine in alive}
        elif not alive.keys() <= cheapest.keys():
            alive = {engine: blocks for engine, blocks in alive.items() if engine in cheapest}
        for engine, blocks in alive.items():
            tier = cheapest[engine]
            blocks[tier] = blocks.get(tier, 0) + count
        return alive


def _tier_rank(tier: str) -> tuple[int, str]:
    return _ORDER.get(tier, 3), tier


def _rank(pair: tuple[str, str]) -> tuple[int, str]:
    return _tier_rank(pair[1])


def _chained(digest: int, tokens: Sequence[int], size: int) -> list[int]:
    """The digests of ``tokens``' blocks of ``size`` (whole blocks), chained from ``digest``."""
    data = memoryview(array("q", tokens))
    hash_of = xxhash.xxh3_64_intdigest
    out = []
    for start in range(0, len(data), size):
        digest = hash_of(data[start : start + size], digest)
        out.append(digest)
    return out
