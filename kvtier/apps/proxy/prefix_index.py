"""Which engine can load which prompt prefix, from which tier: the proxy's index, built from events.

Each engine hashes its blocks with its own seed (vLLM's ``PYTHONHASHSEED`` or a random one), so
the index is keyed by the tokens themselves: a block's *digest* chains its parent's digest and its
token ids (``xxh3_64``), and a request's blocks are digested the same way from its tokens. An
event's block hashes are mapped to digests per engine, through the hash of the block before
(``parent_block_hash``): a block whose parent the engine never told is not placed (counted).

    apply(engine, events) -> int         place the engine's events; how many blocks could not be
    drop(engine)                         forget what the engine holds (it died, or is rebuilt)
    digests(tokens)       -> [int]       a request's full blocks
    runs(digests, engines) -> Runs       per engine, the leading blocks it can load, by tier: in
                                         groups of engines alike (the most: one run)

A tier told as shared (``REDIS``) holds a block for every engine. Memory follows what the engines
hold: a hash is forgotten once its engine holds its block in no tier (removed, cleared), and at
most ``max_blocks`` hashes per engine are remembered, the least recently told forgotten first
(with what the engine holds of them: an index that cannot place a removal must not keep the
block).

Who holds a block is one ``Holders`` object (``prefix_runs.py``) shared by every block held alike
(interned: the blocks of a system prompt every engine holds, or of one conversation one engine
holds, share one), so ``runs`` works once per stretch of blocks held alike, not per block, and
there once per group of engines with the same run so far (set operations, in C, split a group),
not per engine: its Python work grows with the prompt's blocks and the few groups, not with the
fleet.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from itertools import groupby

import xxhash

from kvtier.apps.proxy.kv_events import Event, Kind
from kvtier.apps.proxy.prefix_runs import ENGINE, Holders, Run, Runs, runs_of

__all__ = ["ENGINE", "MAX_BLOCKS", "PrefixIndex", "Run", "Runs"]

_ROOT = 0  # the digest before a prompt's first block
MAX_BLOCKS = 1 << 20  # hashes remembered per engine


class PrefixIndex:
    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.block_size = 0  # tokens per block, from the first event that says (0: none yet)
        self._digest: dict[str, OrderedDict[int | bytes, int]] = {}  # engine -> hash -> digest
        self._holders: dict[int, Holders] = {}  # digest -> who holds it (none: not there)
        self._interned: dict[frozenset[tuple[str, str]], Holders] = {}  # each in use, once
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

    def _place(self, digest: int, old: Holders | None, pairs: frozenset[tuple[str, str]]) -> None:
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
            held = self._interned[pairs] = Holders(pairs)
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
        return _chained(_ROOT, tokens, size)

    def runs(self, digests: Sequence[int], engines: Collection[str]) -> Runs:
        """The runs of ``engines`` (the fleet): per engine, its leading blocks of ``digests``
        that it holds or a shared tier holds."""
        fleet = engines if isinstance(engines, frozenset) else frozenset(engines)
        return runs_of(self._stretches(digests), fleet)

    def _stretches(self, digests: Sequence[int]) -> list[tuple[Holders, int]]:
        """``digests``' leading blocks some engine holds, as stretches held alike: (who, how
        many blocks). Looked up in C (``map``): in a large index a lookup mostly waits on
        memory, and C overlaps one block's wait with the next's."""
        stretches = []
        for holders, blocks in groupby(map(self._holders.get, digests)):
            if holders is None:
                break
            stretches.append((holders, len(list(blocks))))
        return stretches


def _chained(digest: int, tokens: Sequence[int], size: int) -> list[int]:
    """The digests of ``tokens``' whole blocks of ``size``, chained from ``digest``: each block's
    token ids hashed as little-endian int64s, seeded with the digest before."""
    data = struct.pack(f"<{len(tokens)}q", *tokens)  # (``array("q", tokens)`` takes twice as long)
    step, hash_of = size * 8, xxhash.xxh3_64_intdigest
    out = []
    for start in range(0, len(data) - step + 1, step):
        digest = hash_of(data[start : start + step], digest)
        out.append(digest)
    return out
