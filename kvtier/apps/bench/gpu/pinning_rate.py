"""The host tier's pinning on CUDA: how fast it goes, and whether the engine's thread waits.

    measure(device, gib)   pinning_rate_bytes_s and pinning_engine_held_s (the run's, not a
                           shape's)

A host tier of ``gib`` GiB (records of the ``8b`` shape) is built while this thread, standing for
the engine's, keeps launching a tiny kernel and synchronizing, a probe a millisecond, as an
engine's steps do. ``pinning_engine_held_s``: how long building the tier held the thread (its
constructor starts the pinning thread and returns) plus how much the slowest probe while pinning
ran exceeded the slowest before it (the driver's lock, which ``cudaHostRegister`` holds: 0.117 s
on an H200 with 256 MiB pieces the driver faulted in itself, a probe 37-117 ms; ``pinning.py``
faults them in first and registers 32 MiB at a time). ``pinning_rate_bytes_s``:
``HostTier.pinning.rate()`` once all of it is pinned. On the CPU the host tier is committed, not
pinned: null, with that reason.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kvtier.apps.bench.gpu.figures import Measured, Unavailable, summary
from kvtier.apps.bench.gpu.shapes import SHAPES, build_engine
from kvtier.tiers.base.records import RecordLayout
from kvtier.tiers.host.buffers import HostTier

FIGURES = ("pinning_rate_bytes_s", "pinning_engine_held_s")
PROBE_GAP_S = 0.001
PIN_LIMIT_S = 300.0


def measure(device: torch.device, gib: float) -> Measured:
    if device.type != "cuda":
        raise Unavailable("no pinning on the CPU: the host tier is committed when built")
    shape = SHAPES["8b"]
    layout = build_engine(shape, 4, device, seed=3).layout
    record_bytes = RecordLayout.of(layout, shape.factor).record_bytes
    num_chunks = max(1, int(gib * 2**30) // record_bytes)
    probe = torch.zeros(1024, device=device)

    def tick() -> float:
        started = time.perf_counter()
        probe.add_(1)
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        time.sleep(PROBE_GAP_S)
        return elapsed

    before = [tick() for _ in range(200)]
    started = time.perf_counter()
    host = HostTier(layout, num_chunks, shape.factor)
    constructor_s = time.perf_counter() - started
    during: list[float] = []
    try:
        pinning = host.pinning
        if pinning is None:
            raise RuntimeError("a host tier for CUDA engine tensors has no pinning")
        deadline = time.monotonic() + PIN_LIMIT_S
        while not pinning.wait(0):
            during.append(tick())
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.nbytes / 2**30:.1f} GiB not pinned in {PIN_LIMIT_S} s")
        seconds = time.perf_counter() - started
        rate, pinned = pinning.rate(), host.pinned
    finally:
        host.close()
    if not pinned or rate is None:
        raise RuntimeError("the driver refused to pin part of the host tier (see the log)")
    stall_s = max(0.0, max(during, default=0.0) - max(before))
    held_s = constructor_s + stall_s
    details: dict[str, Any] = {
        "tier_bytes": host.nbytes, "constructor_s": round(constructor_s, 6),
        "pinned_in_s": round(seconds, 3), "stall_s": round(stall_s, 6),
        "probe_ms_before": summary([s * 1e3 for s in before]),
        "probe_ms_during": summary([s * 1e3 for s in during]) if during else None,
    }  # fmt: skip
    return Measured({FIGURES[0]: round(rate), FIGURES[1]: round(held_s, 6)}, {}, details)
