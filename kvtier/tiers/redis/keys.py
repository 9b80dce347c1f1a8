"""The Redis key of one rank's share of a chunk: ``PREFIX:{KEY}:RANK``.

``KEY`` (the hex of the chunk key: layout fingerprint, chained chunk hash, group) is the Redis
Cluster hash tag, so every rank's share of a chunk is on one node and a lookup of a run of chunks
is one pipelined round trip per node. The prefix namespaces a deployment; the fingerprint inside
the key keeps one model's or layout's chunks from ever meeting another's.
"""

from __future__ import annotations

from kvtier.keys import ChunkKey


def redis_key(prefix: str, key: ChunkKey, rank: int) -> bytes:
    return f"{prefix}:{{{key.hex()}}}:{rank}".encode()
