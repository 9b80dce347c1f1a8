"""The host tier's worker side: copies between the engine's blocks and host records.

``handlers.engine_host_handlers(layout, host)`` gives the (store, load) pair for the engine's
device: ``copy_cpu.py`` on the CPU, ``copy_cuda.py`` on a GPU, both moving pages through
``kvtier.pages``."""

from kvtier.tiers.host.io.handlers import engine_host_handlers

__all__ = ["engine_host_handlers"]
