"""What the scheduler half tells a router (``kvtier/scheduler/prefix_events.py``): each tier's
chunks in the engine's block hashes, with their parent and token ids, stored and removed as the
tiers change. 4-token blocks, chunks of two blocks, a disk tier in tmp_path whose files the test
writes as the workers would."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKey, ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.scheduler.prefix_events import PrefixEvent
from kvtier.step_plan import JobOutcome, StepPlan, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path

FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
FILE = 100  # bytes of a chunk file
HASHES = [f"h{i}".encode() for i in range(8)]  # eight full blocks: four chunks, 32 tokens
TOKENS = list(range(100, 132))


def _connector(
    root: Path, host_chunks: int = 8, disk_chunks: int = 16, events: bool = True
) -> SchedulerConnector:
    budget = disk_chunks * FILE
    config = KVTierConfig(
        cpu_bytes_to_use=1,
        min_async_load_tokens=1,
        sections={"disk": DiskConfig(str(root), budget)},
    )
    disk = DiskIndex(root, budget, 1, FINGERPRINT.digest(), FILE)
    return SchedulerConnector(
        config, [GroupSpec(4)], host_chunks, 1, ChunkKeyMaker(FINGERPRINT, 2), [disk],
        prefix_events=events,
    )  # fmt: skip


def _report(connector: SchedulerConnector, job_id: int, outcome: JobOutcome | None = None) -> None:
    connector.on_report(WorkerReport({job_id: outcome or JobOutcome(ranks=1, bytes=FILE)}))
    connector.check_integrity()


def _on_disk(root: Path, keys: Iterable[ChunkKey]) -> None:
    for key in keys:
        path = chunk_path(root, key, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(FILE))


def _write(connector: SchedulerConnector, plan: StepPlan) -> None:
    """The workers write the plan's disk writes."""
    for job in plan.tier_writes:
        _on_disk(connector.tier("disk").root, job.dst.keys)  # type: ignore[attr-defined]
        _report(connector, job.job_id, JobOutcome(ranks=1, bytes=FILE * len(job.dst.keys)))


def _compute(
    connector: SchedulerConnector,
    req: str,
    blocks: int,
    tokens: Sequence[int] = TOKENS,
    outcome: JobOutcome | None = None,
    held: int = 0,
) -> StepPlan:
    """``req`` computes its first ``blocks`` blocks (the engine holds ``held``); its stores
    finish; it ends. The last plan."""
    assert connector.lookup(req, HASHES[:blocks], 4 * held, token_ids=tokens) == 0
    ids = list(range(10, 10 + blocks))
    connector.on_alloc(req, [ids], 0)
    plan = connector.build_plan([ScheduledRequest(req, [ids], 4 * blocks)])
    for store in plan.stores:
        _report(connector, store.job_id, outcome)
    connector.request_finished(req)
    return plan


def _stored(tier: str, chunk: int) -> PrefixEvent:
    """The event of chunk ``chunk`` (blocks 2c, 2c+1) stored in ``tier``."""
    parent = HASHES[2 * chunk - 1] if chunk else None
    tokens = tuple(TOKENS[8 * chunk : 8 * chunk + 8])
    return PrefixEvent(True, tier, 0, (HASHES[2 * chunk], HASHES[2 * chunk + 1]), parent, tokens)


def _removed(tier: str, chunk: int) -> PrefixEvent:
    return PrefixEvent(False, tier, 0, (HASHES[2 * chunk], HASHES[2 * chunk + 1]), None, ())


def test_a_stored_chunk_is_told_in_the_engines_block_hashes_with_parent_and_tokens(
    tmp_path: Path,
) -> None:
    connector = _connector(tmp_path)
    _compute(connector, "a", 6)  # three chunks
    assert connector.take_events() == [_stored("cpu", 0), _stored("cpu", 1), _stored("cpu", 2)]
    assert connector.take_events() == []

    _compute(connector, "b", 8, held=6)  # the first three are stored: only the fourth is new
    assert connector.take_events() == [_stored("cpu", 3)]


def test_a_chunk_evicted_to_disk_is_removed_from_cpu_and_stored_on_disk(tmp_path: Path) -> None:
    connector = _connector(tmp_path, host_chunks=2)
    _compute(connector, "a", 4)  # chunks 0, 1 fill the host tier
    assert connector.take_events() == [_stored("cpu", 0), _stored("cpu", 1)]

    _write(connector, _compute(connector, "b", 8, held=4))  # 2, 3 evict 0, 1: written as they go
    assert connector.take_events() == [
        _stored("disk", 0), _stored("disk", 1), _removed("cpu", 0), _removed("cpu", 1),
        _stored("cpu", 2), _stored("cpu", 3),
    ]  # fmt: skip


def test_a_reset_removes_what_it_dropped_and_keeps_what_disk_holds(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    _compute(connector, "a", 4)
    _write(connector, connector.build_plan([]))  # idle: written back to disk
    assert connector.take_events() == [
        _stored("cpu", 0), _stored("cpu", 1), _stored("disk", 0), _stored("disk", 1)
    ]  # fmt: skip

    assert connector.drop_host_chunks()
    assert connector.take_events() == [_removed("cpu", 0), _removed("cpu", 1)]


def test_keys_renamed_by_a_reset_withdraw_every_chunk_from_every_tier(tmp_path: Path) -> None:
    """After a reset that renames the keys (``SchedulerSide.reset``) the disk's chunks are not
    loadable here any more: a router is told, and nothing is withdrawn twice."""
    connector = _connector(tmp_path)
    _compute(connector, "a", 4)
    _write(connector, connector.build_plan([]))
    connector.take_events()
    assert connector.prefixes is not None
    connector.prefixes.withdraw_all()
    assert connector.take_events() == [
        _removed("cpu", 0), _removed("disk", 0), _removed("cpu", 1), _removed("disk", 1)
    ]  # fmt: skip
    assert connector.drop_host_chunks()
    assert connector.take_events() == []  # nothing left to withdraw


def test_a_chunk_evicted_from_disk_and_host_is_removed_and_forgotten(tmp_path: Path) -> None:
    connector = _connector(tmp_path, host_chunks=2, disk_chunks=2)
    _compute(connector, "a", 4)
    _write(connector, _compute(connector, "b", 8, held=4))  # 0 and 1 on disk only
    connector.take_events()
    _write(connector, connector.build_plan([]))  # idle: 2 and 3 evict 0 and 1 from disk
    assert connector.take_events() == [
        _stored("disk", 2), _stored("disk", 3), _removed("disk", 0), _removed("disk", 1)
    ]  # fmt: skip
    assert connector.prefixes is not None
    assert len(connector.prefixes) == 2  # 0 and 1 are held nowhere: their descriptions gone


def test_a_chunk_found_on_disk_is_told_once_a_request_loads_it(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    keys = connector.keys.keys(HASHES[:4], 0)
    _on_disk(tmp_path, keys)  # from before a restart: nothing describes them
    connector.build_plan([])
    assert connector.take_events() == []

    assert connector.lookup("b", HASHES[:4], 0, token_ids=TOKENS) == 16
    connector.on_alloc("b", [[20, 21, 22, 23]], 16)
    (load,) = connector.build_plan([]).loads
    _report(connector, load.job_id)
    (store,) = connector.build_plan([ScheduledRequest("b", [[20, 21, 22, 23]], 16)]).stores
    _report(connector, store.job_id)
    assert connector.take_events() == [
        _stored("cpu", 0), _stored("disk", 0), _stored("cpu", 1), _stored("disk", 1)
    ]  # fmt: skip


def test_nothing_is_told_without_token_ids_a_failed_store_or_events_off(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    _compute(connector, "a", 4, tokens=())  # e.g. an image prompt: tokens do not name its KV
    _compute(connector, "b", 8, outcome=JobOutcome(ranks=1, failed=1), held=4)
    assert connector.take_events() == []
    assert connector.prefixes is not None and len(connector.prefixes) == 0

    quiet = _connector(tmp_path / "quiet", events=False)
    _compute(quiet, "a", 4)
    assert quiet.prefixes is None and quiet.take_events() == []
