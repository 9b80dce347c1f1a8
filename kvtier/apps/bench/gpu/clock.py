"""Timing on the bench's device: the same code on CUDA and on the CPU.

Clock(device).seconds(fn)   wall-clock seconds of ``fn``, the device's work queued before
                            and by it included (CUDA: synchronized on both sides)
Clock(device).sync()        wait for the device's queued work (the CPU: nothing to wait)
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
