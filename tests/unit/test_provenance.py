"""Provenance and the host-tier reset in the scheduler half, as a specification: 128-token
blocks (a hit of two is worth a wait: ``min_async_load_tokens``), one chunk per block, byte-string
block hashes, one rank, a disk tier in tmp_path whose files the test writes as the workers would."""

from __future__ import annotations

from pathlib import Path

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKey, ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, ScheduledRequest, SchedulerConnector
from kvtier.scheduler.provenance import Provenance
from kvtier.step_plan import JobOutcome, LoadJob, WorkerReport
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.disk.index import DiskIndex
from kvtier.tiers.disk.names import chunk_path

FINGERPRINT = LayoutFingerprint("m", "f32", "test", 0, 1, 0, 4)
FILE = 100  # bytes of one chunk file
BLOCK = 128  # tokens
HASHES = [b"h0", b"h1", b"h2", b"h3"]  # four full blocks: 512 tokens
PROMPT = 4 * BLOCK + 2  # tokens: the four blocks and two more


def _connector(root: Path) -> SchedulerConnector:
    config = KVTierConfig(cpu_bytes_to_use=1, sections={"disk": DiskConfig(str(root), 16 * FILE)})
    disk = DiskIndex(root, 16 * FILE, 1, FINGERPRINT.digest(), FILE)
    return SchedulerConnector(
        config, [GroupSpec(BLOCK)], 8, 1, ChunkKeyMaker(FINGERPRINT, 1), [disk]
    )


def _report(connector: SchedulerConnector, job_id: int, failed: bool = False) -> None:
    outcome = JobOutcome(ranks=1, failed=int(failed), bytes=FILE, seconds=0.25)
    connector.on_report(WorkerReport({job_id: outcome}))
    connector.check_integrity()


def _in_host(connector: SchedulerConnector, hashes: list[bytes]) -> None:
    """Request "a" computes ``hashes``' blocks; its stores finish; it ends."""
    blocks = list(range(10, 10 + len(hashes)))
    assert connector.lookup("a", hashes, 0) == 0
    connector.on_alloc("a", [blocks], 0)
    for store in connector.build_plan(
        [ScheduledRequest("a", [blocks], BLOCK * len(hashes))]
    ).stores:
        _report(connector, store.job_id)
    assert connector.request_finished("a") is False


def _on_disk(root: Path, keys: list[ChunkKey]) -> None:
    for key in keys:
        path = chunk_path(root, key, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(FILE))


def _host_then_disk(connector: SchedulerConnector, root: Path) -> tuple[LoadJob, LoadJob]:
    """Blocks 0-1 in the host tier, 2-3 on disk; request "b" loads all four."""
    _in_host(connector, HASHES[:2])
    _on_disk(root, connector.keys.keys(HASHES, 0)[2:])
    assert connector.lookup("b", HASHES, 0) == 4 * BLOCK
    connector.on_alloc("b", [[20, 21, 22, 23]], 4 * BLOCK)
    host, disk = connector.build_plan([]).loads
    return host, disk


def test_a_hit_from_host_memory_then_disk_names_both_tiers(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    host, disk = _host_then_disk(connector, tmp_path)
    _report(connector, host.job_id)
    _report(connector, disk.job_id)

    found = connector.provenance("b", PROMPT)
    assert found == Provenance(PROMPT, 0, {"cpu": 256, "disk": 256}, 0, 2, 0.5)
    assert found.as_params() == {
        "kvtier": {"prompt_tokens": 514, "engine_cached_tokens": 0, "cpu": 256, "disk": 256,
                   "failed_tokens": 0, "computed": 2, "load_ms": 500.0}
    }  # fmt: skip
    seconds = connector.job_log.seconds.take()
    assert seconds.loads == {"cpu": [0.25], "disk": [0.25]}
    assert seconds.stores == {"cpu": [0.25]}  # request "a"'s store: one job
    assert connector.job_log.seconds.take().loads == {}  # taken


def test_the_engines_own_hit_comes_first(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    _in_host(connector, HASHES)
    assert connector.lookup("b", HASHES, BLOCK) == 3 * BLOCK  # the engine holds the first block
    connector.on_alloc("b", [[20, 21, 22, 23]], 3 * BLOCK)
    (load,) = connector.build_plan([]).loads
    _report(connector, load.job_id)
    found = connector.provenance("b", PROMPT)
    assert found is not None
    assert found == Provenance(PROMPT, 128, {"cpu": 384, "disk": 0}, 0, 2, 0.25)


def test_a_failed_disk_load_is_computed(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    host, disk = _host_then_disk(connector, tmp_path)
    _report(connector, host.job_id)
    _report(connector, disk.job_id, failed=True)
    found = connector.provenance("b", PROMPT)
    assert found == Provenance(PROMPT, 0, {"cpu": 256, "disk": 0}, 256, 258, 0.5)
    assert connector.job_log.seconds.take().loads == {"cpu": [0.25]}  # failures: no sample


def test_a_failed_host_load_makes_every_later_tier_computed(tmp_path: Path) -> None:
    """The engine recomputes from the first block that failed: the disk part too."""
    connector = _connector(tmp_path)
    host, disk = _host_then_disk(connector, tmp_path)
    _report(connector, host.job_id, failed=True)
    _report(connector, disk.job_id)
    found = connector.provenance("b", PROMPT)
    assert found == Provenance(PROMPT, 0, {"cpu": 0, "disk": 0}, 512, 514, 0.5)


def test_provenance_is_forgotten_when_the_request_finishes(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    host, disk = _host_then_disk(connector, tmp_path)
    _report(connector, host.job_id)
    assert len(connector.job_log) == 1
    assert connector.request_finished("b") is False  # aborted while its disk load runs
    assert len(connector.job_log) == 0
    _report(connector, disk.job_id)  # a load finishing after the end leaves nothing behind
    assert len(connector.job_log) == 0
    assert "b" not in connector.requests
    assert connector.provenance("b", PROMPT) is None
    assert connector.provenance("never", PROMPT) is None


def test_provenance_never_counts_past_the_prompt(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    host, disk = _host_then_disk(connector, tmp_path)
    found = connector.provenance("b", 300)  # a prompt shorter than the planned load
    assert found == Provenance(300, 0, {"cpu": 256, "disk": 44}, 0, 0, 0.0)


def test_dropping_the_host_tier_keeps_pinned_chunks_and_the_disk(tmp_path: Path) -> None:
    connector = _connector(tmp_path)
    _in_host(connector, HASHES[:2])  # dirty: not on disk yet (write-back, never idle)
    _on_disk(tmp_path, connector.keys.keys(HASHES, 0)[2:])
    assert connector.lookup("b", HASHES[:2], 0) == 2 * BLOCK
    connector.on_alloc("b", [[20, 21]], 2 * BLOCK)
    (load,) = connector.build_plan([]).loads

    assert connector.drop_host_chunks() is False  # its chunks are pinned by the load
    assert list(connector.manager.stored()) == connector.keys.keys(HASHES[:2], 0)
    connector.check_integrity()
    _report(connector, load.job_id)
    assert connector.drop_host_chunks() is True
    assert connector.manager.stored() == {}
    assert connector.request_finished("b") is False
    assert connector.build_plan([]).tier_writes == []  # the dropped chunks are not written
    assert connector.tier("disk") is not None
    assert connector.tier("disk").lookup(connector.keys.keys(HASHES, 0)[2:]).ready == 2  # kept
    connector.check_integrity()
