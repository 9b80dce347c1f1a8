"""The engine's kv_role inside vLLM: ``kv_both`` (the default), or prefill→decode with
``kv_producer`` (prefill) and ``kv_consumer`` (decode), the peer tier (``kvtier/tiers/peer/``).

``KVRole`` is one part of ``KVTierConnector``, with explicit inputs: what vLLM's requests and
handshake mean for the peer tier, whose two halves are built through its spec like every tier's
(``tiers/peer/build.py``); ``kv_both`` neither listens nor pulls, and every call is a no-op. The
two other roles keep the chain's tiers: a prefill engine's prefix hits still count, a decode
engine's turns still hit its own tiers.

    scheduler(scheduler)                 the scheduler half's planner (the peer tier's source)
    registered(tiers)                    a worker rank's listener or puller, once built
    address / set_handshake(m)           a prefill rank's listener, as the scheduler learns it
    on_new_request(request, hash_size)   a prefill engine backs a decode's prompt off
    may_pull(request)                    a decode request's, to pull (vLLM asks: may it wait)
    lookup(request, computed, salt)      a decode request's pull: (tokens, True) or None
    skipped(request)                     one that reads no outside KV frees its offer at once
    allocated(request)                   its pull is planned: never again
    finished(request, block_ids, salt)   a prefill request's offer: the params for the decode
    released(req_ids)                    vLLM's finished_sending
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata
from vllm.v1.request import RequestStatus

from kvtier.config import KVTierConfig
from kvtier.tiers.peer import SPEC as PEER
from kvtier.tiers.peer.planner import PeerPlanner
from kvtier.tiers.peer.worker import PeerWorkerTier
from kvtier.vllm.handshake import KVTierHandshake
from kvtier.vllm.releases import skips_external_kv, truncate_block_hashes

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

    from kvtier.scheduler.connector import SchedulerConnector
    from kvtier.tiers.base.spec import WorkerTier

logger = logging.getLogger(__name__)

ROLES = ("kv_both", "kv_producer", "kv_consumer")
TRUNCATED = "_kvtier_backed_off"  # in a prefill request's params: its prompt lost its tail once
# in an offer's params: the salt of the adapter files the prompt was computed with (hex; absent:
# none), which a decode engine's own salt for the request must equal (``AdapterSalts``)
SALT = "kvtier_key_salt"


class KVRole:
    """The engine's kv_role (ValueError on an unknown one, or a transfer role without the
    shared secret)."""

    def __init__(self, vllm_config: VllmConfig, config: KVTierConfig) -> None:
        transfer = config.section(PEER)
        assert transfer is not None  # the peer tier's section has a default
        kv_transfer = vllm_config.kv_transfer_config
        role = str(kv_transfer.kv_role) if kv_transfer and kv_transfer.kv_role else "kv_both"
        if role not in ROLES:
            raise ValueError(f"kvtier: kv_role must be one of {', '.join(ROLES)}; got {role!r}")
        if role != "kv_both":
            transfer.secret_bytes()
        self.role, self.transfer, self._vllm_config = role, transfer, vllm_config
        self.engine_id = str(getattr(kv_transfer, "engine_id", None) or "kvtier")
        self.planner: PeerPlanner | None = None  # the scheduler half's
        self._scheduler: SchedulerConnector | None = None
        self.address: tuple[str, int] | None = None  # a prefill rank's listener (host, port)
        self._told_foreign: set[str | None] = set()  # adapters whose offers were refused

    @property
    def producer(self) -> bool:
        return self.role == "kv_producer"

    # ---- construction ------------------------------------------------------------------------

    def set_load_failure_policy(self) -> None:
        """kvtier is a cache: a load that fails is a miss, recomputed, never a failed request
        (vLLM's default for connectors is to fail the request), unless a decode engine asks a
        failed pull to fail (``transfer.load_failure_policy``)."""
        kv_transfer = self._vllm_config.kv_transfer_config
        policy = self.transfer.load_failure_policy
        if kv_transfer is not None and kv_transfer.kv_load_failure_policy != policy:
            logger.info("kvtier: kv_load_failure_policy set to %r", policy)
            kv_transfer.kv_load_failure_policy = policy  # type: ignore[assignment]

    def scheduler(self, scheduler: SchedulerConnector) -> None:
        """Take the peer tier's planner from ``scheduler`` (its spec built it as a request
        source)."""
        if self.role == "kv_both":
            return
        if self._vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise ValueError(
                "kvtier: kv_producer/kv_consumer with pipeline parallelism is not supported"
            )
        planner = scheduler.sources.by_name.get(PEER.name)
        assert isinstance(planner, PeerPlanner), planner
        self.planner, self._scheduler = planner, scheduler

    def registered(self, tiers: Mapping[str, WorkerTier]) -> None:
        """A worker rank's tiers are built: its listener's address, for the handshake."""
        tier = tiers.get(PEER.name)
        if isinstance(tier, PeerWorkerTier) and tier.address is not None:
            self.address = tier.address

    # ---- handshake ---------------------------------------------------------------------------

    def set_handshake(self, metadata: Mapping[int, KVConnectorHandshakeMetadata]) -> None:
        """The listeners the ranks told (``handshake.py``), by tensor rank."""
        if self.planner is None or self.planner.producer is None:
            return
        endpoints = {}
        for tp_rank, meta in metadata.items():
            if isinstance(meta, KVTierHandshake) and meta.port:
                endpoints[tp_rank] = (meta.host, meta.port)
        self.planner.producer.set_endpoints(endpoints)

    # ---- requests ----------------------------------------------------------------------------

    def on_new_request(self, request: Request, hash_block_size: int) -> None:
        """A prefill engine backs off a remote decode's prompt by the tokens the decode engine
        will compute (``PeerProducer.backoff``) the way NixlConnector truncates it, once, before
        anything is scheduled (``hash_block_size``: tokens per hash of the request's)."""
        params = request.kv_transfer_params
        producer = self.planner.producer if self.planner is not None else None
        if producer is None or not params or not params.get("do_remote_decode"):
            return
        backoff = producer.backoff(request.num_prompt_tokens)
        if not backoff or params.get(TRUNCATED) or request.prompt_token_ids is None:
            return
        if request.num_computed_tokens or request.num_output_tokens:
            return  # not before its first step: leave it whole
        if skips_external_kv(request):
            return  # prompt logprobs: the decode engine computes the whole prompt anyway
        # a new list: the caller's prompt (an in-process engine's) stays whole
        request.prompt_token_ids = request.prompt_token_ids[:-backoff]
        del request._all_token_ids[-backoff:]  # in place: ``all_token_ids`` wraps this list
        request.num_prompt_tokens -= backoff
        truncate_block_hashes(request, hash_block_size)  # its last block may be full no more
        request.max_tokens = 1
        params[TRUNCATED] = True

    def lookup(
        self, request: Request, hashes: Sequence[bytes], num_computed_tokens: int, salt: bytes
    ) -> tuple[int, bool] | None:
        """A decode request's pull from its prefill engine (``hashes``: one per full engine
        block; ``salt``: its chunk keys', ``AdapterSalts``); None: not one."""
        params = request.kv_transfer_params
        if self.planner is None or params is None or not self.may_pull(request):
            return None
        assert self._scheduler is not None
        if params.get(SALT, "") != salt.hex():
            self._foreign(request, num_computed_tokens)
            return None
        tokens = self._scheduler.source_lookup(
            self.planner.name, request.request_id, hashes, params,
            request.num_prompt_tokens, num_computed_tokens, salt,
        )  # fmt: skip
        if tokens > 0:
            return tokens, True
        self._release_unpulled(params)  # its own prefix cache holds the whole prompt
        return None

    def _foreign(self, request: Request, num_computed_tokens: int) -> None:
        """The prefill engine computed ``request``'s prompt with other files of its adapter (one
        of two engines has it saved again, as in a rolling update): not pulled, its offer freed,
        its chunks counted bad; the engine looks in its own tiers, else computes it."""
        assert self._scheduler is not None
        lora = request.lora_request
        name = lora.lora_name if lora is not None else None
        log = logger.debug if name in self._told_foreign else logger.warning
        self._told_foreign.add(name)
        log("kvtier: the prefill engine computed %s with other files of adapter %r than this "
            "engine's: not pulled, computed here", request.request_id, name)  # fmt: skip
        tokens = max(0, request.num_prompt_tokens - num_computed_tokens)
        chunks = -(-tokens // self._scheduler.chunk_tokens)
        self._scheduler.stats.tiers[PEER.name].bad_chunks += chunks
        self._release_unpulled(request.kv_transfer_params)

    def skipped(self, request: Request) -> None:
        """A decode request that reads no KV from outside the engine (prompt logprobs) computes
        its whole prompt: it frees its prefill engine's offer now, not once it has finished."""
        self._release_unpulled(request.kv_transfer_params)

    def may_pull(self, request: Request) -> bool:
        """Whether ``request`` is a decode engine's, to pull from its prefill engine."""
        params = request.kv_transfer_params
        consumer = self.planner is not None and self.planner.consumer is not None
        return consumer and bool(params and params.get("do_remote_prefill"))

    def allocated(self, request: Request) -> None:
        """The pull is planned: never again for this request (a preempted one recomputes)."""
        params = request.kv_transfer_params
        if params is not None and self.may_pull(request):
            params["do_remote_prefill"] = False

    def _release_unpulled(self, params: dict[str, Any] | None) -> None:
        """A decode request that will never pull frees the prefill engine's offer, once."""
        if self.planner is None:
            return
        if params and params.get("do_remote_prefill") and self.planner.release(params):
            params["do_remote_prefill"] = False

    def finished(
        self, request: Request, block_ids: Sequence[Sequence[int]], salt: bytes = b""
    ) -> dict[str, Any] | None:
        """A prefill request's offer to a decode engine: the params it needs (or None), with
        ``salt`` (its adapter's, ``lookup``'s). A decode request that ends before it pulled
        (aborted while waiting) frees the prefill's offer."""
        if self.planner is None:
            return None
        self._release_unpulled(request.kv_transfer_params)  # aborted while waiting
        completed = request.status in (
            RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED,
        )  # fmt: skip
        offer = self.planner.finished(
            request.request_id, request.kv_transfer_params, block_ids,
            request.num_computed_tokens, completed,
        )  # fmt: skip
        if offer is not None and salt:
            offer[SALT] = salt.hex()
        return offer

    def released(self, req_ids: set[str]) -> None:
        if self.planner is not None and req_ids:
            self.planner.released(req_ids)
