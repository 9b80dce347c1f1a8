"""The worker half on CPU tensors: it reports every job it ran, also on steps with no forward."""

from __future__ import annotations

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, HostChunks
from kvtier.step_plan import LoadJob, StepPlan, StoreJob
from kvtier.worker.connector import WorkerConnector


def _worker() -> WorkerConnector:
    worker = WorkerConnector(cpu_bytes_to_use=1 << 20, block_size_factor=1, world_size=1)
    caches = {"layer.0": torch.randn(16, 2, 32, 64)}  # 16 KiB per block: 64 host chunks
    worker.register(caches, [["layer.0"]], num_blocks=16)
    return worker


def _store(job_id: int, req: str, blocks: list[int], slots: list[int]) -> StoreJob:
    engine = EngineBlocks(np.array(blocks), (len(blocks),), (0,))
    return StoreJob(job_id, req, engine, HostChunks(np.array(slots)))


def test_a_step_without_forward_still_reports_finished_stores() -> None:
    worker = _worker()
    worker.begin_step(StepPlan(stores=[_store(1, "a", [3, 4], [0, 1])], num_chunks=64))
    worker.start_loads()
    worker.start_stores()  # after this step's forward
    worker.transfers.wait([1])

    worker.begin_step(StepPlan(num_chunks=64))  # next step: nothing scheduled, no forward
    sending, recving, failed = worker.finished(set())
    assert (sending, recving, failed) == (set(), set(), set())  # "a" is not held
    report = worker.report()
    assert list(report.jobs) == [1]
    assert report.jobs[1].ranks == 1 and report.jobs[1].failed == 0
    assert report.jobs[1].bytes == 2 * 16 * 1024
    assert worker.report().jobs == {}  # each job is reported once
    worker.shutdown()


def test_a_held_request_is_released_once_its_stores_are_done() -> None:
    worker = _worker()
    worker.begin_step(StepPlan(stores=[_store(1, "a", [3], [0])], num_chunks=64))
    worker.start_stores()
    worker.transfers.wait([1])
    worker.begin_step(StepPlan(held=["a"], num_chunks=64))  # the request finished meanwhile
    assert worker.finished({"a"})[0] == {"a"}
    assert worker.finished(set())[0] == set()  # reported once
    worker.shutdown()


def test_a_refused_load_is_reported_failed_with_its_blocks() -> None:
    worker = _worker()
    bad = LoadJob(7, "b", HostChunks(np.array([999])), EngineBlocks(np.array([5]), (1,), (0,)))
    worker.begin_step(StepPlan(loads=[bad], num_chunks=64))
    worker.start_loads()
    assert worker.finished(set()) == (set(), {"b"}, {"b"})
    assert worker.take_failed_blocks() == {5}
    assert worker.report().jobs[7].failed == 1
    assert worker.counters.failed_loads == 1
    worker.shutdown()
