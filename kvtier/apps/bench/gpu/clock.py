"""Timing on the bench's device: the same code on CUDA and on the CPU.

Clock(device).seconds(fn)   wall-clock seconds of ``fn``, the device's work queued before
                            and by it included (CUDA: synchronized on both sides)
Clock(device).sync()        wait for the device's queued work (the CPU: nothing to wait)
Clock(device).device_seconds(fn)
                            seconds the device spends on what ``fn`` queues on the current
                            stream, from the work queued before it (CUDA events; the CPU:
                            wall-clock, ``fn`` does the work)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


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

    def device_seconds(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            started = time.perf_counter()
            fn()
            return time.perf_counter() - started
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3
