"""Faults put into a tier below host memory, as a bad disk, a bad copy or a bad server would.

    Fault                                   the kinds of fault, in campaign order
    DiskFaults(root).inject(fault, ...)     -> records damaged (chunk files of a disk tier)
    RedisFaults(server, prefix).inject(...) -> records damaged (records under a key prefix)

Each record is one rank's share of one chunk. ``share`` of the records (of ``rank`` only, or of
every rank) are damaged, chosen by ``rng``; ``RESTART`` loses them all (a disk replaced, a Redis
killed and started again empty). A reader must find every damaged record bad (a counted miss,
recomputed), never serve it. A record an earlier case left unreadable or empty, and no load has
read since, is left as it is and not counted: ``inject`` returns the records it damaged.
``RESET`` is not a tier's fault: the campaign resets the engine's connector while its loads and
stores run (``campaign.py``).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from enum import Enum
from pathlib import Path
from typing import Protocol

import msgspec

from kvtier.tiers.base import chunk_format as disk_format
from kvtier.tiers.disk.names import scan
from kvtier.tiers.redis import record as redis_record

FOREIGN = bytes(range(16))  # the layout digest of "another model": no engine has it
FLIP_BYTES = 4096  # the end of a record flipped: its payload, whatever the record's size


class Fault(Enum):
    FLIP = "flip"  # the last 4 KiB of a record inverted (a bad disk, a bad copy)
    TRUNCATE = "truncate"  # a record cut short
    SWAP = "swap"  # another chunk's record under this one's name
    FOREIGN = "foreign"  # another model's record (layout fingerprint) under this one's name
    READ_ERROR = "read_error"  # a record that cannot be read at all
    RESTART = "restart"  # the tier killed and restarted empty
    RESET = "reset"  # the engine's connector reset while loads and stores run (no tier fault)


class TierFaults(Protocol):
    name: str

    def count(self) -> int: ...

    def inject(self, fault: Fault, rng: random.Random, share: float, rank: int | None) -> int: ...


def _chosen(names: list[str], rng: random.Random, share: float) -> list[str]:
    names = sorted(names)
    return rng.sample(names, max(1, round(share * len(names)))) if names else []


def _flipped(data: bytes) -> bytes:
    cut = max(0, len(data) - FLIP_BYTES)
    return data[:cut] + bytes(b ^ 0xFF for b in data[cut:])


class DiskFaults:
    """Chunk files of the disk tier in ``root``."""

    name = "disk"

    def __init__(self, root: Path) -> None:
        self.root = root

    def _files(self, rank: int | None) -> list[str]:
        return [  # plain files: a record made unreadable before is left as it is
            entry.path
            for entry, chunk in scan(self.root)
            if chunk is not None
            and (rank is None or chunk[1] == rank)
            and entry.is_file(follow_symlinks=False)
        ]

    def count(self) -> int:
        return len(self._files(None))

    def inject(self, fault: Fault, rng: random.Random, share: float, rank: int | None) -> int:
        if fault is Fault.RESTART:
            lost = self.count()
            for child in self.root.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            return lost
        paths = [Path(p) for p in _chosen(self._files(rank), rng, share)]
        if fault is Fault.SWAP:
            paths = paths[: len(paths) // 2 * 2]
            for a, b in zip(paths[::2], paths[1::2]):
                data = a.read_bytes()
                a.write_bytes(b.read_bytes())
                b.write_bytes(data)
            return len(paths)
        damaged = 0
        for path in paths:
            if fault in (Fault.FLIP, Fault.TRUNCATE) and not path.stat().st_size:
                continue  # emptied by an earlier case: nothing left to flip or cut
            if fault is Fault.FLIP:
                path.write_bytes(_flipped(path.read_bytes()))
            elif fault is Fault.TRUNCATE:
                os.truncate(path, rng.randrange(path.stat().st_size))
            elif fault is Fault.FOREIGN:
                data = path.read_bytes()
                try:
                    header = disk_format.decode_header(data[: disk_format.HEADER_BYTES])
                except disk_format.ChunkError:
                    continue  # damaged by an earlier case and not read since: left as it is
                foreign = msgspec.structs.replace(header, fingerprint=FOREIGN)
                head = disk_format.encode_header(foreign)
                path.write_bytes(head + data[disk_format.HEADER_BYTES :])
            elif fault is Fault.READ_ERROR:  # open() works, read() fails: EISDIR
                path.unlink()
                path.symlink_to(path.parent)
            else:
                raise ValueError(f"not a fault of a tier's records: {fault}")
            damaged += 1
        return damaged


class RedisFaults:
    """Records under ``prefix`` in the Redis/Valkey server at ``url``; ``restart`` kills the
    server and starts it again, empty, on the same port."""

    name = "redis"

    def __init__(self, url: str, prefix: str, restart: object) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=10)
        self.prefix = prefix
        self._restart = restart

    def _keys(self, rank: int | None) -> list[str]:
        """Records (strings): a key made unreadable before is left as it is."""
        keys = self.client.scan_iter(match=f"{self.prefix}:*", count=1000, _type="string")
        names = [key.decode() for key in keys]
        return [k for k in names if rank is None or k.endswith(f":{rank}")]

    def count(self) -> int:
        return len(self._keys(None))

    def inject(self, fault: Fault, rng: random.Random, share: float, rank: int | None) -> int:
        if fault is Fault.RESTART:
            lost = self.count()
            self._restart()  # type: ignore[operator]
            return lost
        keys = _chosen(self._keys(rank), rng, share)
        if fault is Fault.SWAP:
            keys = keys[: len(keys) // 2 * 2]
            for a, b in zip(keys[::2], keys[1::2]):
                va, vb = self.client.get(a), self.client.get(b)
                self.client.set(a, vb or b"")
                self.client.set(b, va or b"")
            return len(keys)
        damaged = 0
        for key in keys:
            value = self.client.get(key)
            if not isinstance(value, bytes) or not value:
                continue  # made unreadable or emptied by an earlier case: left as it is
            if fault is Fault.FLIP:
                self.client.set(key, _flipped(value))
            elif fault is Fault.TRUNCATE:
                self.client.set(key, value[: rng.randrange(len(value))])
            elif fault is Fault.FOREIGN:
                try:
                    head = redis_record.head_length(value)
                    header = redis_record.decode_header(value[:head])
                except (disk_format.ChunkError, struct.error):
                    continue  # damaged by an earlier case and not read since: left as it is
                foreign = msgspec.structs.replace(header, fingerprint=FOREIGN)
                self.client.set(key, redis_record.encode_prefix(foreign) + value[head:])
            elif fault is Fault.READ_ERROR:  # GET answers WRONGTYPE
                self.client.delete(key)
                self.client.rpush(key, b"not a record")
            else:
                raise ValueError(f"not a fault of a tier's records: {fault}")
            damaged += 1
        return damaged
