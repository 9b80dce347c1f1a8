"""A synchronous load that fails never lets KV computed from its blocks into a tier (issue 19).

The scheduler plans a step's stores before its synchronous loads run (they run before the step's
forward, on the workers). When such a load fails, vLLM recomputes the tokens, but the stores the
step planned copy out what the forward computed from the failed blocks. Specification, with
4-token blocks, one chunk a block, a disk tier whose files the test writes as workers would.
"""

from __future__ import annotations

from pathlib import Path

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path

FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
FILE = 100
HASHES = [f"h{i}".encode() for i in range(8)]  # eight full blocks: 32 tokens
PROMPT = 34  # tokens: 8 full blocks and 2 more
OK = JobOutcome(ranks=1, bytes=FILE, seconds=0.01)
FAILED = JobOutcome(ranks=1, failed=1, bad=[1])


def _connector(
    root: Path, ranks: int = 1, wait: int = 10_000, before_forward: bool = True
) -> SchedulerConnector:
    disk = DiskConfig(str(root), 64 * FILE * ranks)
    # by default every disk read is synchronous: before the forward of the step that runs the
    # request (a load that makes the request wait must add ``wait`` tokens)
    config = KVTierConfig(cpu_bytes_to_use=1, min_async_load_tokens=wait, sections={"disk": disk})
    index = DiskIndex(root, 64 * FILE * ranks, ranks, FINGERPRINT.digest(), FILE * ranks)
    return SchedulerConnector(config, [GroupSpec(4)], 16, ranks, ChunkKeyMaker(FINGERPRINT, 1),
                              [index], chain_before_forward=before_forward)  # fmt: skip


def _on_disk(connector: SchedulerConnector, count: int, ranks: int = 1) -> None:
    assert connector.tier("disk") is not None
    for key in connector.keys.keys(HASHES[:count], 0):
        for rank in range(ranks):
            path = chunk_path(connector.tier("disk").root, key, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(bytes(FILE))


def _report(connector: SchedulerConnector, outcomes: dict[int, JobOutcome]) -> None:
    connector.on_report(WorkerReport(outcomes))
    connector.check_integrity()


def _sync_hit(connector: SchedulerConnector, req: str, blocks: list[int]) -> StepPlan:
    """``req``'s first 4 blocks are on disk: a synchronous load, then the whole prompt computed
    in the same step (its stores planned with it)."""
    assert connector.lookup(req, HASHES, 0, PROMPT, [1, 2]) == 16
    assert not connector.loads_async(req)
    connector.on_alloc(req, [blocks], 16)
    plan = connector.build_plan([ScheduledRequest(req, [blocks], PROMPT, PROMPT - 16)])
    (load,) = plan.loads
    assert load.sync and load.dst.block_ids.tolist() == blocks[:4]
    return plan


def _stored(connector: SchedulerConnector) -> int:
    return len(connector.manager.stored())


def test_a_good_synchronous_hit_stores_its_chunks_in_the_same_step(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    _on_disk(connector, 4)
    plan = _sync_hit(connector, "a", list(range(20, 29)))
    # 4 chunks loaded (stored again), 4 computed, and the prompt's tail
    assert sum(max(1, len(store.keys)) for store in plan.stores) == 9
    _report(connector, {job.job_id: OK for job in [*plan.loads, *plan.stores]})
    assert _stored(connector) == 9
    assert connector.stats.cpu.untrusted_stores == 0


def test_the_stores_of_a_step_whose_synchronous_load_failed_never_reach_the_host_tier(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path)
    _on_disk(connector, 4)
    blocks = list(range(20, 29))
    plan = _sync_hit(connector, "a", blocks)
    stores = [store.job_id for store in plan.stores]
    # the load and the stores come back in one report (every rank: load, forward, stores)
    _report(connector, {plan.loads[0].job_id: FAILED} | {job: OK for job in stores})
    assert _stored(connector) == 0  # not one chunk computed from the failed blocks
    assert connector.stats.cpu.untrusted_stores == 9
    assert connector.stats.tiers["disk"].bad_chunks == 1
    nothing = connector.build_plan([])
    assert len(set(nothing.forget)) == 9  # no worker flushes its copies to disk at shutdown

    # vLLM rolled the request back to its first failed block and recomputes: the chunks are
    # offered again, from the engine's recomputed blocks
    again = connector.build_plan([ScheduledRequest("a", [blocks], PROMPT, PROMPT)])
    assert sum(max(1, len(store.keys)) for store in again.stores) == 9
    _report(connector, {store.job_id: OK for store in again.stores})
    assert _stored(connector) == 9


def test_one_rank_failing_is_enough_and_the_next_steps_stores_are_not_trusted_either(
    tmp_path: Path,
) -> None:
    """Two ranks, only rank 1's load fails; with asynchronous scheduling the next step was
    planned before the report: its stores of the request are not trusted either."""
    connector = _connector(tmp_path, ranks=2)
    _on_disk(connector, 4, ranks=2)
    blocks = list(range(20, 30))
    plan = _sync_hit(connector, "a", blocks[:9])
    more = HASHES + [b"h8"]
    connector.requests["a"].block_hashes = more
    nxt = connector.build_plan([ScheduledRequest("a", [blocks[9:]], 36, 2, appended=True)])
    assert [len(store.keys) for store in nxt.stores] == [1]
    load = plan.loads[0].job_id
    first = {load: OK} | {store.job_id: OK for store in plan.stores}
    _report(connector, first)  # rank 0: every job fine
    _report(connector, {load: FAILED} | {store.job_id: OK for store in plan.stores})
    _report(connector, {store.job_id: OK for store in nxt.stores})
    _report(connector, {store.job_id: OK for store in nxt.stores})
    assert _stored(connector) == 0
    assert connector.stats.cpu.untrusted_stores == 10  # 8 chunks, the tail, the next chunk


def test_a_request_sharing_the_failed_blocks_through_the_prefix_cache_stores_nothing(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path)
    _on_disk(connector, 4)
    blocks = list(range(20, 29))
    plan = _sync_hit(connector, "a", blocks)
    # "b" got the engine's own prefix hit on "a"'s first four blocks in the same step
    other = [f"b{i}".encode() for i in range(4)]
    assert connector.lookup("b", HASHES[:4] + other, 16, 34, [1, 2]) == 0
    b_blocks = blocks[:4] + list(range(40, 45))
    connector.on_alloc("b", [b_blocks], 0)
    b_plan = connector.build_plan([ScheduledRequest("b", [b_blocks], 34, 18)])
    assert b_plan.stores
    _report(
        connector,
        {plan.loads[0].job_id: FAILED}
        | {store.job_id: OK for store in [*plan.stores, *b_plan.stores]},
    )
    assert _stored(connector) == 0


def test_where_vllm_cannot_recompute_a_failed_sync_load_no_disk_read_runs_before_the_forward(
    tmp_path: Path,
) -> None:
    """Model Runner V2 and asynchronous scheduling (vLLM's defaults on CUDA) recompute a failed
    synchronous load wrong (``vllm/recovery.py``): a disk hit then loads while its request
    waits when that is worth a step, and is computed when not. Host memory's hits still load
    before the forward."""
    worth_a_step = _connector(tmp_path / "a", wait=8, before_forward=False)
    _on_disk(worth_a_step, 4)
    assert worth_a_step.lookup("a", HASHES, 0, PROMPT, [1, 2]) == 16
    assert worth_a_step.loads_async("a")
    not_worth_it = _connector(tmp_path / "b", before_forward=False)
    _on_disk(not_worth_it, 4)
    assert not_worth_it.lookup("b", HASHES, 0, PROMPT, [1, 2]) == 0

    recovered = _connector(tmp_path / "c")  # where vLLM recovers: before the forward
    _on_disk(recovered, 4)
    assert _sync_hit(recovered, "c", list(range(20, 29))).loads[0].sync
    host = _connector(tmp_path / "d", before_forward=False)
    assert host.lookup("d", HASHES, 0, PROMPT, [1, 2]) == 0
    host.on_alloc("d", [list(range(20, 29))], 0)
    stores = host.build_plan([ScheduledRequest("d", [list(range(20, 29))], PROMPT, PROMPT)])
    _report(host, {store.job_id: OK for store in stores.stores})
    assert host.lookup("e", HASHES, 0, PROMPT, [1, 2]) == PROMPT - 1  # all but the last token
    assert not host.loads_async("e")
