"""Prefill→decode, the scheduler half: what a prefill engine offers and a decode engine pulls.

Producer (``kv_producer``): a request that carried ``do_remote_decode`` and finished normally keeps
its blocks. ``PeerProducer.finished`` returns an offer for the workers (they serve those blocks
to the decode engine until it pulled them, or for ``hold_s``) and the ``kv_transfer_params`` the
decode engine needs, under vLLM NixlConnector's field names so that vLLM's proxies and routers
pass them on unchanged (``remote_ports`` adds one port per worker rank).

Consumer (``kv_consumer``): a request carrying those params loads its whole prompt from the peer,
asynchronously (``PeerConsumer.lookup``), into the blocks the engine allocated beyond its own
prefix hit (``PeerConsumer.pair``). A pull that fails is reported like any failed load: the
engine recomputes the blocks, or fails the request, as ``load_failure_policy`` says.

Sliding-window groups: the prefill engine's window is the one of the token after the prompt
(vLLM frees the blocks before it, then finishes the request), while the decode engine computes
the prompt's last token again, whose window starts one token earlier. When that token opens a
block (prompt length n with n - window + 1 a multiple of the block), the block is gone on the
prefill side. So the prefill engine computes such a prompt without its last token
(``PeerProducer.backoff``, as NixlConnector's P-side truncation), which the decode engine
computes; and a decode engine that still finds a block it needs freed (a prefill engine that did
not back off) pulls nothing and computes the prompt, rather than attend to a block never written
(``PeerConsumer.lookup``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.addresses import NULL_BLOCK
from kvtier.tiers.peer.messages import PeerBlocks, PeerOffer

logger = logging.getLogger(__name__)

# what a decode request's params must name (NixlConnector's fields, checked the same way)
REQUIRED_PARAMS = (
    "remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host", "remote_port",
)  # fmt: skip
RELEASE_MARGIN_S = 30.0  # a held request the workers never released is forgotten this much later


class PeerProducer:
    """The prefill side: which finished requests the workers hold for a decode engine."""

    def __init__(
        self,
        engine_id: str,
        hold_s: float,
        tp_size: int,
        world_size: int,
        block_tokens: int = 1,
        windows: Sequence[int | None] = (),
    ) -> None:
        """``windows``: each group's sliding window in tokens (None: full attention)."""
        self.engine_id = engine_id
        self.hold_s = hold_s
        self.tp_size = tp_size
        self.world_size = world_size
        self.block_tokens = block_tokens
        self.windows = tuple(w for w in windows if w is not None)
        self.endpoints: tuple[tuple[str, int], ...] = ()  # per worker rank, from the handshake
        self._held: dict[str, float] = {}  # request -> when to stop waiting for its release

    def set_endpoints(self, endpoints: Mapping[int, tuple[str, int]]) -> None:
        """Each worker rank's listener, as its handshake metadata reported it."""
        missing = sorted(set(range(self.world_size)) - set(endpoints))
        if missing:
            raise RuntimeError(f"kvtier: no transfer listener reported by worker rank(s) {missing}")
        self.endpoints = tuple(endpoints[rank] for rank in range(self.world_size))
        logger.info(
            "kvtier: prefill engine %s serves KV on %s", self.engine_id,
            ", ".join(f"{host}:{port}" for host, port in self.endpoints),
        )  # fmt: skip

    def finished(
        self,
        req_id: str,
        params: Mapping[str, Any] | None,
        block_ids: Sequence[Sequence[int]],
        num_computed_tokens: int,
        completed: bool,
    ) -> tuple[PeerOffer | None, dict[str, Any] | None]:
        """A request finished: the offer to make (None: free its blocks) and the params for the
        decode engine. ``completed``: it stopped normally (an aborted one is never offered)."""
        if not params or not params.get("do_remote_decode") or not completed:
            return None, None
        if not self.endpoints:
            logger.warning("kvtier: no transfer listener known: %s is not offered", req_id)
            return None, None
        blocks = tuple(tuple(group) for group in block_ids)
        if not any(blocks):
            return None, None
        self._held[req_id] = time.monotonic() + self.hold_s + RELEASE_MARGIN_S
        host, port = self.endpoints[0]
        return PeerOffer(req_id, blocks, self.hold_s), {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(group) for group in blocks],
            "remote_engine_id": self.engine_id,
            "remote_request_id": req_id,
            "remote_host": host,
            "remote_port": port,
            "remote_ports": [p for _, p in self.endpoints],
            "remote_hosts": [h for h, _ in self.endpoints],
            "remote_num_tokens": num_computed_tokens,
            "tp_size": self.tp_size,
        }

    def backoff(self, num_prompt_tokens: int) -> int:
        """Trailing prompt tokens a request for a remote decode leaves to the decode engine: 1
        when computing the whole prompt would free, in a sliding-window group, the block that
        the decode engine's recomputed last token attends to first (n - window + 1 a positive
        multiple of the block), else 0."""
        for window in self.windows:
            skipped = num_prompt_tokens - window + 1  # tokens before the next token's window
            if skipped > 0 and skipped % self.block_tokens == 0 and num_prompt_tokens > 1:
                return 1
        return 0

    def holds(self, req_id: str) -> bool:
        """``req_id`` was offered and is not released yet."""
        return req_id in self._held

    def released(self, req_ids: Iterable[str]) -> None:
        """Every rank released these requests' blocks (pulled, or held too long)."""
        for req_id in req_ids:
            self._held.pop(req_id, None)

    @property
    def pending(self) -> bool:
        """Requests still held: the engine must keep stepping to release them."""
        now = time.monotonic()
        for req_id in [r for r, until in self._held.items() if until < now]:
            logger.warning("kvtier: %s was never released by the workers; forgotten", req_id)
            del self._held[req_id]
        return bool(self._held)


@dataclass(frozen=True)
class PeerLoad:
    """A decode request's pull: the prefill engine's blocks and this engine's, per group."""

    src: PeerBlocks
    local: tuple[tuple[int, ...], ...]
    first_blocks: tuple[int, ...]  # per group: the index, inside the request, of its first block


class PeerConsumer:
    """The decode side: how many tokens a request pulls, and into which blocks."""

    def __init__(
        self,
        block_tokens: int,
        num_groups: int,
        tp_size: int,
        world_size: int,
        windows: Sequence[int | None] = (),
    ) -> None:
        """``windows``: each group's sliding window in tokens (None: full attention; none given:
        every group has full attention)."""
        self.block_tokens = block_tokens
        self.num_groups = num_groups
        self.tp_size = tp_size
        self.world_size = world_size
        self.windows = tuple(windows) or (None,) * num_groups
        if len(self.windows) != num_groups:
            raise ValueError(f"{len(self.windows)} sliding windows for {num_groups} groups")
        self._told_window = False

    def lookup(
        self, params: Mapping[str, Any] | None, num_prompt_tokens: int, num_computed_tokens: int
    ) -> int:
        """Tokens to pull beyond the engine's own hit (0: none, or params not for a pull).

        Less than a block is not pulled: it is the prompt's last, partly filled block past the
        engine's own hit, and a pull would cost the request a scheduling step (it waits for
        it) to save computing those few tokens beside the last one, which is computed anyway.
        """
        if not self.wants_pull(params):
            return 0
        assert params is not None
        remote = int(params.get("remote_num_tokens") or num_prompt_tokens)
        tokens = min(remote, num_prompt_tokens) - num_computed_tokens
        if tokens < self.block_tokens:
            return 0
        end = num_computed_tokens + tokens
        first = end - 1 if end == num_prompt_tokens else end  # vLLM computes the last one again
        lost = self._window_lost(params["remote_block_ids"], num_computed_tokens, first)
        if lost is not None:
            log = logger.debug if self._told_window else logger.info
            self._told_window = True
            log(
                "kvtier: the prefill engine no longer holds block %d of sliding-window group %d, "
                "which the decode engine's token %d attends to (a %d-token prompt): computed here, "
                "not pulled", lost[1], lost[0], first, num_prompt_tokens,
            )  # fmt: skip
            return 0
        return tokens

    def _window_lost(
        self, raw: Any, num_computed_tokens: int, first: int
    ) -> tuple[int, int] | None:
        """(group, block index) of a block the tokens from ``first`` on attend to in a
        sliding-window group that the prefill engine freed (None: every one is there)."""
        remote = _groups(raw, self.num_groups)
        for g, window in enumerate(self.windows):
            if window is None:
                continue
            start = max(first - window + 1, num_computed_tokens, 0)  # before: this engine's own
            for index in range(start // self.block_tokens, -(-first // self.block_tokens)):
                if index < len(remote[g]) and remote[g][index] == NULL_BLOCK:
                    return g, index
        return None

    def wants_pull(self, params: Mapping[str, Any] | None) -> bool:
        if not params or not params.get("do_remote_prefill"):
            return False
        missing = [name for name in REQUIRED_PARAMS if params.get(name) is None]
        if missing:
            logger.warning("kvtier: kv_transfer_params without %s: not pulled", ", ".join(missing))
            return False
        try:
            if int(params.get("tp_size") or self.tp_size) != self.tp_size:
                raise ValueError(
                    f"kvtier: the prefill engine has tp_size {params.get('tp_size')}, "
                    f"this one {self.tp_size}"
                )
            _groups(params["remote_block_ids"], self.num_groups)
            _endpoints(params, self.world_size)
        except (TypeError, ValueError) as error:
            logger.warning("kvtier: %s: not pulled, the prompt is computed here", error)
            return False
        return True

    def pair(
        self,
        params: Mapping[str, Any],
        block_ids: Sequence[Sequence[int]],
        num_computed_tokens: int,
        num_external_tokens: int,
    ) -> PeerLoad:
        """The pull into ``block_ids`` (the request's blocks per group, as allocated) of the
        ``num_external_tokens`` after the engine's own ``num_computed_tokens``; ``params``
        passed ``wants_pull``. A pull of no blocks only releases the prefill engine's."""
        remote = _groups(params["remote_block_ids"], len(block_ids))
        first = num_computed_tokens // self.block_tokens
        end = math.ceil((num_computed_tokens + num_external_tokens) / self.block_tokens)
        local_pairs: list[tuple[int, ...]] = []
        remote_pairs: list[tuple[int, ...]] = []
        for local_group, remote_group in zip(block_ids, remote, strict=True):
            pairs = [
                (loc, rem)
                for loc, rem in zip(local_group[first:end], remote_group[first:end], strict=False)
                if loc != NULL_BLOCK and rem != NULL_BLOCK  # outside a sliding window
            ]
            local_pairs.append(tuple(loc for loc, _ in pairs))
            remote_pairs.append(tuple(rem for _, rem in pairs))
        src = PeerBlocks(_endpoints(params, self.world_size), str(params["remote_request_id"]),
                         tuple(remote_pairs))  # fmt: skip
        return PeerLoad(src, tuple(local_pairs), (first,) * len(block_ids))

    def release(self, params: Mapping[str, Any]) -> PeerBlocks:
        """A pull of no blocks, which only tells the prefill engine to free its offer (a decode
        request that needs none of it, or ended before it was scheduled); ``params`` passed
        ``wants_pull``."""
        empty = tuple(() for _ in range(self.num_groups))
        return PeerBlocks(_endpoints(params, self.world_size), str(params["remote_request_id"]),
                          empty)  # fmt: skip


def _groups(raw: Any, num_groups: int) -> list[list[int]]:
    """``remote_block_ids`` per group: a list per group, or one flat list for one group."""
    if not isinstance(raw, list | tuple):
        raise ValueError(f"kvtier: remote_block_ids must be a list, got {type(raw).__name__}")
    if raw and all(isinstance(b, int) for b in raw):
        raw = [raw]
    if len(raw) != num_groups:
        raise ValueError(
            f"kvtier: remote_block_ids has {len(raw)} group(s), this engine {num_groups}"
        )
    return [[int(b) for b in group] for group in raw]


def _endpoints(params: Mapping[str, Any], world_size: int) -> tuple[tuple[str, int], ...]:
    """Each rank's prefill listener: ``remote_hosts``/``remote_ports`` (one per rank), else
    NixlConnector's convention of ``remote_port`` + rank on ``remote_host``."""
    host, port = str(params["remote_host"]), int(params["remote_port"])
    hosts = list(params.get("remote_hosts") or [host] * world_size)
    ports = list(params.get("remote_ports") or [port + rank for rank in range(world_size)])
    if len(hosts) != world_size or len(ports) != world_size:
        raise ValueError(
            f"kvtier: the prefill engine has {len(ports)} worker rank(s), this one {world_size}"
        )
    return tuple((str(h), int(p)) for h, p in zip(hosts, ports, strict=True))
