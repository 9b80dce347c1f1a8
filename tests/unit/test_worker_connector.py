"""The worker half on CPU tensors: it reports every job it ran, also on steps with no forward."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

import numpy as np
import torch

from kvtier.addresses import EngineBlocks, HostChunks, TransferSpec
from kvtier.media import Medium
from kvtier.step_plan import LoadJob, StepPlan, StoreJob
from kvtier.tiers.base.handler import TransferHandler, TransferResult
from kvtier.worker.connector import IDLE_WAIT_S, WorkerConnector


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


class _Copy(TransferHandler):
    """Host memory -> engine blocks, as a GPU's copy runs: in flight until ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.jobs: list[int] = []
        self.waited: list[float] = []

    def transfer_async(self, job_id: int, src: TransferSpec, dst: TransferSpec) -> bool:
        self.jobs.append(job_id)
        return True

    def get_finished(self) -> list[TransferResult]:
        if not self.done.is_set():
            return []
        finished, self.jobs = self.jobs, []
        return [TransferResult(job_id, True, 1, 0.001) for job_id in finished]

    def wait(self, job_ids: Collection[int]) -> None:
        self.done.wait()

    def wait_any(self, timeout: float) -> None:
        started = time.monotonic()
        self.done.wait(timeout)
        self.waited.append(time.monotonic() - started)


def _loading() -> tuple[WorkerConnector, _Copy]:
    """A worker whose load of request "a" from host memory runs until ``copy.done`` is set."""
    worker = WorkerConnector(cpu_bytes_to_use=1 << 20, block_size_factor=1, world_size=1)
    copy = _Copy()
    worker.transfers.register_handler(Medium.CPU, Medium.ENGINE, copy)
    load = LoadJob(3, "a", HostChunks(np.array([0])), EngineBlocks(np.array([5]), (1,), (0,)))
    worker.begin_step(StepPlan(loads=[load], num_chunks=64))
    worker.start_loads()
    return worker, copy


def test_a_step_without_forward_waits_for_a_load_from_host_memory() -> None:
    """The request waits for its load from host memory (a GPU's copy, on its stream): a step
    with nothing to compute blocks on it, the GIL released, instead of returning at once and
    spinning the engine's loop against the thread that queues the copy."""
    worker, copy = _loading()
    worker.begin_step(StepPlan(num_chunks=64, forward=False))  # "a" waits: nothing to compute
    assert worker.finished(set()) == (set(), set(), set())
    assert len(copy.waited) == 1 and copy.waited[0] >= IDLE_WAIT_S * 0.9  # it waited it out
    copy.done.set()
    worker.begin_step(StepPlan(num_chunks=64, forward=False))
    assert worker.finished(set()) == (set(), {"a"}, set())
    assert copy.waited[1] < copy.waited[0]  # the copy was done: returned at once


def test_a_drain_returns_once_every_transfer_in_flight_is_done() -> None:
    """Before vLLM unmaps the engine's KV memory (``unregister_kv_caches``: sleep, a weight
    update), no copy may still run into it."""
    worker, copy = _loading()
    drain = threading.Thread(target=worker.drain)
    drain.start()
    drain.join(timeout=0.2)
    assert drain.is_alive()  # the copy still runs
    copy.done.set()
    drain.join(timeout=10)
    assert not drain.is_alive()
    worker.drain()  # nothing in flight: returns at once
