"""Prefill→decode, the worker half: a prefill rank serves its offered blocks, a decode rank pulls.

``PeerServing`` (kv_producer): this rank's ``TransferServer``; the scheduler's offers are made to
it, and a request is released once the decode engine pulled it or its hold expired.
``PeerLoadHandler`` (kv_consumer, peer -> engine): each pull runs on a thread bound to the
worker's device, receiving straight into the engine blocks; a failed pull fails the job (the
engine recomputes those blocks, or fails the request), never waits past the client's timeout.
On a GPU a pull's commits wait for the engine's stream as it was when the pull was asked for
(an event, not the engine's thread): a step still in flight may use blocks just given to it.
Pulls from one prefill engine run one after another; pulls from different ones (up to
``PULL_LANES`` engines) side by side, so that a peer that hangs until the timeout delays only its
own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from kvtier.addresses import EngineBlocks, TransferSpec
from kvtier.layout import KVLayout
from kvtier.tiers.base.handler import TransferResult
from kvtier.tiers.base.job_thread import JobThread, ThreadedHandler, engine_ready
from kvtier.tiers.base.keyed_threads import KeyedThreads
from kvtier.tiers.base.spec import WorkerTier
from kvtier.tiers.peer.messages import NAME, PeerBlocks, PeerOffer
from kvtier.tiers.peer.net import (
    BlockRows,
    CpuBlockRows,
    PeerIdentity,
    TransferClient,
    TransferError,
    TransferServer,
)

logger = logging.getLogger(__name__)

PULL_LANES = 8  # prefill engines pulled from at once by one decode rank (a thread each, lazily)


@dataclass(frozen=True)
class PeerSettings:
    """One worker rank's side of prefill→decode (``TransferConfig``, resolved for the rank)."""

    identity: PeerIdentity
    secret: bytes = field(repr=False)
    rank: int
    host: str = "127.0.0.1"  # where a prefill rank listens
    reach_host: str = "127.0.0.1"  # where decode engines reach it
    port: int = 0  # 0: ephemeral
    timeout_s: float = 10.0
    connections: int = 2


def block_rows(layout: KVLayout) -> BlockRows:
    """The engine's blocks as the transfer engine reads and writes them (staged on a GPU)."""
    if layout.device.type == "cuda":
        from kvtier.tiers.peer.net import CudaBlockRows

        return CudaBlockRows(layout.views, layout.groups)
    return CpuBlockRows(layout.views, layout.groups)


def start_serving(layout: KVLayout, settings: PeerSettings) -> tuple[PeerServing, tuple[str, int]]:
    """A prefill rank's listener, and the address decode engines reach it at."""
    server = TransferServer(
        block_rows(layout), settings.identity, settings.secret, settings.host, settings.port,
        io_timeout_s=settings.timeout_s,
    )  # fmt: skip
    return PeerServing(server), (settings.reach_host, server.address[1])


def peer_load_handler(layout: KVLayout, settings: PeerSettings) -> PeerLoadHandler:
    """A decode rank's puller."""
    client = TransferClient(
        block_rows(layout), settings.identity, settings.secret,
        timeout_s=settings.timeout_s, connections=settings.connections,
        concurrent_pulls=PULL_LANES,
    )  # fmt: skip
    return PeerLoadHandler(client, settings.rank, layout.device)


class PeerServing:
    """The offers of one prefill rank, until the decode engine released them."""

    def __init__(self, server: TransferServer) -> None:
        self.server = server
        self.pending: set[str] = set()

    def offer(self, offers: Iterable[PeerOffer]) -> None:
        now = time.monotonic()
        for offer in offers:
            self.server.offer(offer.req_id, offer.block_ids, now + offer.hold_s)
            self.pending.add(offer.req_id)

    def take_released(self) -> set[str]:
        """Requests pulled (or expired) since the last call."""
        released = set()
        for req_id, pulled in self.server.take_done():
            if not pulled:  # expired before a decode engine came, or its pull failed
                logger.warning("kvtier: %s not pulled (expired or failed); blocks freed", req_id)
            released.add(req_id)
        self.pending -= released
        return released

    def close(self) -> None:
        self.server.close()


class PeerLoadHandler(ThreadedHandler):
    """peer -> engine: ``rank`` pulls from the prefill engine's rank of the same index."""

    def __init__(self, client: TransferClient, rank: int, device: torch.device) -> None:
        self.client = client
        self.rank = rank
        self.device = device
        self._thread = JobThread("kvtier-peer", device, lanes=PULL_LANES)
        # releases: no rows, no result; best effort (an unreleased offer expires on its own)
        self._releases = KeyedThreads("kvtier-release", PULL_LANES)

    def release(self, src: PeerBlocks) -> None:
        """Tell the prefill rank to free ``src``'s offer, off the engine's step."""
        self._releases.submit(src.endpoints[self.rank], lambda: self._release(src))

    def _release(self, src: PeerBlocks) -> None:
        host, port = src.endpoints[self.rank]
        try:
            self.client.pull(host, port, src.req_id, src.block_ids, src.block_ids)
        except (TransferError, ValueError) as error:
            logger.info("kvtier: release of %s at %s:%d failed: %s", src.req_id, host, port, error)

    def transfer_async(self, job_id: int, src: TransferSpec, dst: TransferSpec) -> bool:
        assert isinstance(src, PeerBlocks) and isinstance(dst, EngineBlocks)
        ids = dst.block_ids.tolist()
        local, start = [], 0
        for size in dst.group_sizes:
            local.append(ids[start : start + size])
            start += size
        peer = src.endpoints[self.rank]
        ready = engine_ready(self.device)  # a step in flight may still use the blocks
        self._thread.submit(job_id, lambda: self._pull(job_id, src, local, ready), key=peer)
        return True

    def _pull(
        self,
        job_id: int,
        src: PeerBlocks,
        local: list[list[int]],
        ready: torch.cuda.Event | None,
    ) -> TransferResult:
        started = time.perf_counter()
        host, port = src.endpoints[self.rank]
        try:
            received = self.client.pull(host, port, src.req_id, src.block_ids, local, ready)
        except TransferError as error:
            logger.warning(
                "kvtier: pull of %s from %s:%d failed: %s", src.req_id, host, port, error
            )
            return TransferResult(job_id, False, 0, time.perf_counter() - started)
        return TransferResult(job_id, True, received, time.perf_counter() - started)

    def shutdown(self) -> None:
        super().shutdown()
        self._releases.shutdown(wait=True)
        self.client.close()


class PeerWorkerTier(WorkerTier):
    """One rank's side of the peer tier: a prefill rank serves offers (``serving``), a decode
    rank pulls (``load``) and frees offers it will never pull. ``address``: where decode
    engines reach a prefill rank (vLLM's handshake carries it to the scheduler)."""

    def __init__(
        self,
        serving: PeerServing | None,
        puller: PeerLoadHandler | None,
        address: tuple[str, int] | None = None,
    ) -> None:
        super().__init__(NAME, load=puller)
        self.serving, self.puller, self.address = serving, puller, address

    def begin_step(self, messages: Sequence[object]) -> None:
        offers = [m for m in messages if isinstance(m, PeerOffer)]
        releases = [m for m in messages if isinstance(m, PeerBlocks)]
        if offers:
            assert self.serving is not None, "kvtier: an offer to a worker that does not serve"
            self.serving.offer(offers)
        if releases:
            assert self.puller is not None, "kvtier: a release from a worker that cannot pull"
            for release in releases:
                self.puller.release(release)

    def holding(self) -> set[str]:
        if self.serving is None:
            return set()
        self.serving.take_released()
        return set(self.serving.pending)

    def wait_idle(self, timeout_s: float) -> None:
        # only offers wait (the decode engines' pulls run on the listener's threads)
        if self.serving is not None and self.serving.pending:
            self.serving.server.wait_done(timeout_s)

    def close(self) -> None:
        if self.serving is not None:
            self.serving.close()


def peer_worker_tier(layout: KVLayout, settings: PeerSettings, producer: bool) -> PeerWorkerTier:
    """A prefill rank's listener (``producer``) or a decode rank's puller."""
    if producer:
        serving, address = start_serving(layout, settings)
        return PeerWorkerTier(serving, None, address)
    return PeerWorkerTier(None, peer_load_handler(layout, settings))
