"""kvtier's KV events tell what else names a chunk's KV as vLLM's own events of the same blocks
do: the request's LoRA adapter and each block's extra keys (the adapter, a prompt's cache salt),
checked against vLLM's block pool on a real ``Request``, through the scheduler half's
description of a stored chunk."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.distributed.kv_events import BlockStored
from vllm.lora.request import LoRARequest
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, WorkerReport
from kvtier.vllm.kv_events import block_tags, kv_events

BLOCK = 16
PROMPT = list(range(10, 74))  # four full blocks: two chunks of two


def _request(lora: LoRARequest | None = None, salt: str | None = None) -> Request:
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    return Request("r", PROMPT, SamplingParams(max_tokens=4), None, lora_request=lora,
                   cache_salt=salt, block_hasher=hasher)  # fmt: skip


def _vllms(request: Request) -> list[BlockStored]:
    """vLLM's own events of the request's four blocks, cached one chunk at a time."""
    pool = BlockPool(16, True, BLOCK, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 2, BLOCK, 0)
    pool.cache_full_blocks(request, blocks, 2, 4, BLOCK, 0)
    return [e for e in pool.take_events() if isinstance(e, BlockStored)]


def _kvtiers(request: Request) -> list[BlockStored]:
    """kvtier's events of the same blocks, once the host tier stored the request's chunks."""
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
    config = KVTierConfig(cpu_bytes_to_use=1, min_async_load_tokens=1)
    connector = SchedulerConnector(config, [GroupSpec(BLOCK)], 8, 1, ChunkKeyMaker(fingerprint, 2),
                                   [], prefix_events=True)  # fmt: skip
    hashes = request.block_hashes
    assert connector.lookup("r", hashes, 0, token_ids=PROMPT,
                            block_tags=block_tags(request, BLOCK)) == 0  # fmt: skip
    connector.on_alloc("r", [[1, 2, 3, 4]], 0)
    plan = connector.build_plan([ScheduledRequest("r", [[1, 2, 3, 4]], len(PROMPT))])
    for store in plan.stores:  # the workers stored them
        connector.on_report(WorkerReport({store.job_id: JobOutcome(ranks=1, bytes=100)}))
    return [e for e in kv_events(connector.take_events(), BLOCK) if isinstance(e, BlockStored)]


def test_an_adapters_and_a_salts_chunks_are_told_as_vllm_tells_their_blocks() -> None:
    request = _request(LoRARequest("ad", 7, "/adapters/ad"), salt="tenant-1")
    vllms, kvtiers = _vllms(request), _kvtiers(request)
    assert len(vllms) == len(kvtiers) == 2
    for theirs, ours in zip(vllms, kvtiers, strict=True):
        assert ours.block_hashes == theirs.block_hashes
        assert ours.parent_block_hash == theirs.parent_block_hash
        assert (ours.lora_id, ours.lora_name) == (theirs.lora_id, theirs.lora_name) == (7, "ad")
        assert ours.extra_keys == theirs.extra_keys
    assert vllms[0].extra_keys == [("ad", "tenant-1"), ("ad",)]  # the salt: the first block's


def test_a_request_of_neither_tells_nothing_more() -> None:
    request = _request()
    assert block_tags(request, BLOCK) is None
    for event in _kvtiers(request):
        assert (event.lora_id, event.lora_name, event.extra_keys) == (None, None, None)
