"""The tiers below host memory, as the scheduler half sees them: an ordered chain of one interface.

    lookup(keys)              -> int | None   leading ``keys`` it holds; None: being looked up
                                              (a remote tier), ask again on a later step
    prepare_load(keys)                        pin them for a load (a local tier keeps them)
    complete_load(keys, bad)                  unpin; forget the ``bad`` ones (a load found them bad)
    holds(key)                -> bool         held or being written: no need to write it again
    prepare_store(keys)       -> [key]        the keys it takes now (room made, writes reserved)
    complete_store(ok, failed)                ``ok``: key -> bytes written; ``failed`` forgotten
    available                 -> bool         takes writes now (False: a remote tier is down)
    verify(keys)              -> int          check that it still holds ``keys`` (written
                                              earlier; a remote tier asks on its own thread):
                                              how many it will check (0: ask again later)
    take_gone()               -> [key]        keys ``verify`` found gone since the last call
    take_removed()            -> [key]        keys it stopped holding since the last call (evicted,
                                              found bad or gone, forgotten): a router is told
    forgotten                 -> int          times it forgot every key it knew held (a remote
                                              tier that failed: it may come back empty)

plus what the connector needs to name and plan the tier: ``name`` (stats, logs, metrics,
provenance, and the medium of its chunks in a transfer, ``TierChunks``: the worker half's
handler pair of the tier), ``synchronous`` (a short load may run before the forward: local disk
yes, a network store never), ``write_through`` (write a chunk as soon as the host tier stored
it, or only when it is evicted or the engine is idle), ``max_in_flight`` (chunks being written
at once: more wait their turn), ``used``/``room`` (bytes; ``room`` None: no budget of ours),
``evicted``, ``failed_lookups`` (lookups that got no answer and were misses: a remote tier's
timeouts).
``verify``/``take_gone``/``forgotten`` let ``tier_writes.py`` write again the host chunks a tier
lost (a Redis restarted empty, flushed, or evicting); a local disk loses nothing unseen.

The chain is the order of a hit: host memory, then the first tier of the chain, then the next,
each looked up from where the one before stopped. Each tier's package builds its entry
(``kvtier/tiers/<name>/``, ``TierSpec.scheduler``): adding a tier adds a package, not branches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvtier.keys import ChunkKey


class LowerTier(Protocol):
    @property
    def name(self) -> str: ...

    synchronous: bool
    write_through: bool
    max_in_flight: int

    @property
    def used(self) -> int: ...

    @property
    def room(self) -> int | None: ...

    @property
    def evicted(self) -> int: ...

    @property
    def failed_lookups(self) -> int: ...

    def lookup(self, keys: Sequence[ChunkKey]) -> int | None: ...

    def prepare_load(self, keys: Sequence[ChunkKey]) -> None: ...

    def complete_load(self, keys: Sequence[ChunkKey], bad: Sequence[ChunkKey] = ()) -> None: ...

    def holds(self, key: ChunkKey) -> bool: ...

    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[ChunkKey]: ...

    def complete_store(self, ok: dict[ChunkKey, int], failed: Sequence[ChunkKey]) -> None: ...

    @property
    def available(self) -> bool: ...

    def verify(self, keys: Sequence[ChunkKey]) -> int: ...

    def take_gone(self) -> list[ChunkKey]: ...

    def take_removed(self) -> list[ChunkKey]: ...

    @property
    def forgotten(self) -> int: ...

    def check_integrity(self) -> None: ...
