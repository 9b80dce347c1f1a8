"""The registry of engine <-> host copy handlers: which implementation serves a layout's device.

The implementations import ``engine_host.py`` (their base); only this module imports them.
"""

from __future__ import annotations

import os

from kvtier.layout import KVLayout
from kvtier.pages.mechanism import Mechanism, Mechanisms
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.io.engine_host import EngineHostHandler

MAX_COPY_LANES = 2  # two cores reach a plain copy's bandwidth; more would take the engine's


def copy_lanes() -> int:
    """Copy lanes per CPU job: at most ``MAX_COPY_LANES``, and no more than the cores this thread
    may run on (vLLM binds a rank's threads; threads created here inherit that mask)."""
    return max(1, min(MAX_COPY_LANES, len(os.sched_getaffinity(0))))


def engine_host_handlers(
    layout: KVLayout,
    host: HostTier,
    lanes: int | None = None,
    inline_stores: bool = True,
    mechanism: Mechanism | Mechanisms | None = None,
) -> tuple[EngineHostHandler, EngineHostHandler]:
    """The (store, load) handlers for ``layout``'s device.

    CUDA: both on streams, moving pages by ``mechanism`` (``kvtier.pages.mover``; None: each
    direction's default, ``gpu_mechanisms()``). CPU: loads inline in ``transfer_async``, and
    stores too unless ``inline_stores`` is False (then on a job thread); each job is split
    across ``lanes`` threads (default ``copy_lanes()``), see ``copy_cpu.py``.

    CPU stores copy inline, right after the step's forward, on cores the engine leaves idle
    then: a store copied on a thread would run beside the next forward, and both are bound by
    memory bandwidth, so it would slow that forward by more than the copy costs.
    """
    if layout.device.type == "cuda":
        from kvtier.tiers.host.io.copy_cuda import CudaCopyHandler

        return (
            CudaCopyHandler(layout, host, store=True, mechanism=mechanism),
            CudaCopyHandler(layout, host, store=False, mechanism=mechanism),
        )
    from kvtier.tiers.host.io.copy_cpu import CpuCopyHandler

    lanes = copy_lanes() if lanes is None else lanes
    return (
        CpuCopyHandler(layout, host, store=True, inline=inline_stores, lanes=lanes),
        CpuCopyHandler(layout, host, store=False, inline=True, lanes=lanes),
    )
