"""Redis Cluster routing: which node serves a key.

    key_slot(name) -> int          CRC16 (XMODEM) of the key, or of its ``{hash tag}``, mod 16384
    SlotMap().update(reply, seed, moved)  the map from a ``CLUSTER SLOTS`` reply (asked of any
                                   seed), each slot a ``MOVED`` reply names on its node
    SlotMap.node(slot)             the master serving ``slot`` (None: unknown, ask again)
    redirect(moved, address)       where a command answered ``MOVED``/``ASK`` goes again

A Redis key of kvtier carries the chunk key as its hash tag (``redis/keys.py``), so every
rank's share of a chunk is on one node. The map is replaced whole, never edited in place, so a
thread reading it needs no lock; a ``MOVED`` reply tells the store to ask for a fresh one, and
the node it names serves its slot whatever that seed says: a seed may lag behind a resharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtier.tiers.redis.errors import AskError, MovedError
from kvtier.tiers.redis.url import RedisAddress

SLOTS = 16384


def _crc16_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), as Redis Cluster computes it."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(name: bytes) -> int:
    """The slot of key ``name``: of its hash tag (between the first ``{`` and the next ``}``,
    when not empty), else of the whole key."""
    start = name.find(b"{")
    if start >= 0:
        end = name.find(b"}", start + 1)
        if end > start + 1:
            name = name[start + 1 : end]
    return crc16(name) % SLOTS


class SlotMap:
    """slot -> the address of the master that serves it."""

    def __init__(self) -> None:
        self._nodes: list[RedisAddress | None] = [None] * SLOTS

    @property
    def known(self) -> bool:
        return any(node is not None for node in self._nodes)

    def node(self, slot: int) -> RedisAddress | None:
        return self._nodes[slot]

    def masters(self) -> list[RedisAddress]:
        return list({node.node: node for node in self._nodes if node is not None}.values())

    def update(self, reply: Any, seed: RedisAddress, moved: Sequence[MovedError] = ()) -> None:
        """Take the ``CLUSTER SLOTS`` ``reply`` of ``seed`` (a node that reports no host, or
        ``?``, is on the seed's host), then the node each ``MOVED`` reply in ``moved`` names
        for its slot (``ASK`` ones are not about the map); other nodes share the seed's
        credentials and TLS."""
        nodes: list[RedisAddress | None] = [None] * SLOTS
        for first, last, master, *_replicas in reply:
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            address = seed.at(host if host not in ("", "?") else seed.host, int(master[1]))
            for slot in range(int(first), int(last) + 1):
                nodes[slot] = address
        for redirected in moved:
            if not isinstance(redirected, AskError):
                nodes[redirected.slot] = seed.at(redirected.host, redirected.port)
        self._nodes = nodes


def redirect(reply: MovedError, address: RedisAddress) -> tuple[RedisAddress, bool]:
    """Where to send a redirected command again: (node, after ASKING?)."""
    if isinstance(reply, AskError):
        return address.at(reply.host, reply.port), True
    return address, False
