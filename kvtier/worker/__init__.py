"""The worker half: moves bytes between media through each tier's handlers, decides nothing."""

from kvtier.worker.transfer_worker import TransferWorker

__all__ = ["TransferWorker"]
