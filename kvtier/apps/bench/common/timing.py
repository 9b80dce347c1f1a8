"""Timing for the benchmarks: a call's seconds, medians, and how busy the machine was meanwhile.

time_call(fn)        -> float   seconds ``fn`` takes, device work included
median(values)       -> float
own_cpu_seconds()    -> float   CPU seconds this process used
OtherLoad(own)                  CPU cores taken by other work since construction
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def time_call(fn: Callable[[], None]) -> float:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def own_cpu_seconds() -> float:
    """CPU seconds this process used (user + system)."""
    own = os.times()
    return own.user + own.system


class OtherLoad:
    """CPU time taken on this machine by anything but ``own`` (default: this process) — other
    processes, hypervisor steal — since construction, in cores (Linux ``/proc/stat``; None
    elsewhere). Above ~0.1 on a 2-core machine the timings are disturbed.

    ``own`` returns the CPU seconds of the work being measured (e.g. this process and the
    engine processes it drives)."""

    def __init__(self, own: Callable[[], float] = own_cpu_seconds) -> None:
        self.own = own
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        """(machine busy seconds, own CPU seconds, monotonic time)."""
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        except OSError:
            return None
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        return busy / os.sysconf("SC_CLK_TCK"), self.own(), time.monotonic()

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        busy, own, wall = (e - s for s, e in zip(self.start, end, strict=True))
        return round(max(0.0, busy - own) / wall, 2)
