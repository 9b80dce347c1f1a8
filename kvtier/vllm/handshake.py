"""What each worker rank tells the scheduler once its KV tensors are registered: vLLM's connector
handshake, which the engine collects before its first step.

    KVTierHandshake(rank, layout, host, port)  one rank's: its layout (``KVLayout.describe``)
                                               and, on a prefill engine, its transfer listener
    rank_layouts(metadata)   -> [str]          the ranks' distinct layouts, in rank order
    alone(connector)         -> bool           vLLM loaded it as the engine's connector

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

from collections.abc import Mapping
from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata


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
