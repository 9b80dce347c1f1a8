"""kvtier built inside vLLM, in one place: both halves, the tier chain, the kv_role, observability.

    SchedulerSide.build(vllm_config, kv_cache_config, config, role)  the scheduler process's half
    WorkerSide(vllm_config, kv_cache_config, config, role)           a worker's, then register()

The chain is the config's tiers (``KVTierConfig.chain``: each spec whose section is set, in the
registry's order); each half asks every spec for its side (``TierSpec.scheduler``/``worker``),
so nothing here names a tier. What names a chunk's bytes (the layout fingerprint) is computed
here for both halves: the scheduler's namespaces the keys, each rank's checks its records.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.layout import KVLayout, Placement, host_num_chunks, placement_bytes_per_block
from kvtier.scheduler.connector import GroupSpec, SchedulerConnector
from kvtier.tiers.base.chunk_format import HEADER_BYTES
from kvtier.tiers.base.index import Namespaced
from kvtier.tiers.base.spec import SchedulerContext, TierSpec, WorkerContext, WorkerTier
from kvtier.tiers.host.buffers import HostTier
from kvtier.vllm.handshake import KVTierHandshake, kernel_packing, named_by_ranks, rank_layouts
from kvtier.vllm.kv_role import KVRole
from kvtier.vllm.model_identity import model_identity
from kvtier.vllm.observability import Observability
from kvtier.vllm.recovery import recovers_sync_loads
from kvtier.vllm.spec_text import spec_text
from kvtier.worker.connector import TierBuilder, WorkerConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = logging.getLogger(__name__)

# the group kinds whose blocks only leave a request as vLLM says (full attention), or drop out of
# a sliding window behind the request's first token: others (chunked local attention, RSWA,
# circular buffers, Mamba's copy-on-write) free or rewrite blocks in place, unseen by kvtier
_SUPPORTED_SPECS = (
    "FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec", "SlidingWindowSpec",
    "SlidingWindowMLASpec",
)  # fmt: skip


def fingerprint(
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
        weights=model_identity(vllm_config),
    )


def keys_fingerprint(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, factor: int, ranks: Sequence[str] = ()
) -> LayoutFingerprint:
    """What namespaces the chunk keys: the KV cache groups as every vLLM release kvtier supports
    tells them (``spec_text``), so that their engines share chunks, and the layouts of the ranks
    (``handshake.py``), once they told them: engines that hold other bytes for them share none."""
    layout = ";".join(spec_text(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups)
    return named_by_ranks(fingerprint(vllm_config, layout, 0, 0, factor), ranks)


def _per_block(kv_cache_config: KVCacheConfig) -> int:
    """Engine bytes per block on one rank, as vLLM placed the KV tensors."""
    placements = [Placement(t.size, tuple(t.layers)) for t in kv_cache_config.kv_cache_tensors]
    return placement_bytes_per_block(placements, kv_cache_config.num_blocks)


@dataclass
class SchedulerSide:
    """The scheduler process's half: the scheduler connector and what it tells vLLM."""

    scheduler: SchedulerConnector
    observe: Observability
    keys: LayoutFingerprint  # the KV cache groups' (``keys_fingerprint``): what the rest names
    role: KVRole
    reset_keeps_tiers: bool = False
    ranks: list[str] = field(default_factory=list)  # the layouts the ranks told
    generation: str = ""  # the keys' since the last reset ("": none yet)

    def handshake(self, metadata: Mapping[tuple[int, int], KVConnectorHandshakeMetadata]) -> None:
        """What the ranks told (by pipeline stage, then tensor rank), before the first step:
        their layouts name the keys from now on; a prefill rank's listener is where decode
        engines pull."""
        self.role.set_handshake({tp: meta for (pp, tp), meta in metadata.items() if pp == 0})
        self.ranks = rank_layouts(metadata)
        if not self.ranks and self.scheduler.lower:
            logger.info("kvtier: no rank told its layout (kvtier inside another connector): "
                        "engines of other attention backends or page orders on its tiers "
                        "refuse each other's chunks")  # fmt: skip
        self._name()

    def reset(self) -> bool:
        """vLLM's connector reset (``reset_prefix_cache(reset_connector=True)``, which its
        ``pause_generation(clear_cache=True)`` runs around an RL trainer's weight update): the
        host tier is emptied and the keys take a generation of their own, so that no chunk
        computed before (in any tier, by this engine or another) is loaded again, nor one a
        request alive across it computes (``RequestState.salt_apart``). The chain's chunks stay
        for other engines; this one shares with them again once restarted. With
        ``reset_keeps_tiers`` only the host tier is emptied (False: chunks in use stay)."""
        emptied = self.observe.reset()
        if self.reset_keeps_tiers:
            return emptied
        self.generation = secrets.token_hex(8)
        self._name()
        for state in self.scheduler.requests.values():
            state.salt_apart()
        if self.scheduler.prefixes is not None:  # a router is told they are gone from here
            self.scheduler.prefixes.withdraw_all()
        return True  # what the host tier still holds is named by keys no lookup asks for

    def _name(self) -> None:
        keys = named_by_ranks(self.keys, self.ranks)
        if self.generation:
            keys = dataclasses.replace(keys, weights=f"{keys.weights}+reset:{self.generation}")
        self.scheduler.keys.rename(keys)
        for tier in self.scheduler.lower:
            if isinstance(tier, Namespaced):  # what it found at start-up: which it may load
                tier.namespace(keys.digest())
        logger.info("kvtier: chunk keys named by %s", keys.describe())

    @classmethod
    def build(
        cls,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        config: KVTierConfig,
        role: KVRole,
    ) -> SchedulerSide:
        _refuse_context_parallel(vllm_config)
        engine_block = vllm_config.cache_config.block_size
        factor = config.block_size_factor(engine_block)
        world_size = vllm_config.parallel_config.world_size
        groups = kv_cache_config.kv_cache_groups
        per_block = _per_block(kv_cache_config)
        num_chunks = host_num_chunks(per_block, world_size, factor, config.cpu_bytes_to_use)
        keys = keys_fingerprint(vllm_config, kv_cache_config, factor)
        chain = config.chain()
        if chain:
            _warn_if_hashes_differ_per_process(vllm_config)
        specs = [_group_spec(g.kv_cache_spec) for g in groups]
        context: SchedulerContext[Any] = SchedulerContext(
            None, world_size, keys.digest(), per_block * factor + HEADER_BYTES,
            role=role.role, engine_id=role.engine_id,
            tp_size=vllm_config.parallel_config.tensor_parallel_size, block_tokens=engine_block,
            windows=tuple(spec.sliding_window for spec in specs),
        )  # fmt: skip
        lower = []
        for spec in chain:
            assert spec.scheduler is not None
            index = spec.scheduler(dataclasses.replace(context, config=config.section(spec)))
            if index is not None:
                lower.append(index)
        key_maker = ChunkKeyMaker(keys, factor, config.hash_algo)
        events = vllm_config.kv_events_config  # a router is told what each tier holds
        publish = events is not None and events.enable_kv_cache_events
        chunk_bytes = per_block * factor * world_size
        unsound = recovers_sync_loads(vllm_config)
        if unsound is not None and lower:
            logger.info("kvtier: vLLM's %s does not recompute a failed load made before the "
                        "forward right (vllm-project/vllm#49250): the chain's chunks load "
                        "while their request waits", unsound)  # fmt: skip
        scheduler = SchedulerConnector(
            config, specs, num_chunks, world_size, key_maker, lower, prefix_events=publish,
            clock=time.perf_counter,  # a hit is decided by the costs measured with it
            chunk_bytes=chunk_bytes, chain_before_forward=unsound is None,
        )  # fmt: skip
        for spec in config.sources():
            assert spec.source is not None
            source = spec.source(dataclasses.replace(context, config=config.section(spec)))
            if source is not None:
                scheduler.add_source(source)
        role.scheduler(scheduler)
        logger.info(
            "kvtier: host tier of %d chunks of %d tokens, %d KV cache group(s), %d rank(s), "
            "weights %s%s", num_chunks, engine_block * factor, len(groups), world_size,
            keys.weights,
            "".join(f", then {tier.name}" for tier in lower),
        )  # fmt: skip
        observe = Observability(scheduler, chunk_bytes, config.tiers)
        return cls(scheduler, observe, keys, role, config.reset_keeps_tiers)


class WorkerSide:
    """A worker process's half: the worker connector, its tiers built once the KV tensors are."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        config: KVTierConfig,
        role: KVRole,
    ) -> None:
        self._vllm_config, self._config, self._role = vllm_config, config, role
        self._factor = config.block_size_factor(vllm_config.cache_config.block_size)
        world_size = vllm_config.parallel_config.world_size
        self.worker = WorkerConnector(config.cpu_bytes_to_use, self._factor, world_size)
        self._group_layers = [list(g.layer_names) for g in kv_cache_config.kv_cache_groups]
        self._num_blocks = kv_cache_config.num_blocks
        self._tp_rank: int | None = None  # once registered

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """This rank's views, host tier and tiers (the chain's, then the request sources')."""
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        tp_rank, pp_rank = get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
        parallel = self._vllm_config.parallel_config
        rank = pp_rank * parallel.tensor_parallel_size + tp_rank  # names its share of a chunk
        server_rank = parallel.data_parallel_index * parallel.world_size + rank
        base = fingerprint(self._vllm_config, "", tp_rank, pp_rank, self._factor)
        config = self._config

        def builder(spec: TierSpec[Any]) -> TierBuilder:
            def build(layout: KVLayout, host: HostTier, description: str) -> WorkerTier | None:
                assert spec.worker is not None
                mine = dataclasses.replace(base, layout=description)
                context = WorkerContext(
                    config.section(spec), layout, host, rank, mine, self._factor, self._role.role,
                    server_rank,
                )  # fmt: skip
                return spec.worker(context)

            return build

        layers = [[name for name in group if name in kv_caches] for group in self._group_layers]
        specs = [*config.chain(), *config.sources()]
        builders = [builder(spec) for spec in specs if spec.worker is not None]
        packing = kernel_packing(self._vllm_config, kv_caches)
        self.worker.register(kv_caches, layers, self._num_blocks, builders, packing)
        self._role.registered(self.worker.tiers)
        self._tp_rank = tp_rank

    def handshake(self, alone: bool) -> KVTierHandshake | None:
        """What this rank tells the scheduler (``handshake.py``), once registered; ``alone``:
        kvtier is the engine's connector (else only a listener is told)."""
        if self._tp_rank is None or (not alone and self._role.address is None):
            return None
        host, port = self._role.address or ("", 0)
        return KVTierHandshake(self._tp_rank, self.worker.layout_description, host, port)


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


def _refuse_context_parallel(vllm_config: VllmConfig) -> None:
    """Prefill context parallelism (Model Runner V2's) runs ranks that share a tensor-parallel
    rank and a pipeline stage: kvtier names a rank's share of a chunk by those two, so their
    files, keys and peer addresses would collide. Decode context parallelism is refused by its
    hashing unit (``block_hashes.py``)."""
    size = getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1)
    if size > 1:
        raise ValueError(f"kvtier: prefill_context_parallel_size={size} is not supported (only 1)")


def _warn_if_hashes_differ_per_process(vllm_config: VllmConfig) -> None:
    """vLLM seeds a non-cryptographic block hash at random in each process unless
    PYTHONHASHSEED is set: then no other engine, and no restart, ever finds a chunk in a tier
    of the chain."""
    algo = str(vllm_config.cache_config.prefix_caching_hash_algo)
    if "xxhash" in algo and os.environ.get("PYTHONHASHSEED") is None:
        logger.warning(
            "kvtier: prefix_caching_hash_algo=%s without PYTHONHASHSEED gives block hashes that "
            "differ in every process: chunks on disk will only be found by this process. Set "
            "PYTHONHASHSEED to one value for all engines, or use sha256 (vLLM's default).",
            algo,
        )
