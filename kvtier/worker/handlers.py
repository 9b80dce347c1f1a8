"""The registry of engine <-> host copy handlers: which implementation serves a layout's device.

The implementations import ``engine_host.py`` (their base); only this module imports them.
"""

from __future__ import annotations

from kvtier.layout import KVLayout
from kvtier.tiers.cpu import HostTier
from kvtier.worker.engine_host import EngineHostHandler


def engine_host_handlers(
    layout: KVLayout, host: HostTier
) -> tuple[EngineHostHandler, EngineHostHandler]:
    """The (store, load) handlers for ``layout``'s device.

    CUDA: both on streams. CPU: stores on a thread, loads inline (see ``copy_cpu.py``).
    """
    if layout.device.type == "cuda":
        from kvtier.worker.copy_cuda import CudaCopyHandler

        return CudaCopyHandler(layout, host, store=True), CudaCopyHandler(layout, host, store=False)
    from kvtier.worker.copy_cpu import CpuCopyHandler

    return (
        CpuCopyHandler(layout, host, store=True, inline=False),
        CpuCopyHandler(layout, host, store=False, inline=True),
    )
