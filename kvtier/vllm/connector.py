"""KVTierConnector: kvtier inside vLLM (the only module that imports vLLM).

    kv_transfer_config={"kv_connector": "KVTierConnector",
                        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": "4GiB"}}

A thin adapter: in the scheduler process it drives a ``SchedulerConnector``, in each worker a
``WorkerConnector``; every vLLM call maps onto one of theirs, with plain data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.layout import Placement, host_num_chunks, placement_bytes_per_block
from kvtier.scheduler.base import EventKind
from kvtier.scheduler.connector import GroupSpec, SchedulerConnector
from kvtier.tiers.chunk_format import HEADER_BYTES
from kvtier.tiers.disk.index import DiskIndex
from kvtier.vllm import versions
from kvtier.vllm.kv_role import PeerTransfer, identity, peer_role, scheduler_peers, worker_settings
from kvtier.vllm.lower_tiers import scheduler_lower_tiers
from kvtier.vllm.metadata import KVTierMetadata, KVTierWorkerMetadata
from kvtier.vllm.observability import ConnectorObservability
from kvtier.vllm.schedule import scheduled_requests
from kvtier.worker.connector import DiskSettings, RedisSettings, WorkerConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


class KVTierConnector(ConnectorObservability, PeerTransfer, KVConnectorBase_V1, SupportsHMA):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        warning = versions.check(vllm.__version__)
        if warning and role == KVConnectorRole.SCHEDULER:
            logger.warning(warning)
        super().__init__(vllm_config, role, kv_cache_config)
        self._init_observability()  # kvtier's log lines under vLLM's logging; stats
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None
        engine_block = vllm_config.cache_config.block_size
        self._engine_block = engine_block
        self.config = KVTierConfig.from_extra_config(
            transfer.kv_connector_extra_config, engine_block
        )
        factor = self.config.block_size_factor(engine_block)
        self._kv_role = peer_role(vllm_config, self.config)
        parallel = vllm_config.parallel_config
        world_size = parallel.world_size
        groups = kv_cache_config.kv_cache_groups
        self._multi_group = len(groups) > 1
        self._scheduler: SchedulerConnector | None = None
        self._worker: WorkerConnector | None = None
        if role == KVConnectorRole.SCHEDULER:
            policy = self.config.transfer.load_failure_policy
            if transfer.kv_load_failure_policy != policy:
                # kvtier is a cache: a load that fails is a miss, recomputed, never a failed
                # request (vLLM's default for connectors is to fail the request), unless a
                # decode engine asks a failed pull to fail (transfer.load_failure_policy)
                logger.info("kvtier: kv_load_failure_policy set to %r", policy)
                transfer.kv_load_failure_policy = policy  # type: ignore[assignment]
            placements = [
                Placement(t.size, tuple(t.layers)) for t in kv_cache_config.kv_cache_tensors
            ]
            per_block = placement_bytes_per_block(placements, kv_cache_config.num_blocks)
            num_chunks = host_num_chunks(
                per_block, world_size, factor, self.config.cpu_bytes_to_use
            )
            fingerprint = self._fingerprint(
                vllm_config, ";".join(repr(g.kv_cache_spec) for g in groups), 0, 0, factor
            )
            disk = None
            if self.config.disk is not None or self.config.redis is not None:
                _warn_if_hashes_differ_per_process(vllm_config)
            if self.config.disk is not None:
                chunk_file = per_block * factor + HEADER_BYTES  # an upper bound, per rank
                disk = DiskIndex(
                    Path(self.config.disk.path), self.config.disk.bytes, world_size,
                    fingerprint.digest(), chunk_file * world_size,
                )  # fmt: skip
            specs = [_group_spec(g.kv_cache_spec) for g in groups]
            windows = [spec.sliding_window for spec in specs]
            peers = scheduler_peers(vllm_config, self.config, self._kv_role, engine_block, windows)
            self._scheduler = SchedulerConnector(
                self.config,
                specs,
                num_chunks,
                world_size,
                ChunkKeyMaker(fingerprint, factor, self.config.hash_algo),
                disk,
                *peers,
                lower=scheduler_lower_tiers(self.config, world_size),
            )
            logger.info(
                "kvtier: host tier of %d chunks of %d tokens, %d KV cache group(s), %d rank(s)",
                num_chunks, engine_block * factor, len(groups), world_size,
            )  # fmt: skip
        else:
            self._worker = WorkerConnector(self.config.cpu_bytes_to_use, factor, world_size)
            self._group_layers = [list(g.layer_names) for g in groups]
            self._num_blocks = kv_cache_config.num_blocks
            self._vllm_config = vllm_config
            self._factor = factor

    @staticmethod
    def _fingerprint(
        vllm_config: VllmConfig, layout: str, tp_rank: int, pp_rank: int, factor: int
    ) -> LayoutFingerprint:
        """What a chunk's bytes mean; the scheduler's (rank 0) namespaces the keys."""
        return LayoutFingerprint(
            model=str(vllm_config.model_config.model),
            dtype=f"{vllm_config.model_config.dtype}/{vllm_config.cache_config.cache_dtype}",
            layout=layout,
            tp_rank=tp_rank,
            tp_size=vllm_config.parallel_config.tensor_parallel_size,
            pp_rank=pp_rank,
            chunk_tokens=vllm_config.cache_config.block_size * factor,
        )

    # ---- scheduler side --------------------------------------------------------------------

    @property
    def scheduler(self) -> SchedulerConnector:
        assert self._scheduler is not None, "kvtier: scheduler call on a worker connector"
        return self._scheduler

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if getattr(request, "skip_reading_prefix_cache", False):
            return 0, False
        pull = self._peer_lookup(request, num_computed_tokens)
        if pull is not None:  # a decode engine's prompt, from its prefill engine
            return pull
        req_id = request.request_id
        hit = self.scheduler.lookup(
            req_id, request.block_hashes, num_computed_tokens, request.num_tokens,
            self._tail_tokens(request),
        )  # fmt: skip
        if hit is None:
            return None, False
        # a hit in host memory loads before this step's forward (no step spent waiting for it)
        return hit, hit > 0 and self.scheduler.loads_async(req_id)

    def _tail_tokens(self, request: Request) -> list[int] | None:
        """The request's tokens after its last full block, when they alone name its KV (not so
        with images or prompt embeddings: their KV depends on more than the token ids)."""
        if request.mm_features or request.prompt_embeds is not None:
            return None
        full = len(request.block_hashes) * self._engine_block
        return list(request.all_token_ids[full : request.num_tokens])

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if request.request_id in self.scheduler.requests:
            self.scheduler.on_alloc(request.request_id, blocks.get_block_ids(), num_external_tokens)
            self._peer_allocated(request)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        # each request's blocks allocated this step, never its whole table: flat per-step cost
        scheduled = scheduled_requests(scheduler_output)
        plan = self.scheduler.build_plan(
            scheduled,
            scheduler_output.preempted_req_ids or (),
            forward=scheduler_output.total_num_scheduled_tokens > 0,
        )
        self._maybe_log()
        return KVTierMetadata(plan)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KVTierWorkerMetadata):
            self.scheduler.on_report(meta.report)
        if connector_output.finished_sending:
            self.scheduler.peer_released(connector_output.finished_sending)

    def has_pending_push_work(self) -> bool:
        # keeps the engine stepping while transfers run, or while an idle engine writes to disk
        return self.scheduler.has_pending_work

    def take_events(self) -> Iterable[KVCacheEvent]:
        chunk_tokens = self.scheduler.chunk_tokens
        for event in self.scheduler.take_events():
            hashes: list[bytes | int] = [k for k in event.keys if isinstance(k, bytes)]
            if event.kind is EventKind.STORED:
                yield BlockStored(
                    block_hashes=hashes, parent_block_hash=None, token_ids=[],
                    block_size=chunk_tokens, lora_id=None, medium="CPU", lora_name=None,
                )  # fmt: skip
            else:
                yield BlockRemoved(block_hashes=hashes, medium="CPU")

    # ---- worker side -----------------------------------------------------------------------

    @property
    def worker(self) -> WorkerConnector:
        assert self._worker is not None, "kvtier: worker call on the scheduler connector"
        return self._worker

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layers = [[name for name in group if name in kv_caches] for group in self._group_layers]
        self.worker.register(
            kv_caches, layers, self._num_blocks, self._disk_settings(), self._redis_settings()
        )
        if self._kv_role != "kv_both":
            self._start_peer()

    def _start_peer(self) -> None:
        """Prefill→decode: a prefill rank listens (its address goes to the scheduler through
        vLLM's handshake metadata), a decode rank gets a puller."""
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        assert self.worker.layout is not None
        rank = get_tensor_model_parallel_rank()
        views = ",".join(f"{b}B" for b in self.worker.layout.page_bytes)
        layout = f"views=[{views}] groups={[list(g) for g in self.worker.layout.groups]}"
        settings = worker_settings(self.config, identity(self._vllm_config, layout, rank), rank)
        address = self.worker.start_peer(self._kv_role == "kv_producer", settings)
        if address is not None:
            self._peer_address = (rank, *address)

    def _disk_settings(self) -> DiskSettings | None:
        """This rank's disk tier: its files are named by its rank, its layout fingerprinted."""
        if self.config.disk is None:
            return None
        return DiskSettings(Path(self.config.disk.path), *self._rank_identity())

    def _redis_settings(self) -> RedisSettings | None:
        """This rank's Redis tier: its records are keyed by its rank, its layout fingerprinted."""
        if self.config.redis is None:
            return None
        return RedisSettings(self.config.redis, *self._rank_identity())

    def _rank_identity(self) -> tuple[int, LayoutFingerprint]:
        """This worker's rank among all (pipeline stage, then tensor rank) and its fingerprint,
        which names its share of a chunk in a lower tier."""
        from vllm.distributed.parallel_state import (
            get_pp_group,
            get_tensor_model_parallel_rank,
        )

        tp_rank, pp_rank = get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
        tp_size = self._vllm_config.parallel_config.tensor_parallel_size
        fingerprint = self._fingerprint(self._vllm_config, "", tp_rank, pp_rank, self._factor)
        return pp_rank * tp_size + tp_rank, fingerprint

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

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending, results.finished_recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks = self.worker.take_failed_blocks()
        return set() if self._multi_group else blocks

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        report = self.worker.report()
        return KVTierWorkerMetadata(report) if report.jobs else None

    def shutdown(self) -> None:
        if self._worker is not None:  # writes what the lower tiers lack, bounded in time
            self._worker.shutdown(self.config.shutdown_flush_s)
        if self._scheduler is not None:
            logger.info(self._scheduler.stats.log_line())


# the group kinds whose blocks only leave a request as vLLM says (full attention), or drop out of
# a sliding window behind the request's first token: others (chunked local attention, RSWA,
# circular buffers, Mamba's copy-on-write) free or rewrite blocks in place, unseen by kvtier
_SUPPORTED_SPECS = (
    "FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec", "SlidingWindowSpec",
    "SlidingWindowMLASpec",
)  # fmt: skip


def _group_spec(spec: Any) -> GroupSpec:
    inner = list(getattr(spec, "kv_cache_specs", {}).values()) or [spec]  # uniform-type groups
    for layer_spec in inner:
        kind = type(layer_spec).__name__
        if kind not in _SUPPORTED_SPECS:
            raise ValueError(
                f"kvtier: KV cache groups of kind {kind} are not supported "
                f"(supported: {', '.join(_SUPPORTED_SPECS)})"
            )
    window = getattr(inner[0], "sliding_window", None)
    return GroupSpec(block_tokens=spec.block_size, sliding_window=window)


def _warn_if_hashes_differ_per_process(vllm_config: VllmConfig) -> None:
    """vLLM seeds a non-cryptographic block hash at random in each process unless
    PYTHONHASHSEED is set: then no other engine, and no restart, ever finds a chunk on disk."""
    algo = str(vllm_config.cache_config.prefix_caching_hash_algo)
    if "xxhash" in algo and os.environ.get("PYTHONHASHSEED") is None:
        logger.warning(
            "kvtier: prefix_caching_hash_algo=%s without PYTHONHASHSEED gives block hashes that "
            "differ in every process: chunks on disk will only be found by this process. Set "
            "PYTHONHASHSEED to one value for all engines, or use sha256 (vLLM's default).",
            algo,
        )
