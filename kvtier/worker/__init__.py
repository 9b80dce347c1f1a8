"""The worker half: moves bytes between media, decides nothing."""

from kvtier.worker.base import (
    EngineBlocks,
    HostChunks,
    TransferHandler,
    TransferResult,
    TransferSpec,
)
from kvtier.worker.engine_host import engine_host_handlers
from kvtier.worker.transfer_worker import TransferWorker

__all__ = [
    "EngineBlocks",
    "HostChunks",
    "TransferHandler",
    "TransferResult",
    "TransferSpec",
    "TransferWorker",
    "engine_host_handlers",
]
