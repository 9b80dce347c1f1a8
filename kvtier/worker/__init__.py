"""The worker half: moves bytes between media, decides nothing."""

from kvtier.worker.base import TransferHandler, TransferResult
from kvtier.worker.handlers import engine_host_handlers
from kvtier.worker.transfer_worker import TransferWorker

__all__ = ["TransferHandler", "TransferResult", "TransferWorker", "engine_host_handlers"]
