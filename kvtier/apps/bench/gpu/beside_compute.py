"""The engine's compute with kvtier's copies beside it: how much slower a forward gets.

    Loop(device, size, target_s)        a bf16 matmul loop on the engine's (current) stream,
                                        ``matmuls`` per iteration so that one lasts ~target_s
    measure(rig, loop, reps, iterations)  beside_compute_store and _load, per mechanism

The loop stands for the engine's forwards: ``iterations`` iterations of ``matmuls`` square
matmuls. Beside it, at the start of every iteration, one job of the request is submitted as the
worker connector submits a step's stores (``HostRig.submit``: it waits for the engine's work
queued so far, then runs on its own stream beside the next iteration). Figure, per rep: the
loop's seconds with a job per iteration over its seconds alone (the mean of the loop alone just
before and just after that rep's runs with jobs); 1.0: the copies cost the compute nothing.
On CUDA a loop is timed by events on the engine's stream (a job's tail after the loop is not the
loop's); on the CPU by the clock, and CPU jobs copy inline, so there the figure is only the
orchestration's check.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial

import torch

from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, summary
from kvtier.apps.bench.gpu.host_copy import HostRig


class Loop:
    def __init__(self, device: torch.device, size: int, target_s: float) -> None:
        self.device = device
        self.clock = Clock(device)
        generator = torch.Generator(device=device).manual_seed(0)
        self.a = torch.randn(size, size, generator=generator, device=device).to(torch.bfloat16)
        self.b = torch.randn(size, size, generator=generator, device=device).to(torch.bfloat16)
        self.c = torch.empty_like(self.a)
        self.matmuls = 1
        self.run(2, None)  # warm-up (cuBLAS's handle and workspace)
        per_matmul = self.run(5, None) / 5
        self.matmuls = max(1, round(target_s / max(per_matmul, 1e-9)))
        self.size = size

    def run(self, iterations: int, beside: Callable[[], None] | None) -> float:
        """Seconds of ``iterations`` iterations, ``beside`` called at the start of each."""
        self.clock.sync()
        return self.clock.device_seconds(partial(self._iterations, iterations, beside))

    def _iterations(self, iterations: int, beside: Callable[[], None] | None) -> None:
        for _ in range(iterations):
            if beside is not None:
                beside()
            for _ in range(self.matmuls):
                torch.matmul(self.a, self.b, out=self.c)

    def describe(self) -> dict[str, object]:
        return {"size": self.size, "dtype": "bfloat16", "matmuls_per_iteration": self.matmuls}


def measure(rig: HostRig, loop: Loop, reps: int, iterations: int) -> Measured:
    def with_jobs(mechanism: str, store: bool, count: int) -> float:
        ids: list[int] = []
        seconds = loop.run(count, lambda: ids.append(rig.submit(mechanism, store)))
        rig.finish(mechanism, ids)
        return seconds

    for mechanism in rig.mechanisms:  # warm-up
        with_jobs(mechanism, True, 1)
        with_jobs(mechanism, False, 1)
    alone: list[float] = []
    seconds: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for _ in range(reps):
        before = loop.run(iterations, None)
        runs = {f"{side}_{m}": with_jobs(m, side == "store", iterations)
                for m in rig.mechanisms for side in ("store", "load")}  # fmt: skip
        after = loop.run(iterations, None)
        alone += [before, after]
        for name, value in runs.items():
            seconds.setdefault(name, []).append(value)
            ratios.setdefault(name, []).append(value / statistics.mean((before, after)))
    figures = {
        f"beside_compute_{side}": {m: summary(ratios[f"{side}_{m}"]) for m in rig.mechanisms}
        for side in ("store", "load")
    }
    details = {
        "loop": {**loop.describe(), "iterations": iterations},
        "alone_s": summary(alone),
        "with_jobs_s": {name: summary(values) for name, values in seconds.items()},
    }
    return Measured(figures, {}, details)
