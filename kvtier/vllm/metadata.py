"""What kvtier hands vLLM to carry: the step plan, the workers' reports, each step's stats."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvtier.step_plan import StepPlan, WorkerReport
from kvtier.vllm.stats import merge, summary


@dataclass
class KVTierMetadata(KVConnectorMetadata):
    plan: StepPlan


@dataclass
class KVTierWorkerMetadata(KVConnectorWorkerMetadata):
    report: WorkerReport

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, KVTierWorkerMetadata)
        return KVTierWorkerMetadata(self.report.merge(other.report))


class KVTierConnectorStats(KVConnectorStats):
    """kvtier's changes since the previous step, as vLLM's stats pipeline carries them.

    ``data`` is a payload of ``kvtier.vllm.stats`` (increments, gauges, job durations), so
    ``aggregate`` sums an interval's payloads and ``reduce`` gives the log line's fields.
    """

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if not other.is_empty():
            self.data = merge(self.data, other.data) if self.data else dict(other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        return summary(self.data)

    def reset(self) -> None:
        self.data = {}

    def is_empty(self) -> bool:
        return not self.data
