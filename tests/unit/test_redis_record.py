"""The value under a Redis key: a compact verified record, checked like a disk chunk file.

No server here: the same checks run on records received from Redis (``test_redis_tier.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.keys import make_key
from kvtier.tiers.base.chunk_format import ChunkError, ChunkHeader, payload_checksum
from kvtier.tiers.redis.keys import redis_key
from kvtier.tiers.redis.record import (
    MAGIC,
    PREFIX,
    encode_prefix,
    record_bytes,
    verify_record,
)

FP, OTHER_FP = bytes(range(16)), bytes(range(16, 32))
KEY, OTHER_KEY = make_key(FP, 1, 0), make_key(FP, 2, 0)
VIEWS = [64, 32]  # bytes of a 16-token chunk's share in each view: small, no padding


def _payload(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in VIEWS]


def _record(key: bytes = KEY, rank: int = 0, fp: bytes = FP, seed: int = 1) -> bytes:
    payload = _payload(seed)
    header = ChunkHeader(key, rank, fp, VIEWS, payload_checksum(payload), 1.0, "test layout")
    return encode_prefix(header) + b"".join(p.tobytes() for p in payload)


def _verify(record: bytes, rank: int = 0) -> list[np.ndarray]:
    out = [np.zeros(n, dtype=np.uint8) for n in VIEWS]
    verify_record(record, KEY, rank, FP, out)
    return out


def test_the_key_is_the_cluster_hash_tag() -> None:
    name = redis_key("kv", KEY, 3)
    assert name == b"kv:{" + KEY.hex().encode() + b"}:3"


def test_a_record_round_trips_compact() -> None:
    record = _record()
    assert record[:8] == MAGIC
    header = ChunkHeader(KEY, 0, FP, VIEWS, payload_checksum(_payload()), 1.0, "test layout")
    assert len(record) == record_bytes(header) < PREFIX.size + 200 + sum(VIEWS)
    assert all(np.array_equal(a, b) for a, b in zip(_verify(record), _payload()))


def test_a_long_description_is_cut_so_the_header_stays_small() -> None:
    header = ChunkHeader(KEY, 0, FP, VIEWS, 0, 1.0, "x" * 100_000)
    assert len(encode_prefix(header)) < 1200


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (b"", "truncated"),
        (b"not a kvtier record at all, just some bytes", "not a kvtier record"),
        (_record()[:30], "truncated"),
        (_record()[:-1], "bytes long"),
        (_record() + b"\0", "bytes long"),
        (_record()[:-1] + bytes([_record()[-1] ^ 1]), "payload checksum"),
        (_record()[:25] + bytes([_record()[25] ^ 1]) + _record()[26:], "header"),
        (_record(key=OTHER_KEY), "holds chunk"),
        (_record(rank=1), "rank 1's share"),
        (_record(fp=OTHER_FP), "written for layout"),
    ],
    ids=[
        "empty",
        "garbage",
        "cut header",
        "cut payload",
        "too long",
        "flipped payload",
        "flipped header",
        "other chunk",
        "other rank",
        "other model",
    ],  # fmt: skip
)
def test_a_bad_record_is_refused_naming_the_check(record: bytes, why: str) -> None:
    with pytest.raises(ChunkError, match=why):
        _verify(record)


def test_a_record_of_other_view_lengths_is_refused() -> None:
    out = [np.zeros(n, dtype=np.uint8) for n in (32, 64)]
    with pytest.raises(ChunkError, match="views of"):
        verify_record(_record(), KEY, 0, FP, out)
