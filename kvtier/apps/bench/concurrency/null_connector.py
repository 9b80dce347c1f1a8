"""A KV connector that does nothing: what vLLM itself costs an engine that has any connector.

With a connector configured, vLLM's scheduler and model runner take paths of their own every
step (the connector's calls, a block state per scheduled request, the connector's output merged
and checked), whatever the connector does. ``kvtier bench concurrency`` runs this connector beside
the engine without one: their ratio is the bound no connector can beat, kvtier included.

    kv_transfer_config={"kv_connector": "NullConnector", "kv_role": "kv_both",
                        "kv_connector_module_path": "kvtier.apps.bench.concurrency.null_connector"}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

import torch

CONFIG = {
    "kv_connector": "NullConnector",
    "kv_connector_module_path": "kvtier.apps.bench.concurrency.null_connector",
    "kv_role": "kv_both",
}


class NullConnector(KVConnectorBase_V1):
    """Finds nothing, loads nothing, stores nothing."""

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return None

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
        return None
