"""What names the scheduler's keys once the engine runs. What each rank tells in vLLM's connector
handshake: engines whose ranks lay the KV out otherwise share no key, instead of deleting each
other's records; a disk tier indexed before the handshake then loads the chunks of the namespace
it names. Then each connector reset (around a weight update): a generation of their own."""

from __future__ import annotations

from pathlib import Path

import torch
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from kvtier.apps.models import model_path
from kvtier.config import KVTierConfig
from kvtier.keys import make_key
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path
from kvtier.vllm.assembly import SchedulerSide, keys_fingerprint
from kvtier.vllm.handshake import KVTierHandshake, rank_layouts
from kvtier.vllm.kv_role import KVRole

SPEC = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
KV_CACHE = KVCacheConfig(8, [], [KVCacheGroupSpec(["layer.0"], SPEC)])
VEC = "views=[8192B] groups=[[0]] packing=vec"
AMX = "views=[8192B] groups=[[0]] packing=amx"


def _config() -> VllmConfig:
    transfer = KVTransferConfig(
        kv_connector="KVTierConnector", kv_connector_module_path="kvtier.vllm", kv_role="kv_both"
    )
    model = ModelConfig(model=str(model_path("tiny")), dtype="float32")
    return VllmConfig(
        model_config=model, cache_config=CacheConfig(block_size=32), kv_transfer_config=transfer
    )


def _kvtier(disk: Path, **more: object) -> KVTierConfig:
    extra = {"cpu_bytes_to_use": "1MiB", "disk": {"path": str(disk), "bytes": "1MiB"}, **more}
    return KVTierConfig.from_extra_config(extra, 32)


def _file(disk: Path, digest: bytes, block_hash: int) -> bytes:
    """A chunk file of the key of ``block_hash`` in namespace ``digest`` (its bytes unread)."""
    key = make_key(digest, block_hash, 0)
    path = chunk_path(disk, key, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(64))
    return key


def test_the_ranks_layouts_rename_the_keys_and_the_disk_tiers_chunks(tmp_path: Path) -> None:
    config, kvtier = _config(), _kvtier(tmp_path)
    factor = kvtier.block_size_factor(32)
    unnamed = keys_fingerprint(config, KV_CACHE, factor).digest()
    on_vec = keys_fingerprint(config, KV_CACHE, factor, [VEC]).digest()
    on_amx = keys_fingerprint(config, KV_CACHE, factor, [AMX]).digest()
    assert len({unnamed, on_vec, on_amx}) == 3
    keys = [_file(tmp_path, digest, i) for i, digest in enumerate((unnamed, on_vec, on_amx))]
    side = SchedulerSide.build(config, KV_CACHE, kvtier, KVRole(config, kvtier))
    (disk,) = side.scheduler.lower
    assert isinstance(disk, DiskIndex)
    assert side.scheduler.keys.fingerprint_digest == unnamed  # until the ranks tell
    assert [disk.lookup([key]).ready for key in keys] == [1, 0, 0]

    side.handshake({(0, 0): KVTierHandshake(0, VEC)})

    assert side.scheduler.keys.fingerprint_digest == on_vec
    assert side.scheduler.keys.keys([5] * factor, 0) == [make_key(on_vec, 5, 0)]
    assert [disk.lookup([key]).ready for key in keys] == [0, 1, 0]
    assert all(chunk_path(tmp_path, key, 0).exists() for key in keys)


def test_ranks_tell_their_layouts_in_rank_order_each_once() -> None:
    """Tensor ranks of a stage hold one layout, pipeline stages each their own (keyed by stage,
    then tensor rank); another connector's metadata (in a MultiConnector) tells none."""
    told: dict[tuple[int, int], KVConnectorHandshakeMetadata] = {
        (1, 1): KVTierHandshake(1, AMX), (0, 1): KVTierHandshake(1, VEC, "127.0.0.1", 5000),
        (1, 0): KVTierHandshake(0, AMX), (0, 0): KVTierHandshake(0, VEC, "127.0.0.1", 5001),
    }  # fmt: skip
    assert rank_layouts(told) == [VEC, AMX]
    assert rank_layouts({(0, 0): KVConnectorHandshakeMetadata()}) == []


def test_a_reset_names_the_keys_apart_from_every_earlier_chunk(tmp_path: Path) -> None:
    """After a connector reset no key is one from before: not the disk's chunks, not those of a
    request alive across it (salted apart until its next lookup); a reset that keeps the tiers
    (a benchmark's) renames nothing."""
    config = _config()
    hashes = [bytes([i]) * 16 for i in range(4)]
    keys = {}
    for keeps in (False, True):
        kvtier = _kvtier(tmp_path / str(keeps), reset_keeps_tiers=keeps)
        side = SchedulerSide.build(config, KV_CACHE, kvtier, KVRole(config, kvtier))
        side.handshake({(0, 0): KVTierHandshake(0, VEC)})
        scheduler = side.scheduler
        assert scheduler.lookup("alive", hashes, 0) == 0
        alive = scheduler.requests["alive"]
        before = scheduler.keys.fingerprint_digest, alive.group_keys(scheduler.keys, 0, 2)
        assert side.reset()
        after = scheduler.keys.fingerprint_digest, alive.group_keys(scheduler.keys, 0, 2)
        fresh = scheduler.keys.keys(hashes, 0)[:2]
        keys[keeps] = before, after, fresh
    (old, old_alive), (new, new_alive), fresh = keys[False]
    assert old != new and len({*old_alive, *new_alive, *fresh}) == 6
    (old, old_alive), (new, new_alive), fresh = keys[True]
    assert old == new and old_alive == new_alive == fresh
