"""What each worker rank tells the scheduler once its KV tensors are registered: vLLM's connector
handshake, which the engine collects before its first step.

    KVTierHandshake(rank, layout, host, port)    one rank's: its layout (``KVLayout.describe``)
                                                 and, on a prefill engine, its transfer listener
    kernel_packing(config, caches)   -> str      how a CPU rank's kernels pack a page (its ISA)
    alone(connector)                 -> bool     vLLM loaded it as the worker's connector
    rank_layouts(metadata)           -> [str]    the ranks' distinct layouts, in rank order
    named_by_ranks(keys, ranks)      -> LayoutFingerprint   the keys' with the ranks' layouts

The scheduler names its chunk keys by the ranks' layouts (``assembly.keys_fingerprint``). Two
engines of one model whose ranks lay the KV out otherwise (FlashAttention's and FlashInfer's
blocks, HND and NHD pages, vLLM's CPU kernels of two ISAs) hold other bytes for the same tokens:
sharing keys, each would find the other's records, refuse and delete them, and compute again,
hit after hit. Named apart, each finds only what it can load.

Inside vLLM's MultiConnector, whose handshake is the first of its connectors' to tell one,
kvtier's would hide another's (NixlConnector's): there a rank tells only a listener, and the keys
are named by the KV cache groups alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata

from kvtier.keys import LayoutFingerprint

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig


@dataclass
class KVTierHandshake(KVConnectorHandshakeMetadata):
    """A worker rank's layout, and where decode engines reach it (``port`` 0: no listener)."""

    rank: int  # its tensor-parallel rank
    layout: str
    host: str = ""
    port: int = 0


def rank_layouts(metadata: Mapping[tuple[int, int], KVConnectorHandshakeMetadata]) -> list[str]:
    """Each distinct layout the ranks told (keyed by pipeline stage, then tensor rank), in rank
    order: tensor ranks of a stage hold the same layout, the stages each their own."""
    layouts: dict[str, None] = {}
    for _, meta in sorted(metadata.items(), key=lambda item: item[0]):
        if isinstance(meta, KVTierHandshake):
            layouts[meta.layout] = None
    return list(layouts)


def alone(connector: object) -> bool:
    """Whether vLLM loaded ``connector`` as this worker's connector, not inside another (its
    MultiConnector copies each connector's config, so only the worker's group tells)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    return not has_kv_transfer_group() or get_kv_transfer_group() is connector


def named_by_ranks(keys: LayoutFingerprint, ranks: Sequence[str]) -> LayoutFingerprint:
    """``keys`` with the ranks' layouts (none told: ``keys``)."""
    if not ranks:
        return keys
    return dataclasses.replace(keys, layout=f"{keys.layout} ranks=[{' | '.join(ranks)}]")


def kernel_packing(vllm_config: VllmConfig, kv_caches: Mapping[str, torch.Tensor]) -> str:
    """How the attention kernels pack a page's values where its shape does not tell: vLLM's CPU
    backend writes a block's K and V in its ISA's order (AMX tiles, or rows for VEC), which it
    sets on each layer as ``isa`` before the KV tensors are registered; "" elsewhere (CUDA)."""
    layers = vllm_config.compilation_config.static_forward_context
    isas = {getattr(layers.get(name), "isa", None) for name in kv_caches}
    return ",".join(sorted(str(isa) for isa in isas if isa is not None))
