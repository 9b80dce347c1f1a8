"""The fault campaign's injectors (``bench/faults/tiers.py``) over records an earlier case damaged.

A record damaged by one case stays damaged until a load reads it: a chunk past a prompt's first
bad one is never looked up, so it can stay for the whole campaign. A later case that picks it
must go on, leaving it as it is, and count only the records it damaged itself (the 2026-12-04
21-minute campaign stopped after 9 minutes at a FOREIGN fault over a truncated file; a record cut
to nothing would have stopped the next TRUNCATE the same way).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kvtier.apps.bench.common.redis_server import RedisServer
from kvtier.apps.bench.faults.tiers import FOREIGN, DiskFaults, Fault, RedisFaults
from kvtier.keys import make_key
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.chunk_format import read_header
from kvtier.tiers.disk.files import DiskTier
from kvtier.tiers.redis.config import RedisConfig
from kvtier.tiers.redis.record import decode_header, head_length
from kvtier.tiers.redis.store import RedisStore
from kvtier.tiers.redis.tier import RedisTier

NUM_BLOCKS, FACTOR, CHUNKS = 8, 2, 6
LAYOUT_FP = bytes(range(16))
KEYS = [make_key(bytes(range(100, 116)), i, 0) for i in range(CHUNKS)]


def _layout() -> KVLayout:
    return build_layout({"layer.0": torch.zeros(NUM_BLOCKS, 64)}, [["layer.0"]], NUM_BLOCKS)


def _payload(view_bytes: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n, dtype=np.uint8) for n in view_bytes]


def test_a_disk_foreign_fault_leaves_a_file_an_earlier_case_truncated(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 0, LAYOUT_FP, "test layout", _layout(), FACTOR)
    for i, key in enumerate(KEYS):
        tier.write(key, _payload(tier.view_bytes(0), i))
    truncated = tier.path(KEYS[0])
    truncated.write_bytes(truncated.read_bytes()[:107])  # its header cut short
    faults = DiskFaults(tmp_path)

    damaged = faults.inject(Fault.FOREIGN, random.Random(0), 1.0, None)

    assert damaged == CHUNKS - 1
    assert truncated.stat().st_size == 107  # left as it was
    for key in KEYS[1:]:
        header, _ = read_header(tier.path(key))
        assert header.fingerprint == FOREIGN


@pytest.mark.parametrize("fault", [Fault.TRUNCATE, Fault.FLIP])
def test_a_disk_file_an_earlier_case_emptied_is_left_empty(tmp_path: Path, fault: Fault) -> None:
    tier = DiskTier(tmp_path, 0, LAYOUT_FP, "test layout", _layout(), FACTOR)
    for i, key in enumerate(KEYS):
        tier.write(key, _payload(tier.view_bytes(0), i))
    before = {key: tier.path(key).read_bytes() for key in KEYS}
    tier.path(KEYS[0]).write_bytes(b"")  # cut to nothing by a TRUNCATE case

    damaged = DiskFaults(tmp_path).inject(fault, random.Random(0), 1.0, None)

    assert damaged == CHUNKS - 1
    assert tier.path(KEYS[0]).read_bytes() == b""
    assert all(tier.path(key).read_bytes() != before[key] for key in KEYS[1:])


def test_a_redis_foreign_fault_leaves_records_an_earlier_case_truncated(
    redis_server: RedisServer,
) -> None:
    prefix = f"fault-injection-{time.monotonic_ns()}"
    tier = RedisTier(RedisStore(RedisConfig(redis_server.url, prefix=prefix)), 0, LAYOUT_FP,
                     "test layout", _layout(), FACTOR)  # fmt: skip
    faults = RedisFaults(redis_server.url, prefix, restart=None)
    try:
        assert tier.write_many(KEYS, [_payload(tier.view_bytes(0), i) for i in range(CHUNKS)])
        names = sorted(k.decode() for k in faults.client.scan_iter(match=f"{prefix}:*"))
        assert len(names) == CHUNKS
        faults.client.set(names[0], b"\x00" * 7)  # shorter than a record's prefix
        value = faults.client.get(names[1])
        assert isinstance(value, bytes)
        faults.client.set(names[1], value[:30])  # a prefix, its header cut short
        faults.client.set(names[2], b"")  # cut to nothing

        damaged = faults.inject(Fault.FOREIGN, random.Random(0), 1.0, None)

        assert damaged == CHUNKS - 3
        assert faults.client.get(names[0]) == b"\x00" * 7
        assert faults.client.get(names[1]) == value[:30]
        for name in names[3:]:
            record = faults.client.get(name)
            assert isinstance(record, bytes)
            assert decode_header(record[: head_length(record)]).fingerprint == FOREIGN
        assert faults.inject(Fault.TRUNCATE, random.Random(0), 1.0, None) == CHUNKS - 1
        assert faults.client.get(names[2]) == b""
    finally:
        for name in faults.client.scan_iter(match=f"{prefix}:*"):
            faults.client.delete(name)
        tier.close()
