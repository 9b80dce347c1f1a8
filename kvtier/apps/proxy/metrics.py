"""The proxy's ``GET /metrics`` (Prometheus text format), one registry per proxy.

    kvtier_proxy_requests_total{prefill}        completions handed to a decode engine, by what
                                                the prefill hop did: ``offered`` (its KV went
                                                with the request), ``no-offer``, ``skipped``,
                                                ``failed`` (the ``x-kvtier-prefill`` header)
    kvtier_proxy_degraded_requests_total{reason}
                                                of those, the ones computed on the decode engine
                                                without a prefill: ``no_prefill`` (no prefill
                                                engine up), ``prefill_failed`` (it failed)
    kvtier_proxy_engine_up{side,url}            1 while the engine is taken for requests, 0
                                                while it is skipped (backoff, or /health failed)
    kvtier_proxy_resent_requests_total{side,cause}
                                                requests sent to another engine before any byte
                                                of the answer reached the client: the engine
                                                ``broke`` off, or ``stalled``, or it was late
                                                and went to a second one too: ``hedged``
                                                (``resend.py``)

Every label value is present from the start, at 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import Response

from kvtier.apps.proxy.balancer import Pool
from kvtier.apps.proxy.errors import BROKE, HEDGED, STALLED
from kvtier.apps.proxy.prefill import DEGRADED, Outcome


class ProxyMetrics:
    """The series above, for these pools (read at each scrape)."""

    def __init__(self, *pools: Pool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "kvtier_proxy_requests", "Completions handed to a decode engine, by what the prefill "
            "hop did (offered: the prefill engine's KV went with the request).",
            ["prefill"], registry=self.registry,
        )  # fmt: skip
        self.degraded = Counter(
            "kvtier_proxy_degraded_requests", "Completions computed on a decode engine without "
            "a prefill: no prefill engine was up (no_prefill), or the prefill failed.",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        for outcome in Outcome:
            self.requests.labels(prefill=outcome.value)
        for reason in DEGRADED.values():
            self.degraded.labels(reason=reason)
        self.resent = resent_counter(self.registry, [pool.side for pool in pools])
        self.registry.register(_EnginesUp(pools))

    def count(self, outcome: Outcome) -> None:
        """One completion handed to a decode engine after ``outcome``."""
        self.requests.labels(prefill=outcome.value).inc()
        if outcome in DEGRADED:
            self.degraded.labels(reason=DEGRADED[outcome]).inc()

    def resend_of(self, side: str) -> Callable[[str], None]:
        """Counts a request of ``side`` sent to another engine, by cause (``resend.py``)."""
        return lambda cause: self.resent.labels(side=side, cause=cause).inc()

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def resent_counter(registry: CollectorRegistry, sides: list[str]) -> Counter:
    """``kvtier_proxy_resent_requests_total{side,cause}``, every label at 0."""
    counter = Counter(
        "kvtier_proxy_resent_requests", "Requests sent to another engine before any byte of "
        "the answer reached the client: the engine broke off, or stalled.", ["side", "cause"],
        registry=registry,
    )  # fmt: skip
    for side in sides:
        for cause in (BROKE, STALLED, HEDGED):
            counter.labels(side=side, cause=cause)
    return counter


class _EnginesUp(Collector):
    def __init__(self, pools: tuple[Pool, ...]) -> None:
        self.pools = pools

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "kvtier_proxy_engine_up", "1 while the engine is taken for requests, 0 while it is "
            "skipped (a failed connection's backoff, or a failed /health on the prefill side).",
            labels=["side", "url"],
        )  # fmt: skip
        for pool in self.pools:
            for engine in pool.engines:
                family.add_metric([pool.side, engine.url], 1.0 if pool.is_up(engine) else 0.0)
        yield family
