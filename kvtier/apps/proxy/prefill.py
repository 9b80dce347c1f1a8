"""The prefill hop of a completion, and how it ended: an offer of KV, or none (degraded).

    prefill(pool, ...) -> Prefilled    the hop, never failing for the prefill's sake: a decode
                                       engine computes the prompt when no prefill engine is up
                                       (``skipped``) or the one asked fails before answering
                                       (``failed``: connection refused or reset, no answer by
                                       the prefill's limit, a 5xx, an answer that is not JSON)
    Prefilled.headers()                ``x-kvtier-prefill: OUTCOME`` and ``Server-Timing``

A prefill engine that fails after the connection is made is skipped for the pool's backoff (a
refused connection is, already, by ``open_exchange``), so that while it is down only the
requests that find out pay for it; ``health.watch`` keeps a dead one skipped until it is back,
and a stalled one: the requests it holds are given up on when its probe times out
(``stall.py``), not at the prefill's limit.
A 4xx is the client's error and passed back; a failure at the request's deadline, which leaves
no time to decode, is the client's 504.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvtier.apps.proxy.balancer import Pool
from kvtier.apps.proxy.bodies import offered_params, prefill_body
from kvtier.apps.proxy.errors import EngineAnswered, EngineFailed, EnginesDown
from kvtier.apps.proxy.relay import relay
from kvtier.apps.proxy.stall import FirstByte
from kvtier.apps.proxy.upstream import open_exchange

logger = logging.getLogger(__name__)

HEADER = b"x-kvtier-prefill"


class Outcome(Enum):
    """What the prefill hop did; the value is the ``x-kvtier-prefill`` header's."""

    OFFERED = "offered"  # the prefill engine's KV goes with the decode request
    NO_OFFER = "no-offer"  # it answered without offering its KV: the decode engine computes
    SKIPPED = "skipped"  # no prefill engine was up: the decode engine computes
    FAILED = "failed"  # the prefill engine failed: the decode engine computes


# the degraded outcomes, and their reason on /metrics
DEGRADED = {Outcome.SKIPPED: "no_prefill", Outcome.FAILED: "prefill_failed"}


@dataclass(frozen=True)
class Prefilled:
    outcome: Outcome
    offer: dict[str, Any] | None  # the decode request's kv_transfer_params
    duration_s: float  # the hop as the proxy timed it (0 when skipped)

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The proxy's own headers on the answer: the outcome, and ``Server-Timing:
        prefill;dur=MS`` (with ``desc="skipped"`` or ``"failed"`` when degraded)."""
        timing = b"prefill;dur=%.1f" % (self.duration_s * 1e3)
        if self.outcome in DEGRADED:
            timing += b';desc="%s"' % self.outcome.value.encode()
        return [(HEADER, self.outcome.value.encode()), (b"server-timing", timing)]


class _Failed(Exception):
    """The prefill engine answered, but not with a prefill (a 5xx, or not JSON): why."""


async def prefill(
    pool: Pool,
    path: str,
    request: dict[str, Any],
    headers: Mapping[str, str],
    deadline: float,
    limit_s: float,
    prefer: str | None = None,
) -> Prefilled:
    """The prefill hop for ``request``: at most ``limit_s``, and over by the request's
    ``deadline`` (a time on the event loop's clock). Raises ``EngineAnswered`` for the prefill
    engine's 4xx, and ``EngineFailed`` when it failed at ``deadline`` (nothing left to decode).
    ``prefer``: the prefill engine to ask first, if it is up (``placement.py`` chose it)."""
    request_id = headers["x-request-id"]
    if not pool.any_up():
        logger.debug("%s: no prefill engine up (%s)", request_id, pool.down_reasons())
        return Prefilled(Outcome.SKIPPED, None, 0.0)
    clock = asyncio.get_running_loop().time
    started = clock()
    try:
        limit = min(deadline, started + limit_s)
        offer = await _offer(pool, path, request, headers, limit, prefer)
    except EngineFailed as exc:
        if clock() >= deadline:
            raise
        pool.mark_down(pool.named(exc.url), exc.reason)
        return _failed(request_id, exc.message, clock() - started)
    except (EnginesDown, _Failed) as exc:
        return _failed(request_id, str(exc), clock() - started)
    outcome = Outcome.NO_OFFER if offer is None else Outcome.OFFERED
    return Prefilled(outcome, offer, clock() - started)


def _failed(request_id: str, why: str, duration_s: float) -> Prefilled:
    logger.warning("%s: %s; computed on a decode engine instead", request_id, why)
    return Prefilled(Outcome.FAILED, None, duration_s)


async def _offer(
    pool: Pool,
    path: str,
    request: dict[str, Any],
    headers: Mapping[str, str],
    deadline: float,
    prefer: str | None,
) -> dict[str, Any] | None:
    """The prefill engine's ``kv_transfer_params`` for the decode engine (None: no offer)."""
    body = json.dumps(prefill_body(request)).encode()
    # watched: a prefill engine found stalled while it has the request is given up on at once
    limits = FirstByte(deadline, deadline - asyncio.get_running_loop().time())
    exchange = await open_exchange(pool, "POST", path, body, headers, deadline, prefer, limits)
    engine, answer = exchange.engine, exchange.response
    if answer.status_code >= 500:
        await exchange.close()
        raise _Failed(f"prefill engine {engine.url} answered HTTP {answer.status_code}")
    if not answer.is_success:
        raise EngineAnswered("prefill", await relay(exchange))
    try:
        offer = offered_params(json.loads(await exchange.read()))
    except ValueError:
        raise _Failed(f"prefill engine {engine.url} answered with a body not JSON") from None
    logger.debug("%s: prefill on %s, %s", headers["x-request-id"], engine.url,
                 "its KV offered" if offer else "no KV offered")  # fmt: skip
    if offer is None and not engine.warned_no_offer:
        engine.warned_no_offer = True
        logger.warning(
            "prefill engine %s answered without kv_transfer_params to hand its KV over (no KV "
            "connector?): decode engines compute those prompts again", engine.url,
        )  # fmt: skip
    return offer
