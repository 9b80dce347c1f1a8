"""Background copies (host-tier stores on a thread) yield the CPU to the engine's compute:
their threads run at the lowest priority; a load, which a request waits for, does not."""

from __future__ import annotations

import os
import threading

import torch

from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.base.job_thread import BACKGROUND_NICE, JobThread
from kvtier.tiers.host.io.copy_lanes import CopyLanes

CPU = torch.device("cpu")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _nice_on(thread: JobThread) -> int:
    seen: list[int] = []

    def run() -> TransferResult:
        seen.append(_nice())
        return TransferResult(1, True, 0, 0.0)

    thread.submit(1, run)
    thread.wait([1])
    thread.shutdown()
    return seen[0]


def test_a_background_job_thread_runs_at_the_lowest_priority() -> None:
    assert _nice_on(JobThread("test-store", CPU, background=True)) == BACKGROUND_NICE
    assert _nice_on(JobThread("test-load", CPU)) == _nice()  # as the engine's own thread


def test_background_lanes_run_at_the_lowest_priority() -> None:
    seen: set[int] = set()
    start = threading.Barrier(2, timeout=10)  # both lanes hold a piece at once

    def piece() -> None:
        start.wait()
        seen.add(_nice())

    lanes = CopyLanes("test-store", 1, CPU, background=True)
    lanes.run([piece, piece])
    lanes.shutdown()
    assert seen == {_nice(), BACKGROUND_NICE}  # the caller's own, and the helper's
