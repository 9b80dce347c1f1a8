"""The registry of engine <-> host copy handlers: which implementation serves a layout's device.

The implementations import ``engine_host.py`` (their base); only this module imports them.
"""

from __future__ import annotations

import os

from kvtier.layout import KVLayout
from kvtier.tiers.cpu import HostTier
from kvtier.worker.engine_host import EngineHostHandler

MAX_COPY_LANES = 2  # two cores reach a plain copy's bandwidth; more would take the engine's


def copy_lanes() -> int:
    """Copy lanes per CPU job: at most ``MAX_COPY_LANES``, and no more than the cores this thread
    may run on (vLLM binds a rank's threads; threads created here inherit that mask)."""
    return max(1, min(MAX_COPY_LANES, len(os.sched_getaffinity(0))))


def engine_host_handlers(
    layout: KVLayout, host: HostTier, lanes: int | None = None
) -> tuple[EngineHostHandler, EngineHostHandler]:
    """The (store, load) handlers for ``layout``'s device.

    CUDA: both on streams. CPU: stores on a job thread, loads inline in ``transfer_async``; each
    job is split across ``lanes`` threads (default ``copy_lanes()``), see ``copy_cpu.py``.
    """
    if layout.device.type == "cuda":
        from kvtier.worker.copy_cuda import CudaCopyHandler

        return CudaCopyHandler(layout, host, store=True), CudaCopyHandler(layout, host, store=False)
    from kvtier.worker.copy_cpu import CpuCopyHandler

    lanes = copy_lanes() if lanes is None else lanes
    return (
        CpuCopyHandler(layout, host, store=True, inline=False, lanes=lanes),
        CpuCopyHandler(layout, host, store=False, inline=True, lanes=lanes),
    )
