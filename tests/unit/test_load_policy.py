"""When kvtier loads, and how: no request may get slower with kvtier than without it.

4-token blocks, one chunk per block, byte-string hashes, one worker rank. With the request's
length given (as vLLM gives it), a hit stops before the last token; a hit in the host tier loads
synchronously (in the request's own step); a load that makes the request wait must add
``min_async_load_tokens``.
"""

from __future__ import annotations

from pathlib import Path

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path

HASHES = [b"h0", b"h1", b"h2", b"h3"]  # four full blocks: 16 tokens
FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
FILE = 64  # bytes of one chunk file


def _connector(
    min_async: int = 8, groups: int = 1, disk: Path | None = None, host_chunks: int = 8
) -> SchedulerConnector:
    disk_config = DiskConfig(str(disk), 64 * FILE) if disk is not None else None
    config = KVTierConfig(
        cpu_bytes_to_use=1, min_async_load_tokens=min_async, sections={"disk": disk_config}
    )
    index = DiskIndex(disk, 64 * FILE, 1, FINGERPRINT.digest(), FILE) if disk else None
    return SchedulerConnector(
        config,
        [GroupSpec(4)] * groups,
        host_chunks,
        1,
        ChunkKeyMaker(FINGERPRINT, 1),
        [index] if index is not None else [],
    )


def _done(connector: SchedulerConnector, job_id: int) -> None:
    connector.on_report(WorkerReport({job_id: JobOutcome(ranks=1, bytes=FILE, seconds=0.01)}))


def _store(connector: SchedulerConnector, hashes: list[bytes], report: bool = True) -> int:
    """Request "a" computes ``hashes``' blocks; its store job (reported done if ``report``)."""
    groups = len(connector.groups)
    blocks = [list(range(10, 10 + len(hashes)))] * groups
    assert connector.lookup("a", hashes, 0, len(hashes) * 4) == 0
    connector.on_alloc("a", blocks, 0)
    (store,) = connector.build_plan([ScheduledRequest("a", blocks, len(hashes) * 4)]).stores
    if report:
        _done(connector, store.job_id)
    return store.job_id


def test_a_host_hit_loads_in_the_requests_own_step_and_leaves_the_last_token() -> None:
    connector = _connector()
    _store(connector, HASHES)
    assert connector.lookup("b", HASHES, 0, 16) == 15  # the engine computes token 15
    assert connector.loads_async("b") is False
    connector.on_alloc("b", [[20, 21, 22, 23]], 15)
    (load,) = connector.build_plan([]).loads
    assert load.sync is True
    assert load.dst.block_ids.tolist() == [20, 21, 22, 23]  # the last block too, loaded whole
    assert connector.requests["b"].loaded_tokens == {"cpu": 15}
    _done(connector, load.job_id)
    connector.check_integrity()


def test_the_engines_own_hit_is_extended_by_a_host_chunk_without_a_wait() -> None:
    connector = _connector()
    _store(connector, HASHES)
    # the engine holds three blocks itself; kvtier adds the fourth but its last token
    assert connector.lookup("b", HASHES, 12, 16) == 3
    assert connector.loads_async("b") is False


def test_a_store_in_flight_is_not_waited_for_when_it_would_add_little() -> None:
    connector = _connector(min_async=8)
    job = _store(connector, HASHES, report=False)
    assert connector.lookup("b", HASHES, 12, 16) == 0  # 3 tokens: compute them now
    assert connector.lookup("c", HASHES, 0, 16) is None  # 15 tokens: worth a step
    _done(connector, job)
    assert connector.lookup("c", HASHES, 0, 16) == 15


def test_several_groups_load_asynchronously_and_only_when_worth_a_step() -> None:
    connector = _connector(min_async=8, groups=2)
    _store(connector, HASHES)
    assert connector.lookup("b", HASHES, 0, 16) == 15
    assert connector.loads_async("b") is True
    assert connector.lookup("c", HASHES, 8, 16) == 0  # 7 tokens: not worth waiting a step


def test_a_short_disk_run_is_read_before_the_forward_a_long_one_makes_the_request_wait(
    tmp_path: Path,
) -> None:
    connector = _connector(min_async=8, disk=tmp_path)
    keys = connector.keys.keys(HASHES, 0)
    _store(connector, HASHES[:2])  # chunks 0 and 1 in the host tier
    for key in keys[2:]:  # chunks 2 and 3 on disk only
        path = chunk_path(tmp_path, key, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(FILE))
    # host: 8 tokens; disk: 7 more (capped at the last token): read before the step's forward
    assert connector.lookup("b", HASHES, 0, 16) == 15
    assert connector.loads_async("b") is False
    connector.on_alloc("b", [[20, 21, 22, 23]], 15)
    loads = connector.build_plan([]).loads
    assert [load.sync for load in loads] == [True, True]
    # a longer disk run is worth a step: the whole hit loads while the request waits
    connector = _connector(min_async=4, disk=tmp_path)
    _store(connector, HASHES[:2])
    assert connector.lookup("b", HASHES, 0, 16) == 15
    assert connector.loads_async("b") is True
    connector.on_alloc("b", [[20, 21, 22, 23]], 15)
    loads = connector.build_plan([]).loads
    assert [load.sync for load in loads] == [False, False]
    assert connector.requests["b"].loaded_tokens == {"cpu": 8, "disk": 7}


def test_before_its_lookup_a_request_may_load_async_where_a_tier_makes_it_wait(
    tmp_path: Path,
) -> None:
    # vLLM 0.34's --max-num-inflight-kv-loads asks as it queues a request (``may_load_async``)
    host = _connector(min_async=4)
    assert not host.may_load_async(HASHES, 16)  # nothing held
    _store(host, HASHES)
    assert not host.may_load_async(HASHES, 16)  # one group: host hits load in their own step
    assert host.lookup("b", HASHES, 0, 16) == 15 and not host.loads_async("b")
    several = _connector(min_async=4, groups=2)  # every load makes the request wait
    assert not several.may_load_async(HASHES, 16)
    _store(several, HASHES[:1])
    assert several.may_load_async(HASHES, 16) and several.may_load_async(HASHES[:1], 5)
    assert not several.may_load_async(HASHES[:1], 4)  # no chunk before its last token
    for key in ChunkKeyMaker(FINGERPRINT, 1).keys(HASHES, 0, 1):  # chunks 1-3: on disk
        path = chunk_path(tmp_path, key, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(FILE))
    disk = _connector(min_async=4, disk=tmp_path)
    assert not disk.may_load_async(HASHES, 16)  # chunk 0 is nowhere: no hit
    _store(disk, HASHES[:1])  # chunk 0 in the host tier: the walk goes on to chunk 1, on disk
    assert disk.may_load_async(HASHES, 16) and not disk.may_load_async(HASHES, 8)
    assert disk.lookup("b", HASHES, 0, 16) == 15 and disk.loads_async("b")


def test_a_synchronous_loads_chunks_may_be_evicted_by_the_same_steps_stores() -> None:
    """A worker reads a synchronous load's slots before the step's forward, and writes the
    step's stores after it: the stores may take those slots, so a tiny tier still turns over."""
    connector = _connector(host_chunks=4)
    _store(connector, HASHES)
    longer = [*HASHES, b"h4", b"h5"]  # 24 tokens: the four stored chunks, then two new ones
    assert connector.lookup("b", longer, 0, 24) == 16
    blocks = [[20, 21, 22, 23, 24, 25]]
    connector.on_alloc("b", blocks, 16)
    plan = connector.build_plan([ScheduledRequest("b", blocks, 24)])
    (load,) = plan.loads
    (store,) = plan.stores
    assert load.sync and store.src.block_ids.tolist() == [24, 25]
    assert connector.stats.cpu.evicted_chunks == 2
    connector.check_integrity()
    _done(connector, load.job_id)  # nothing left to unpin
    _done(connector, store.job_id)
    assert connector.manager.num_pinned == 0
    connector.check_integrity()


PROMPT = list(range(100, 114))  # 14 tokens: three full 4-token blocks and 2 tokens more


def _store_prompt(connector: SchedulerConnector, factor: int = 1) -> None:
    """Request "a" computes ``PROMPT``: its full chunks and its tail are stored."""
    blocks = [[10, 11, 12, 13]]
    assert connector.lookup("a", HASHES[:3], 0, 14, PROMPT[12:]) == 0
    connector.on_alloc("a", blocks, 0)
    stores = connector.build_plan([ScheduledRequest("a", blocks, 14)]).stores
    tail = stores[-1]
    assert tail.keys == ()  # never flushed to disk at shutdown
    assert tail.src.block_ids.tolist() == [10, 11, 12, 13][3 // factor * factor :]
    for store in stores:
        _done(connector, store.job_id)


def test_a_prompts_tail_leaves_the_engine_one_token_at_any_length() -> None:
    connector = _connector()
    _store_prompt(connector)
    assert connector.stats.cpu.stored_chunks == 4  # three chunks and the tail
    assert connector.lookup("b", HASHES[:3], 0, 14, PROMPT[12:]) == 13
    connector.on_alloc("b", [[20, 21, 22, 23]], 13)
    (load,) = connector.build_plan([]).loads
    assert load.sync and load.dst.block_ids.tolist() == [20, 21, 22, 23]
    _done(connector, load.job_id)
    assert connector.stats.cpu.hit_chunks == 3  # the full chunks looked up; the tail is extra
    assert connector.stats.cpu.miss_chunks == 3  # request "a"'s first lookup
    # the engine's own hit of three blocks: kvtier adds the tail, the engine computes 1 token
    assert connector.lookup("c", HASHES[:3], 12, 14, PROMPT[12:]) == 1
    connector.check_integrity()


def test_another_tail_after_the_same_blocks_is_a_miss() -> None:
    connector = _connector()
    _store_prompt(connector)
    assert connector.lookup("b", HASHES[:3], 0, 14, [7, 7]) == 12  # the full chunks only
    assert connector.lookup("c", HASHES[:3], 0, 15, [*PROMPT[12:], 5]) == 12
    assert connector.lookup("d", HASHES[:3], 0, 14, None) == 12  # tokens do not name the KV


def test_a_tail_spans_the_blocks_after_the_last_full_chunk() -> None:
    connector = SchedulerConnector(
        KVTierConfig(cpu_bytes_to_use=1, block_size=8), [GroupSpec(4)], 8, 1,
        ChunkKeyMaker(FINGERPRINT, 2),
    )  # fmt: skip
    _store_prompt(connector, factor=2)  # chunk 0 (blocks 0-1), tail: block 2 and half of 3
    assert connector.lookup("b", HASHES[:3], 0, 14, PROMPT[12:]) == 13
    connector.on_alloc("b", [[20, 21, 22, 23]], 13)
    (load,) = connector.build_plan([]).loads
    assert load.dst.block_ids.tolist() == [20, 21, 22, 23]
    assert connector.requests["b"].loaded_tokens == {"cpu": 13}


def test_a_tail_is_never_written_to_disk(tmp_path: Path) -> None:
    config = KVTierConfig(
        cpu_bytes_to_use=1,
        sections={"disk": DiskConfig(str(tmp_path), 64 * FILE, write_through=True)},
    )
    index = DiskIndex(tmp_path, 64 * FILE, 1, FINGERPRINT.digest(), FILE, write_through=True)
    connector = SchedulerConnector(
        config, [GroupSpec(4)], 8, 1, ChunkKeyMaker(FINGERPRINT, 1), [index]
    )
    _store_prompt(connector)
    writes = connector.build_plan([]).tier_writes
    assert sum(len(job.dst.keys) for job in writes) == 3  # the full chunks, not the tail
