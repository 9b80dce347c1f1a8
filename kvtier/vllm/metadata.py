"""What kvtier hands vLLM to carry: the step plan, the workers' reports, running totals."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvtier.step_plan import StepPlan, WorkerReport


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
    """kvtier's totals since start, as vLLM's stats pipeline carries connector stats."""

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        return other  # snapshots of running totals: the newer one holds everything

    def reduce(self) -> dict[str, int | float]:
        cpu = self.data.get("tiers", {}).get("cpu", {})
        return {key: value for key, value in cpu.items() if isinstance(value, (int, float))}

    def reset(self) -> None:
        self.data = {}

    def is_empty(self) -> bool:
        return not self.data
