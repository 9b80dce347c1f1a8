"""A tier's index, as the scheduler half sees it: one contract for every tier, host memory too.

    name                                     stats, logs, metrics, provenance, and the medium of
                                             its chunks in a transfer (its worker handlers')
    traits                    -> Traits      how it is read and written (fixed)
    usage()                   -> Usage       what it holds and lost, now
    lookup(keys)              -> Found       leading ``keys`` it holds; ``pending``: the next
                                             may be soon (a lookup or a store in flight): ask
                                             again on a later step
    prepare_load(keys)                       pin them for a load (a local tier keeps them)
    complete_load(keys, bad)                 unpin; forget the ``bad`` ones (a load found them bad)
    holds(key)                -> bool        held or being written: no need to write it again
    prepare_store(keys)       -> [key]       the keys it takes now (room made, writes reserved)
    complete_store(ok, failed)               ``ok``: key -> bytes written; ``failed`` forgotten
    verify(keys)              -> int         check that it still holds ``keys`` (written earlier;
                                             a remote tier asks on its own thread): how many it
                                             will check (0: ask again later)
    take_gone()               -> [key]       keys ``verify`` found gone since the last call
    take_removed()            -> [key]       ready keys it stopped holding since the last call
                                             (evicted, found bad or gone, forgotten): what a
                                             router is told
    check_integrity()                        AssertionError on a broken invariant
    namespace(fingerprint)                   (``Namespaced`` only) the keys' namespace is now
                                             ``fingerprint``: which chunks it found may load

``verify``/``take_gone``/``Usage.forgotten`` let ``scheduler/tier_writes.py`` write again the
host chunks a tier lost (a Redis restarted empty, flushed, or evicting); a local tier loses
nothing unseen. The host tier (``tiers/host/index.py``) adds what only host memory has: slots
and an eviction policy. The chain below it is the order of a hit: host memory, then the first
tier of the chain, then the next, each looked up from where the one before stopped; each tier's
package builds its index (``TierSpec.scheduler``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from kvtier.keys import ChunkKey


class Found(NamedTuple):
    """``lookup``'s answer: the first ``ready`` keys load now. ``pending``: the key after them
    may become loadable soon (a remote tier still looking it up, a store in flight): ask again
    on a later step rather than take it for a miss."""

    ready: int
    pending: bool = False


class Traits(NamedTuple):
    """How a tier is read and written, fixed for its life."""

    reads_before_forward: bool  # a short read may run before the step's forward (memory, local
    # disk); a network store never: no step waits on it
    write_through: bool  # host chunks written as soon as stored (else when evicted or idle)
    max_in_flight: int  # chunks being written at once: more wait their turn


class Usage(NamedTuple):
    """What a tier holds and lost, now."""

    used: int  # bytes
    room: int | None  # bytes it may still take (None: no budget of ours, as Redis's maxmemory)
    evicted: int  # chunks it removed to make room, since start
    failed_lookups: int = 0  # lookups that got no answer and were misses (a remote's timeouts)
    forgotten: int = 0  # times it forgot every key it knew held (it may come back empty)
    available: bool = True  # takes writes now (False: a remote tier is down)


class TierIndex(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def traits(self) -> Traits: ...

    def usage(self) -> Usage: ...

    def lookup(self, keys: Sequence[ChunkKey]) -> Found: ...

    def prepare_load(self, keys: Sequence[ChunkKey]) -> None: ...

    def complete_load(self, keys: Sequence[ChunkKey], bad: Sequence[ChunkKey] = ()) -> None: ...

    def holds(self, key: ChunkKey) -> bool: ...

    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[ChunkKey]: ...

    def complete_store(self, ok: Mapping[ChunkKey, int], failed: Sequence[ChunkKey]) -> None: ...

    def verify(self, keys: Sequence[ChunkKey]) -> int: ...

    def take_gone(self) -> list[ChunkKey]: ...

    def take_removed(self) -> list[ChunkKey]: ...

    def check_integrity(self) -> None: ...


@runtime_checkable
class Namespaced(Protocol):
    """An index that sorts what it found at start-up by the keys' namespace (the disk tier's):
    told the namespace again when it changes (the engine's ranks name it before the first
    lookup; a connector reset gives it a generation of its own)."""

    def namespace(self, fingerprint: bytes) -> None: ...
