"""KVTierConnector: kvtier inside vLLM (the only module that imports vLLM).

    kv_transfer_config={"kv_connector": "KVTierConnector",
                        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": "4GiB"}}

A thin adapter: in the scheduler process it drives a ``SchedulerConnector``, in each worker a
``WorkerConnector``; every vLLM call maps onto one of theirs, with plain data. Its parts, each
with explicit inputs, are built in one place (``assembly.py``): the engine's kv_role
(``kv_role.py``), and in the scheduler process what kvtier tells vLLM (``observability.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from kvtier.config import KVTierConfig
from kvtier.scheduler.connector import SchedulerConnector
from kvtier.vllm import versions
from kvtier.vllm.adapter_salts import AdapterSalts
from kvtier.vllm.assembly import SchedulerSide, WorkerSide
from kvtier.vllm.block_hashes import block_hashes, hashes_per_block, tokens_name_kv
from kvtier.vllm.handshake import alone
from kvtier.vllm.kv_events import block_tags, kv_events
from kvtier.vllm.kv_role import KVRole
from kvtier.vllm.logs import route_to_vllm_logging
from kvtier.vllm.metadata import KVTierConnectorStats, KVTierMetadata, KVTierWorkerMetadata
from kvtier.vllm.observability import Observability
from kvtier.vllm.releases import skips_external_kv
from kvtier.vllm.schedule import rewritten_early, step_requests
from kvtier.worker.connector import WorkerConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


class KVTierConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        warning = versions.check(vllm.__version__)
        if warning and role == KVConnectorRole.SCHEDULER:
            logger.warning(warning)
        super().__init__(vllm_config, role, kv_cache_config)
        route_to_vllm_logging()  # kvtier's log lines under vLLM's logging
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None
        self._engine_block = vllm_config.cache_config.block_size
        self.config = KVTierConfig.from_extra_config(
            transfer.kv_connector_extra_config, self._engine_block
        )
        self._multi_group = len(kv_cache_config.kv_cache_groups) > 1
        self._kv_role = KVRole(vllm_config, self.config)
        self._side: SchedulerSide | None = None
        self._observe: Observability | None = None
        self._worker_side: WorkerSide | None = None
        self._hashes_per_block = 1
        self._adapters = AdapterSalts()  # a request's adapter's files name its chunks too
        if role == KVConnectorRole.SCHEDULER:
            self._hashes_per_block = hashes_per_block(vllm_config, kv_cache_config)
            self._kv_role.set_load_failure_policy()
            side = SchedulerSide.build(vllm_config, kv_cache_config, self.config, self._kv_role)
            self._side, self._observe = side, side.observe
        else:
            self._worker_side = WorkerSide(vllm_config, kv_cache_config, self.config, self._kv_role)

    # ---- scheduler side --------------------------------------------------------------------

    @property
    def scheduler(self) -> SchedulerConnector:
        assert self._side is not None, "kvtier: scheduler call on a worker connector"
        return self._side.scheduler

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if skips_external_kv(request):  # vLLM would discard what kvtier found
            self._kv_role.skipped(request)
            return 0, False
        hashes = block_hashes(request, self._hashes_per_block)
        salt = self._adapters.salt(request.lora_request)
        pull = self._kv_role.lookup(request, hashes, num_computed_tokens, salt)
        if pull is not None:  # a decode engine's prompt, from its prefill engine
            return pull
        req_id = request.request_id
        named = tokens_name_kv(request)
        full = len(hashes) * self._engine_block  # its tokens after its last full block: its tail
        hit = self.scheduler.lookup(
            req_id, hashes, num_computed_tokens, request.num_tokens,
            list(request.all_token_ids[full : request.num_tokens]) if named else None,
            token_ids=request.all_token_ids if named else (),
            block_tags=block_tags(request, self._engine_block) if named else None,
            key_salt=salt,
        )  # fmt: skip
        if hit is None:
            return None, False
        # a hit in host memory loads before this step's forward (no step spent waiting for it)
        return hit, hit > 0 and self.scheduler.loads_async(req_id)

    def may_load_async(self, request: Request) -> bool:
        # vLLM 0.34+, --max-num-inflight-kv-loads, as the request is queued: True queues it with
        # the loads vLLM starts while the batch is full, where one held at the cap holds up no
        # request that loads nothing; a request wrongly there may wait behind such a one
        if skips_external_kv(request):
            return False
        if self._kv_role.may_pull(request):
            return True
        hashes = block_hashes(request, self._hashes_per_block)
        salt = self._adapters.salt(request.lora_request)
        return self.scheduler.may_load_async(hashes, request.num_tokens, salt)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if request.request_id in self.scheduler.requests:
            self.scheduler.on_alloc(request.request_id, blocks.get_block_ids(), num_external_tokens)
            self._kv_role.allocated(request)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        # each request's blocks allocated this step, never its whole table: flat per-step cost
        scheduled = step_requests(scheduler_output)
        plan = self.scheduler.build_plan(
            scheduled,
            scheduler_output.preempted_req_ids or (),
            forward=scheduler_output.total_num_scheduled_tokens > 0,
            rewritten=rewritten_early(scheduler_output),
        )
        assert self._observe is not None
        self._observe.maybe_log()
        return KVTierMetadata(plan)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KVTierWorkerMetadata):
            self.scheduler.on_report(meta.report)
        if connector_output.finished_sending:
            self._kv_role.released(connector_output.finished_sending)

    def has_pending_push_work(self) -> bool:
        # keeps the engine stepping while transfers run, or while an idle engine writes to a tier
        return self.scheduler.has_pending_work

    def take_events(self) -> Iterable[KVCacheEvent]:
        # each tier's chunks in the engine's block hashes, beside the engine's own ("GPU") blocks
        return kv_events(self.scheduler.take_events(), self.scheduler.block_tokens)

    # ---- worker side -----------------------------------------------------------------------

    @property
    def worker(self) -> WorkerConnector:
        assert self._worker_side is not None, "kvtier: worker call on the scheduler connector"
        return self._worker_side.worker

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker_side is not None
        self._worker_side.register(kv_caches)

    def unregister_kv_caches(self) -> None:
        # vLLM 0.33+: next it unmaps the KV memory (sleep, a weight update), later maps it back
        # at the same addresses: only the copies in flight into it must be done first
        self.worker.drain()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        # called before every forward (and on steps without one): take the plan, flush stores
        assert isinstance(kv_connector_metadata, KVTierMetadata)
        self.worker.begin_step(kv_connector_metadata.plan)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self.worker.start_loads()

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return None

    def wait_for_save(self) -> None:
        self.worker.start_stores()

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving, failed = self.worker.finished(finished_req_ids)
        # several groups: failures per request (block ids repeat across groups); else per block
        return KVConnectorTransferResults(sending, recving, failed if self._multi_group else set())

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks = self.worker.take_failed_blocks()
        return set() if self._multi_group else blocks

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        report = self.worker.report()
        return KVTierWorkerMetadata(report) if report.jobs else None

    def shutdown(self) -> None:
        if self._worker_side is not None:  # writes what the chain's tiers lack, bounded in time
            self._worker_side.worker.shutdown(self.config.shutdown_flush_s)
        if self._side is not None:
            logger.info(self._side.scheduler.stats.log_line())

    # ---- the ranks' handshake (``handshake.py``), the kv_role's requests (``kv_role.py``) -----

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return self._worker_side.handshake(alone(self)) if self._worker_side is not None else None

    def set_xfer_handshake_metadata(self, metadata: Mapping[int, Any]) -> None:
        self.set_xfer_handshake_metadata_pp_aware({(0, tp): m for tp, m in metadata.items()})

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: Mapping[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        assert self._side is not None, "kvtier: the handshake told a worker connector"
        self._side.handshake(metadata)  # every rank's layout, a prefill rank's listener

    def on_new_request(self, request: Request) -> None:
        self._kv_role.on_new_request(request, self._engine_block // self._hashes_per_block)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request, [block_ids])

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request, block_ids)

    def _finished(
        self, request: Request, block_ids: Sequence[Sequence[int]]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self._observe is not None, "kvtier: request_finished on a worker connector"
        salt = self._adapters.salt(request.lora_request) if self._kv_role.producer else b""
        return self._observe.finished(request, self._kv_role.finished(request, block_ids, salt))

    # ---- what kvtier tells vLLM (``observability.py``; scheduler side only) ------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._observe.stats() if self._observe is not None else None

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return KVTierConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        from kvtier.vllm.prometheus import KVTierPromMetrics

        return KVTierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        assert self._observe is not None
        return self._observe.hit_sources(request, num_external_tokens)

    def reset_cache(self) -> bool | None:
        return self._side.reset() if self._side is not None else None
