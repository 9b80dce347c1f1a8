"""DiskIndex: the chunks a disk-tier directory holds, their bytes, LRU order and the byte budget.

The scheduler half's view of a disk tier (the worker half reads and writes the files). Built at
start-up from the names and sizes of the directory's files (none is opened), so a restarted engine
finds what an earlier one wrote. A chunk goes through the same states as in ``ChunkManager``:

    (absent) --prepare_store--> in flight --complete_store(ok)--> ready --evicted--> (absent)

A chunk is ready when the files of all ``world_size`` ranks are there. A chunk a load found bad
(on any rank) is dropped at once: no lookup finds it and ``holds`` is False, so its recomputed
copy is written again; every rank's file is removed once no other load pins it.

Several engines may share one directory: a key another engine wrote is adopted when a lookup finds
its files, and a file another engine removed is a counted miss at load time. Nothing here trusts a
file: every load is verified by the worker that reads it.

Eviction removes the files of the least recently used chunks (not pinned, not being written)
until the directory's bytes (counted per file, of every model in it: another namespace's files
take room, never load) plus the chunks being written fit the budget (files: ``directory.py``).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.tiers.base.index import Found, Traits, Usage
from kvtier.tiers.disk.directory import ChunkFiles

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64  # chunks being written at once
MAX_REFUSED = 100_000  # refused files remembered (then forgotten at once: a rare, bounded retry)


@dataclass(slots=True)
class _Entry:
    nbytes: int  # on disk, all ranks (while in flight: the reservation)
    ranks: int  # rank files to remove when evicted (1 + highest rank seen)
    whole: bool = True  # every rank's file is there (when last seen)
    ours: bool = True  # of this engine's namespace (``namespace``)
    writing: bool = False  # its store is in flight
    pins: int = 0  # loads in flight
    bad: bool = False  # a load found it bad; still pinned by another load (then removed)

    @property
    def loadable(self) -> bool:
        return self.whole and self.ours

    @property
    def ready(self) -> bool:
        return self.loadable and not self.writing and not self.bad

    @property
    def evictable(self) -> bool:
        return not self.writing and not self.pins


class DiskIndex:
    """``budget`` bytes in ``root``; ``chunk_bytes`` bounds one chunk's files (all ranks).

    An entry of the tier chain (``tiers/base/index.py``'s contract).
    """

    name = "disk"

    def __init__(
        self,
        root: Path,
        budget: int,
        world_size: int,
        fingerprint: bytes,
        chunk_bytes: int,
        write_through: bool = False,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.write_through = write_through
        self.max_in_flight = max_in_flight
        self.root = root
        self.budget = budget
        self.world_size = world_size
        self.fingerprint = fingerprint
        self.chunk_bytes = chunk_bytes
        # least recently used first; invariant: used == sum of nbytes
        self._entries: OrderedDict[ChunkKey, _Entry] = OrderedDict()
        self.used = 0
        self.evicted = 0  # chunks removed to make room, since start
        self._refused: dict[ChunkKey, float] = {}  # key -> newest mtime of files a load refused
        self._removed: list[ChunkKey] = []  # for ``take_removed``
        self.files = ChunkFiles(root, world_size)
        started = time.perf_counter()
        self._scan()
        logger.info("kvtier: disk tier %s holds %d chunks (%.1f of %.1f MiB), indexed in %.2f s",
                    root, len(self._entries), self.used / 2**20, budget / 2**20,
                    time.perf_counter() - started)  # fmt: skip

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def room(self) -> int:
        """Bytes (all ranks) the tier may still take."""
        return max(0, self.budget - self.used)

    @property
    def traits(self) -> Traits:
        """A short read from a local disk may run before the forward; chunks are written when
        evicted from host memory or while the engine is idle, unless ``write_through``."""
        return Traits(True, self.write_through, self.max_in_flight)

    def usage(self) -> Usage:
        """Nothing is lost unseen: files leave only by this index's own eviction."""
        return Usage(self.used, self.room, self.evicted)

    def _scan(self) -> None:
        """Every chunk file's entry: those of this fingerprint load."""
        for found in self.files.scan():  # least recently written first
            mine = found.key.startswith(self.fingerprint)
            self._entries[found.key] = _Entry(found.nbytes, found.ranks, found.complete, mine)
            self.used += found.nbytes

    def namespace(self, fingerprint: bytes) -> None:
        """The keys are ``fingerprint``'s from now on (``Namespaced``): its chunks load, others
        only take room until evicted."""
        self.fingerprint, ours = fingerprint, 0
        for key, entry in self._entries.items():
            entry.ours = key.startswith(fingerprint)
            ours += entry.ours
        logger.info("kvtier: disk tier %s: %d chunks of this model and layout, %d of others",
                    self.root, ours, len(self._entries) - ours)  # fmt: skip

    # ---- lookup and load -------------------------------------------------------------------

    def lookup(self, keys: Sequence[ChunkKey]) -> Found:
        """How many leading ``keys`` are ready; adopts a key whose files another engine wrote."""
        for ready, key in enumerate(keys):
            entry = self._entries.get(key)
            if entry is None or self._may_complete(entry):
                entry = self._adopt(key)  # new, or incomplete when last seen
            if entry is None or not entry.ready:
                return Found(ready)
        return Found(len(keys))

    def _may_complete(self, entry: _Entry) -> bool:
        """An incomplete chunk whose missing rank files another engine may have written since."""
        return not entry.loadable and entry.evictable and entry.ranks <= self.world_size

    def _adopt(self, key: ChunkKey) -> _Entry | None:
        """An entry for ``key`` if all its rank files are there (regular files, and not the very
        files a load already refused: those would fail again, forever)."""
        if key[: len(self.fingerprint)] != self.fingerprint:
            return None
        found = self.files.complete(key)
        if found is None:
            return None
        nbytes, newest = found
        if self._refused.get(key) == newest:
            return None
        self._forget([key])
        entry = self._entries[key] = _Entry(nbytes, self.world_size)
        self.used += nbytes
        return entry

    def prepare_load(self, keys: Sequence[ChunkKey]) -> None:
        """Pin ``keys`` (ready ones, as ``lookup`` found them) until ``complete_load``."""
        entries = [self._entries[key] for key in keys]
        if not all(entry.ready for entry in entries):
            raise ValueError("kvtier: disk load of a chunk that is not ready")
        for entry in entries:
            entry.pins += 1

    def complete_load(self, keys: Sequence[ChunkKey], bad: Sequence[ChunkKey] = ()) -> None:
        """Unpin ``keys``; drop the ``bad`` ones (a load found them bad, on some rank).

        A dropped chunk is forgotten and every rank's file removed (a worker removes only its
        own); one another load still pins is never found again and is removed when unpinned.
        """
        for key in bad:
            entry = self._entries.get(key)
            if entry is not None and entry.whole and not entry.writing:  # of any namespace
                entry.bad = True
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None:
                entry.pins = max(0, entry.pins - 1)
        for key in dict.fromkeys([*bad, *keys]):
            entry = self._entries.get(key)
            if entry is not None and entry.bad and entry.evictable:
                if len(self._refused) > MAX_REFUSED:
                    self._refused.clear()
                self._refused[key] = self.files.newest_mtime(key)
                self._remove_files(key, entry.ranks)  # every rank's: the chunk is gone
        if not bad:
            self.touch(keys)

    def touch(self, keys: Sequence[ChunkKey]) -> None:
        """Mark ``keys`` most recently used (``keys[0]`` last), also for the next start-up."""
        now = time.time()
        for key in reversed(keys):
            if key in self._entries:
                self._entries.move_to_end(key)
                self.files.touch(key, now)

    # ---- store -----------------------------------------------------------------------------

    def prepare_store(self, keys: Sequence[ChunkKey]) -> list[ChunkKey]:
        """Reserve room for the ``keys`` not on disk yet, evicting LRU chunks; returns those kept.

        Stops at the first key that does not fit (all others are pinned or being written).
        """
        admitted: list[ChunkKey] = []
        for key in dict.fromkeys(keys):
            if self.holds(key):
                continue
            stale = self._entries.get(key)  # incomplete (a writer died): written afresh
            if stale is not None:
                if not stale.evictable:
                    continue
                self._remove_files(key, stale.ranks)
            if not self._make_room(self.chunk_bytes):
                break
            self._entries[key] = _Entry(self.chunk_bytes, self.world_size, writing=True)
            self.used += self.chunk_bytes
            admitted.append(key)
        return admitted

    def _make_room(self, nbytes: int) -> bool:
        if nbytes > self.budget:
            return False
        while self.used + nbytes > self.budget:
            victim = next((k for k, e in self._entries.items() if e.evictable), None)
            if victim is None:
                return False
            self._remove_files(victim, self._entries[victim].ranks)
            self.evicted += 1
        return True

    def complete_store(self, ok: Mapping[ChunkKey, int], failed: Sequence[ChunkKey]) -> None:
        """``ok`` maps written keys to their bytes on disk; ``failed`` keys are removed."""
        for key, nbytes in ok.items():
            entry = self._entries.get(key)
            if entry is None or not entry.writing:
                continue
            self.used += nbytes - entry.nbytes
            entry.nbytes, entry.writing = nbytes, False
            self._refused.pop(key, None)
            self._entries.move_to_end(key)
        for key in failed:
            entry = self._entries.get(key)
            if entry is not None and entry.writing:
                self._remove_files(key, entry.ranks)  # the ranks that did write it

    def _remove_files(self, key: ChunkKey, ranks: int) -> None:
        entry = self._entries.get(key)
        if entry is not None and not entry.writing:
            self._removed.append(key)
        self._forget([key])
        self.files.remove(key, ranks)

    def _forget(self, keys: Sequence[ChunkKey]) -> None:
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.used -= entry.nbytes

    def holds(self, key: ChunkKey) -> bool:
        """Whether ``key`` is on disk (all ranks) or being written (no file is looked at)."""
        entry = self._entries.get(key)
        return entry is not None and not entry.bad and (entry.loadable or entry.writing)

    def verify(self, keys: Sequence[ChunkKey]) -> int:
        """Nothing to check (0 queued): this index is the disk tier's own record of its files
        (a file another engine removed is a counted miss at load time)."""
        return 0

    def take_gone(self) -> list[ChunkKey]:
        return []

    def take_removed(self) -> list[ChunkKey]:
        """Ready chunks removed since the last call (evicted, found bad)."""
        removed, self._removed = self._removed, []
        return removed

    def ready_keys(self) -> list[ChunkKey]:
        """Ready chunks, least recently used first (for tests and inspection)."""
        return [key for key, entry in self._entries.items() if entry.ready]

    def check_integrity(self) -> None:
        total = sum(entry.nbytes for entry in self._entries.values())
        assert self.used == total, f"used {self.used} != {total} bytes of the entries"
        for key, entry in self._entries.items():
            assert entry.pins >= 0, f"{key.hex()} has {entry.pins} pins"
            pinnable = entry.whole and not entry.writing or entry.bad  # ready, in any namespace
            assert pinnable or not entry.pins, f"{key.hex()} pinned, not ready"
            assert not entry.bad or entry.pins, f"{key.hex()} is bad but was not removed"
