"""Timing on the bench's device: the same code on CUDA and on the CPU.

Clock(device).seconds(fn)   wall-clock seconds of ``fn``, the device's work queued before
                            and by it included (CUDA: synchronized on both sides)
Clock(device).sync()        wait for the device's queued work (the CPU: nothing to wait)
run_job(handler, id, src, dst)   one transfer to its end; RuntimeError when it failed
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kvtier.addresses import TransferSpec
from kvtier.tiers.base.handler import TransferHandler, TransferResult


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, fn: Callable[[], object]) -> float:
        self.sync()
        started = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - started


def run_job(
    handler: TransferHandler, job_id: int, src: TransferSpec, dst: TransferSpec
) -> TransferResult:
    """Submit one job to ``handler``, wait for it, and return its result (raises when refused
    or failed: a figure of a job that did not move its bytes is no figure)."""
    if not handler.transfer_async(job_id, src, dst):
        raise RuntimeError(f"job {job_id} ({type(src).__name__} -> {type(dst).__name__}) refused")
    handler.wait([job_id])
    results = handler.get_finished()
    mine = [result for result in results if result.job_id == job_id]
    if not mine or not mine[0].success:
        raise RuntimeError(f"job {job_id} failed: {mine[0] if mine else 'never reported'}")
    return mine[0]
