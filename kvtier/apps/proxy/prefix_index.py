"""Which engine can load which prompt prefix, from which tier: the proxy's index, built from events.

Each engine hashes its blocks with its own seed (vLLM's ``PYTHONHASHSEED`` or a random one), so
the index is keyed by the tokens themselves: a block's *digest* chains its parent's digest and its
token ids (``_chained``), and a request's blocks are digested the same way from its tokens. An
event's block hashes are mapped to digests per engine, through the hash of the block before
(``parent_block_hash``): a block whose parent the engine never told is not placed (counted).
What else names a block's KV starts the chain: a prompt's first block chains from the *root* of
its LoRA adapter and cache salt (``root_of``; 0 for neither), so a prompt met under another
adapter or salt shares no block with it, as in the engines' own hashes. A block its tokens do
not name (an image's, prompt embeddings') is not placed.

    apply(engine, events) -> int         place the engine's events; how many blocks could not be
    drop(engine)                         forget what the engine holds (it died, or is rebuilt)
    digests(tokens, root) -> [int]       a request's full blocks
    root_of(lora, salt)   -> int         where the digests of a prompt of that adapter and salt
                                         start (``adapters``: the adapters events named)
    prompt_stretches(tokens, fleet, root)  the prompt's leading blocks some engine holds, as
              -> [(Holders, int)]        stretches held alike, digesting only as far as that
                                         (what ``scoring.Held`` decides from over ``fleet``)
    prompt_runs(tokens, engines, root)   runs(digests(tokens, root), engines), from the stretches
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
fleet. Where ``_digests`` is built (setup.py), the digests and the table of holders are
compiled (``DigestMap``: no Python step per block either).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import accumulate, count, groupby, repeat
from operator import add

from kvtier.apps.proxy.kv_events import Event, Kind
from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_runs import ENGINE, Holders, Run, Runs, runs_of

try:  # the digests and lookups compiled (setup.py); the same in Python where not built
    from kvtier.apps.proxy import _digests
except ImportError:  # pragma: no cover - only where no C compiler was found at install
    _digests = None  # type: ignore[assignment]

__all__ = ["ENGINE", "MAX_BLOCKS", "PrefixIndex", "Run", "Runs"]

_ROOT = 0  # the digest before a prompt's first block
_BLOCK = 1 << 96  # each block adds this to a digest, beyond any sum of its blocks' hashes
MAX_BLOCKS = 1 << 20  # hashes remembered per engine


class PrefixIndex:
    def __init__(self, max_blocks: int = MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.block_size = 0  # tokens per block, from the first event that says (0: none yet)
        self._digest: dict[str, OrderedDict[int | bytes, int]] = {}  # engine -> hash -> digest
        # digest -> who holds it (none: not there): compiled where ``_digests`` is built
        self._holders: dict[int, Holders] | _digests.DigestMap[Holders] = (
            {} if _digests is None else _digests.DigestMap()
        )
        self._interned: dict[frozenset[tuple[str, str]], Holders] = {}  # each in use, once
        self.unplaced = 0  # blocks whose parent was never told
        self.adapters: set[str] = set()  # the LoRA adapters events named (and engines listed)
        # the fleet last decided over: each holder the index makes has its masks made for it
        # then, as events come, not when a request is routed (``prompt_stretches``)
        self._fleet: Positions | None = None

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
        if event.parent is None:
            digest: int | None = root_of(event.lora, event.salt)
        else:
            digest = known.get(event.parent)
        if digest is None:
            return len(event.block_hashes)
        if event.lora is not None:
            self.adapters.add(event.lora)
        hashes = event.block_hashes[: event.opaque_from]  # those its tokens name
        digests = chained(digest, event.token_ids[: len(hashes) * size], size)
        for block_hash, digest in zip(hashes, digests):
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
            if self._fleet is not None:
                held.masks(self._fleet)
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

    def digests(self, tokens: Sequence[int], root: int = _ROOT) -> list[int]:
        """The digests of ``tokens``' full blocks from ``root`` (none before a block size is
        known)."""
        size = self.block_size
        if not size:
            return []
        return list(chained(root, tokens, size))

    def prompt_runs(
        self, tokens: Sequence[int], engines: Collection[str], root: int = _ROOT
    ) -> Runs:
        """``runs(digests(tokens, root), engines)``, from ``prompt_stretches``."""
        return runs_of(self.prompt_stretches(tokens, root=root), _fleet(engines))

    def prompt_stretches(
        self, tokens: Sequence[int], fleet: Positions | None = None, root: int = _ROOT
    ) -> list[tuple[Holders, int]]:
        """The prompt's leading blocks some engine holds, as stretches held alike: (who, how
        many blocks). Its digests are made only as far as some engine holds it, each looked
        up as it is made (no list between): compiled, the tokens read in place, where
        ``_digests`` is built. ``fleet``: the engines they will be decided over; holders made
        from now on have their masks for it made at once (``Holders.masks``)."""
        if fleet is not None:
            self._fleet = fleet
        size, holders = self.block_size, self._holders
        if not size:
            return []
        if isinstance(holders, dict):
            return self._stretches(_chained(root, tokens, size))
        return holders.stretches(tokens, size, root)

    def runs(self, digests: Iterable[int], engines: Collection[str]) -> Runs:
        """The runs of ``engines`` (the fleet): per engine, its leading blocks of ``digests``
        that it holds or a shared tier holds."""
        return runs_of(self._stretches(digests), _fleet(engines))

    def _stretches(self, digests: Iterable[int]) -> list[tuple[Holders, int]]:
        """``digests``' leading blocks some engine holds, as stretches held alike: (who, how
        many blocks). Looked up in C (``map``): in a large index a lookup mostly waits on
        memory, and C overlaps one block's wait with the next's."""
        stretches = []
        for holders, blocks in groupby(map(self._holders.get, digests)):
            if holders is None:
                break
            stretches.append((holders, len(list(blocks))))
        return stretches


def root_of(lora: str | None, salt: str | None) -> int:
    """Where the digests of a prompt computed with LoRA adapter ``lora`` and cache salt ``salt``
    start: ``_ROOT`` for neither, else 64 bits of a hash of both (a digest of no block)."""
    if lora is None and not salt:
        return _ROOT
    named = json.dumps([lora, salt or None]).encode()
    return int.from_bytes(hashlib.blake2b(named, digest_size=8).digest(), "big")


def _fleet(engines: Collection[str]) -> frozenset[str]:
    return engines if isinstance(engines, frozenset) else frozenset(engines)


def chained(digest: int, tokens: Sequence[int], size: int) -> Iterable[int]:
    """The digests of ``tokens``' whole blocks of ``size``, chained from ``digest``: compiled
    where ``_digests`` is built (the same digests), else ``_chained``."""
    if _digests is None:
        return _chained(digest, tokens, size)
    return _digests.chained(digest, tokens, size)


def _chained(digest: int, tokens: Sequence[int], size: int) -> Iterator[int]:
    """The digests of ``tokens``' whole blocks of ``size``, chained from ``digest``, lazily.

    A prefix's digest is the sum, over its blocks, of ``hash`` of the block's position and token
    ids (a tuple of ints: hashed alike in every process, whatever ``PYTHONHASHSEED``) plus
    ``_BLOCK``: an unbounded sum, so two prefixes share a digest only if their sums of 64-bit
    hashes are equal, and the position in each block's hash tells orders apart; the prefix's
    length in blocks is the digest rounded to a multiple of ``_BLOCK``. Every step runs in C
    (``zip`` cuts the blocks, ``map(hash)`` hashes them, ``accumulate`` chains them), and lazily:
    ``runs`` hashes a prompt only as far as some engine holds it. ``_digests.c`` makes the same
    digests (a sum kept in 128 bits: 2**31 blocks before it could wrap)."""
    start = (digest + _BLOCK // 2) // _BLOCK  # blocks before
    hashes = map(hash, zip(count(start), *[iter(tokens)] * size))
    sums = accumulate(map(add, hashes, repeat(_BLOCK)), initial=digest)
    next(sums)  # ``digest`` itself
    return sums
