"""Prefill→decode inside vLLM: kv_role ``kv_producer`` (prefill) and ``kv_consumer`` (decode).

    get_handshake_metadata()          a prefill worker rank's listener (host, port)
    set_xfer_handshake_metadata(m)    the scheduler learns every rank's listener
    _peer_lookup(request, computed)   a decode request's pull: (tokens, True) or None
    _peer_finished(request, blocks)   a prefill request's offer: the params for the decode side

``kv_both`` (the default) neither listens nor pulls. The two roles keep the host and disk tiers:
a prefill engine's prefix hits still count, a decode engine's turns still hit its own tiers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
from vllm.v1.request import RequestStatus

from kvtier.config import KVTierConfig
from kvtier.tiers.peer.roles import PeerConsumer, PeerProducer
from kvtier.tiers.peer.worker import PeerSettings
from kvtier.transfer import PeerIdentity

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

    from kvtier.scheduler.connector import SchedulerConnector
    from kvtier.worker.connector import WorkerConnector

logger = logging.getLogger(__name__)

ROLES = ("kv_both", "kv_producer", "kv_consumer")
TRUNCATED = "_kvtier_backed_off"  # in a prefill request's params: its prompt lost its tail once


@dataclass
class KVTierHandshake(KVConnectorHandshakeMetadata):
    """A prefill worker rank's transfer listener, as decode engines reach it."""

    rank: int
    host: str
    port: int


def peer_role(vllm_config: VllmConfig, config: KVTierConfig) -> str:
    """The engine's kv_role; a transfer role needs the shared secret (ValueError without)."""
    transfer = vllm_config.kv_transfer_config
    role = str(transfer.kv_role) if transfer is not None and transfer.kv_role else "kv_both"
    if role not in ROLES:
        raise ValueError(f"kvtier: kv_role must be one of {', '.join(ROLES)}; got {role!r}")
    if role != "kv_both":
        config.transfer.secret_bytes()
    return role


def scheduler_peers(
    vllm_config: VllmConfig,
    config: KVTierConfig,
    role: str,
    block_tokens: int,
    windows: Sequence[int | None],
) -> tuple[PeerProducer | None, PeerConsumer | None]:
    """The scheduler half's side of the role; ``windows``: each group's sliding window."""
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1 and role != "kv_both":
        raise ValueError(
            "kvtier: kv_producer/kv_consumer with pipeline parallelism is not supported"
        )
    tp, world = parallel.tensor_parallel_size, parallel.world_size
    if role == "kv_producer":
        transfer = vllm_config.kv_transfer_config
        engine_id = str(getattr(transfer, "engine_id", None) or "kvtier")
        hold_s = config.transfer.hold_s
        return PeerProducer(engine_id, hold_s, tp, world, block_tokens, windows), None
    if role == "kv_consumer":
        return None, PeerConsumer(block_tokens, len(windows), tp, world, windows)
    return None, None


def worker_settings(config: KVTierConfig, identity: PeerIdentity, rank: int) -> PeerSettings:
    transfer = config.transfer
    return PeerSettings(
        identity=identity,
        secret=transfer.secret_bytes(),
        rank=rank,
        host=transfer.host,
        reach_host=transfer.reach_host,
        port=transfer.port + rank if transfer.port else 0,
        timeout_s=transfer.timeout_s,
        connections=transfer.connections,
    )


def identity(vllm_config: VllmConfig, layout: str, tp_rank: int) -> PeerIdentity:
    """What both ranks of a transfer must share: the KV's meaning and its shape on the rank."""
    model, cache = vllm_config.model_config, vllm_config.cache_config
    return PeerIdentity((
        ("model", str(model.model)),
        ("dtype", f"{model.dtype}/{cache.cache_dtype}"),
        ("block_tokens", str(cache.block_size)),
        ("tp_size", str(vllm_config.parallel_config.tensor_parallel_size)),
        ("tp_rank", str(tp_rank)),
        ("layout", layout),
    ))  # fmt: skip


class PeerTransfer:
    """The connector's prefill→decode calls (mixed into ``KVTierConnector``)."""

    _scheduler: SchedulerConnector | None
    _worker: WorkerConnector | None
    _peer_address: tuple[int, str, int] | None = None  # (rank, host, port) of a prefill rank
    # ConnectorObservability's: hold the blocks, add the provenance to the params
    _finished: Callable[[Request, dict[str, Any] | None], tuple[bool, dict[str, Any] | None]]

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        if self._peer_address is None:
            return None
        return KVTierHandshake(*self._peer_address)

    def set_xfer_handshake_metadata(
        self, metadata: Mapping[int, KVConnectorHandshakeMetadata]
    ) -> None:
        if self._scheduler is None or self._scheduler.producer is None:
            return
        endpoints = {}
        for tp_rank, meta in metadata.items():
            if isinstance(meta, KVTierHandshake):
                endpoints[tp_rank] = (meta.host, meta.port)
        self._scheduler.producer.set_endpoints(endpoints)

    def on_new_request(self, request: Request) -> None:
        """vLLM's hook for a request entering the scheduler: a prefill engine backs off a remote
        decode's prompt by the tokens the decode engine will compute (``PeerProducer.backoff``)
        the way NixlConnector truncates it, once, before anything is scheduled."""
        params = request.kv_transfer_params
        producer = self._scheduler.producer if self._scheduler is not None else None
        if producer is None or not params or not params.get("do_remote_decode"):
            return
        backoff = producer.backoff(request.num_prompt_tokens)
        if not backoff or params.get(TRUNCATED) or request.prompt_token_ids is None:
            return
        if request.num_computed_tokens or request.num_output_tokens:
            return  # not before its first step: leave it whole
        if request.get_skip_reading_prefix_cache():
            return  # prompt logprobs: the decode engine computes the whole prompt anyway
        # a new list: the caller's prompt (an in-process engine's) stays whole
        request.prompt_token_ids = request.prompt_token_ids[:-backoff]
        del request._all_token_ids[-backoff:]  # in place: ``all_token_ids`` wraps this list
        request.num_prompt_tokens -= backoff
        request.max_tokens = 1
        params[TRUNCATED] = True

    def _peer_lookup(self, request: Request, num_computed_tokens: int) -> tuple[int, bool] | None:
        """A decode request's pull from its prefill engine; None: not one."""
        assert self._scheduler is not None
        params = request.kv_transfer_params
        if self._scheduler.consumer is None or not params or not params.get("do_remote_prefill"):
            return None
        tokens = self._scheduler.peer_lookup(
            request.request_id, request.block_hashes, params, request.num_prompt_tokens,
            num_computed_tokens,
        )  # fmt: skip
        if tokens > 0:
            return tokens, True
        self._release_unpulled(params)  # its own prefix cache holds the whole prompt
        return None

    def _peer_allocated(self, request: Request) -> None:
        """The pull is planned: never again for this request (a preempted one recomputes)."""
        params = request.kv_transfer_params
        consumer = self._scheduler is not None and self._scheduler.consumer is not None
        if consumer and params and params.get("do_remote_prefill"):
            params["do_remote_prefill"] = False

    def _release_unpulled(self, params: dict[str, Any] | None) -> None:
        """A decode request that will never pull frees the prefill engine's offer, once."""
        assert self._scheduler is not None
        if params and params.get("do_remote_prefill") and self._scheduler.peer_release(params):
            params["do_remote_prefill"] = False

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request, self._peer_finished(request, [block_ids]))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request, self._peer_finished(request, block_ids))

    def _peer_finished(
        self, request: Request, block_ids: Sequence[Sequence[int]]
    ) -> dict[str, Any] | None:
        """A prefill request's offer to a decode engine: the params it needs (or None). A decode
        request that ends before it pulled (aborted while waiting) frees the prefill's offer."""
        assert self._scheduler is not None
        self._release_unpulled(request.kv_transfer_params)  # aborted while waiting
        completed = request.status in (
            RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED,
        )  # fmt: skip
        return self._scheduler.peer_finished(
            request.request_id, request.kv_transfer_params, block_ids,
            request.num_computed_tokens, completed,
        )  # fmt: skip
