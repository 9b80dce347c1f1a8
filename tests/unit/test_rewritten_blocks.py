"""Blocks the engine writes before the workers wait for the stores reading them.

vLLM's Model Runner V2 (its default on CUDA) zeroes new blocks and fills copy-on-write ones
before the connector's ``handle_preemptions``, where kvtier's workers wait for the stores a
plan flushes: a store still reading such a block (its request preempted, the block handed on)
may copy out the new bytes. Its chunks must never become loadable. 4-token blocks, one chunk a
block, one worker rank.
"""

from __future__ import annotations

from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
from vllm.v1.core.sched.output import SchedulerOutput

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport
from kvtier.vllm.schedule import rewritten_early

HASHES = [b"a0", b"a1", b"a2"]  # three full blocks: 12 tokens
BLOCKS = [10, 11, 12]
OK = JobOutcome(ranks=1, bytes=100, seconds=0.01)


def _connector() -> SchedulerConnector:
    fingerprint = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
    config = KVTierConfig(cpu_bytes_to_use=1, min_async_load_tokens=1)
    return SchedulerConnector(config, [GroupSpec(4)], 8, 1, ChunkKeyMaker(fingerprint, 1))


def _store_then_preempt(connector: SchedulerConnector, rewritten: list[int]) -> StepPlan:
    """``a`` computes its three blocks; the next step preempts it and hands block 11 to ``b``,
    the engine writing ``rewritten`` before the flush. The first step's plan."""
    assert connector.lookup("a", HASHES, 0) == 0
    connector.on_alloc("a", [BLOCKS], 0)
    first = connector.build_plan([ScheduledRequest("a", [BLOCKS], 12)])
    assert connector.lookup("b", [b"b0"], 0) == 0
    connector.on_alloc("b", [[11]], 0)
    nxt = connector.build_plan(
        [ScheduledRequest("b", [[11]], 1)], preempted=["a"], rewritten=rewritten
    )
    (store,) = first.stores
    assert store.job_id in nxt.flush  # the workers still wait for it, before the forward
    return first


def test_a_store_whose_block_was_rewritten_before_the_flush_never_lands() -> None:
    connector = _connector()
    first = _store_then_preempt(connector, rewritten=[11])
    (store,) = first.stores
    connector.on_report(WorkerReport({store.job_id: OK}))  # every rank copied "fine"
    assert connector.stats.cpu.stored_chunks == 0
    assert connector.stats.cpu.untrusted_stores == 3
    assert connector.lookup("c", HASHES, 0) == 0  # no other request is served them
    assert len(set(connector.build_plan([]).forget)) == 3  # no worker flushes its copies

    # resumed, "a" is computed again into new blocks: its chunks are stored from those
    assert connector.lookup("a", HASHES, 0) == 0
    connector.on_alloc("a", [[20, 21, 22]], 0)
    (again,) = connector.build_plan([ScheduledRequest("a", [[20, 21, 22]], 12, 12)]).stores
    assert again.src.block_ids.tolist() == [20, 21, 22]
    connector.on_report(WorkerReport({again.job_id: OK}))
    assert connector.stats.cpu.stored_chunks == 3
    connector.check_integrity()


def test_a_store_whose_blocks_only_went_back_to_the_pool_lands() -> None:
    connector = _connector()
    first = _store_then_preempt(connector, rewritten=[13])  # another block rewritten
    connector.on_report(WorkerReport({first.stores[0].job_id: OK}))
    assert connector.stats.cpu.stored_chunks == 3
    assert connector.stats.cpu.untrusted_stores == 0
    connector.check_integrity()


def test_the_blocks_v2_writes_early_are_its_zeroed_and_copied_on_write_ones() -> None:
    output = SchedulerOutput.make_empty()
    assert rewritten_early(output) == []
    output.new_block_ids_to_zero = [4, 5]
    output.kv_cache_block_copies = [KVCacheBlockCopy(src_block_id=1, dst_block_id=9)]
    assert rewritten_early(output) == [4, 5, 9]
