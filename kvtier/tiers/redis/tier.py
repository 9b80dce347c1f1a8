"""The Redis tier, as one worker rank reads and writes it: one verified record per chunk and rank.

The same interface as the disk tier (``tiers/chunk_tier.py``), so the disk tier's handler pair
moves it (``redis/io.py``):

    prefetch(key)             send the GET of ``key`` now (the load handler asks a few chunks
                              ahead, in the order it then reads them); replies stream back
                              while earlier chunks are checked and scattered
    read(key, out)            receive ``key``'s record straight into ``out`` and verify it
    write / write_many        pipelined SETs of records (``record.py``)
    holds_many(keys)          which records are there (a shutdown flush writes the others)

A record that is absent (Redis evicted it after the lookup) is a ``RecordAbsent`` ChunkError, a
miss; one that fails a check (garbage, truncated, another chunk's or another model's record) is
deleted, then a ChunkError; a Redis that is down or slow is an OSError (``RedisUnavailable``),
raised at once while the store's circuit breaker is open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from kvtier.keys import ChunkKey, key_group
from kvtier.layout import KVLayout
from kvtier.tiers.base.chunk_format import Buffer, ChunkError, ChunkHeader, payload_checksum
from kvtier.tiers.base.chunk_tier import view_bytes
from kvtier.tiers.redis.keys import redis_key
from kvtier.tiers.redis.pieces import Reader
from kvtier.tiers.redis.record import (
    PREFIX,
    check_header,
    check_payload,
    decode_header,
    encode_prefix,
    head_length,
    record_bytes,
)
from kvtier.tiers.redis.store import RedisStore, RedisUnavailable, Ticket

logger = logging.getLogger(__name__)

WRITE_BATCH = 32  # records per pipelined round of SETs
MAX_PREFETCHED = 64  # GETs sent and not read yet; older ones are forgotten (read again if asked)
SEND_BATCH = 8  # prefetched GETs sent together (one system call), or sooner when one is read
# Records the load handler asks for ahead of the one it reads: as many as fit in READ_AHEAD_BYTES,
# within [2, 16]. Replies in flight sit in Redis's output buffers and our socket's: with 64 MiB of
# them (16 records of 4 MiB) a load ran at 0.92 x redis-py's GET, with 32 MiB at 1.28 x.
READ_AHEAD_BYTES = 32 << 20
READ_AHEAD_RECORDS = (2, 16)


class RecordAbsent(ChunkError):
    """No record under the key: never written, expired, or evicted since the lookup."""


class RedisTier:
    """Rank ``rank``'s records in ``store``; ``fingerprint`` is this rank's layout digest."""

    def __init__(
        self,
        store: RedisStore,
        rank: int,
        fingerprint: bytes,
        describe: str,
        layout: KVLayout,
        block_size_factor: int,
    ) -> None:
        self.store = store
        self.rank = rank
        self.fingerprint = fingerprint
        self.describe = describe
        self.layout = layout
        self.factor = block_size_factor
        self.prefix = store.config.prefix
        self._sent: dict[ChunkKey, Ticket] = {}  # GETs sent, replies not read, in sending order
        self._unsent: list[ChunkKey] = []  # prefetched, to send with the next batch
        self._lanes = store.config.connections
        self._next_lane = 0
        self._sizes = [self.file_bytes(g) for g in range(len(layout.groups))]  # per group
        largest = max(sum(self.view_bytes(g)) for g in range(len(layout.groups)))  # payload
        fewest, most = READ_AHEAD_RECORDS
        self.read_ahead = max(fewest, min(most, READ_AHEAD_BYTES // largest))

    def view_bytes(self, group: int) -> list[int]:
        """Payload bytes of a chunk of ``group`` in each of its views, in order."""
        return view_bytes(self.layout, group, self.factor)

    def file_bytes(self, group: int) -> int:
        """The bytes of a record of ``group`` (a few fewer if its checksum is below 2**32:
        msgpack writes small numbers short)."""
        header = ChunkHeader(bytes(34), self.rank, self.fingerprint, self.view_bytes(group),
                             (1 << 64) - 1, time.time(), self.describe)  # fmt: skip
        return record_bytes(header)

    def name(self, key: ChunkKey) -> bytes:
        return redis_key(self.prefix, key, self.rank)

    # ---- loads -----------------------------------------------------------------------------

    def prefetch(self, key: ChunkKey) -> None:
        """Ask for ``key``'s record: its GET goes out with the next ``SEND_BATCH`` (best effort:
        a failure shows at ``read``)."""
        self._unsent.append(key)
        if len(self._unsent) >= SEND_BATCH:
            self._send_unsent()

    def _send_unsent(self) -> None:
        keys, self._unsent = self._unsent, []
        try:
            names, sizes = [self.name(k) for k in keys], [self._sizes[key_group(k)] for k in keys]
            tickets = self.store.send_gets(names, self._next_lane % self._lanes, sizes)
        except OSError:
            self._sent.clear()  # the store dropped this thread's connections
            return
        self._next_lane += 1
        for key, ticket in zip(keys, tickets):
            self._sent.pop(key, None)
            self._sent[key] = ticket
        while len(self._sent) > MAX_PREFETCHED:
            del self._sent[next(iter(self._sent))]

    def read(self, key: ChunkKey, out: Sequence[np.ndarray]) -> None:
        """Receive and verify this rank's record of ``key`` into ``out`` (byte buffers whose
        concatenation receives the chunk's record). ChunkError: absent (``RecordAbsent``), or
        bad (then deleted); OSError: Redis down or slow. ``out`` is meaningful only when no
        error was raised."""
        name = self.name(key)
        if key in self._unsent:
            self._send_unsent()
        try:
            ticket = self._sent.pop(key, None) or self.store.send_get(
                name, size=self._sizes[key_group(key)]
            )
            found = self.store.read_get(ticket, lambda bulk: self._receive(bulk, key, out))
        except RecordAbsent:
            raise
        except ChunkError as error:
            logger.warning("kvtier: deleting a bad Redis record %r: %s", name, error)
            try:
                self.store.delete([name])
            except OSError:
                pass  # Redis went away: the record is checked again when next read
            raise
        except OSError:
            self._sent.clear()
            raise
        if found is None:
            raise RecordAbsent(f"absent: no record {name.decode()} (evicted or never written)")

    def _receive(self, value: Reader, key: ChunkKey, out: Sequence[np.ndarray]) -> bool:
        """Check the head of a record, then receive its payload straight into ``out``."""
        header = self._head(value, key, self.view_bytes(key_group(key)))
        if sum(buffer.nbytes for buffer in out) != header.payload_bytes:
            raise ValueError(f"kvtier: {sum(b.nbytes for b in out)} bytes to receive a record "
                             f"of {header.payload_bytes} into")  # fmt: skip
        for buffer in out:
            value.read_into(buffer.data.cast("B"))
        if not value.ended():  # a record read in pieces: its length known only now
            raise ChunkError(f"longer than the {header.payload_bytes} bytes of payload it says")
        check_payload(header, out)
        return True

    def _head(self, value: Reader, key: ChunkKey, views: Sequence[int]) -> ChunkHeader:
        """The record's header, checked against ``key``, this rank, its layout and ``views``
        (and the record's length, when known before its payload is read)."""
        if value.length is not None and value.length < PREFIX.size:
            raise ChunkError(f"truncated: {value.length} bytes")
        prefix = value.read_bytes(PREFIX.size)
        head = head_length(prefix)
        if value.length is not None and head > value.length:
            raise ChunkError(f"truncated: {value.length} bytes, a header to byte {head}")
        header = decode_header(prefix + value.read_bytes(head - PREFIX.size))
        length = head + header.payload_bytes if value.length is None else value.length
        check_header(header, key, self.rank, self.fingerprint, views, length, head)
        return header

    # ---- writes ----------------------------------------------------------------------------

    def _record(self, key: ChunkKey, payload: Sequence[Buffer]) -> tuple[int, tuple[Buffer, ...]]:
        """(bytes, the record as buffers: its prefix, then the payload's, unjoined)."""
        header = ChunkHeader(
            key=key, rank=self.rank, fingerprint=self.fingerprint,
            views=self.view_bytes(key_group(key)), checksum=payload_checksum(payload),
            created=time.time(), describe=self.describe,
        )  # fmt: skip
        views = [memoryview(buffer).cast("B") for buffer in payload]
        if sum(len(v) for v in views) != header.payload_bytes:
            raise ValueError(f"kvtier: payload of {sum(len(v) for v in views)} bytes, expected "
                             f"{header.views}")  # fmt: skip
        prefix = encode_prefix(header)
        return len(prefix) + header.payload_bytes, (prefix, *views)

    def write(self, key: ChunkKey, payload: Sequence[Buffer]) -> int:
        """Write this rank's record of ``key``; its bytes. OSError when it was not stored."""
        (written,) = self.write_many([key], [payload])
        if written is None:
            raise OSError(f"Redis refused the record {self.name(key).decode()} (out of memory?)")
        return written

    def write_many(
        self, keys: Sequence[ChunkKey], payloads: Sequence[Sequence[Buffer]]
    ) -> list[int | None]:
        """Write records, pipelined: the bytes of each, None where Redis refused it (out of
        memory). OSError (RedisUnavailable) when Redis is down or slow."""
        written: list[int | None] = []
        for first in range(0, len(keys), WRITE_BATCH):
            batch = zip(keys[first : first + WRITE_BATCH], payloads[first : first + WRITE_BATCH])
            records = [(self.name(key), *self._record(key, payload)) for key, payload in batch]
            stored = self.store.set_many([(name, value) for name, _, value in records])
            written += [size if ok else None for (_, size, _), ok in zip(records, stored)]
        return written

    def holds_many(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether this rank's record of each key is in Redis (one pipelined ``EXISTS`` per
        node). OSError (RedisUnavailable) when Redis is down or slow."""
        return self.store.exists([self.name(key) for key in keys])

    def close(self) -> None:
        self._sent.clear()
        self._unsent.clear()
        self.store.close()


__all__ = ["RecordAbsent", "RedisTier", "RedisUnavailable"]
