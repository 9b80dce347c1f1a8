"""A fleet proxy's ``GET /metrics``: how it routes, and whether its index is right.

kvtier_proxy_decisions_total{policy,reason}   requests routed, by why: ``prefix`` (a cached
                                              prefix won), ``load``, ``round-robin``,
                                              ``no-index`` (no engine's index exact),
                                              ``no-tokens`` (the prompt could not be
                                              tokenized), ``retry`` (the chosen engine could
                                              not be connected to)
kvtier_proxy_engine_up{side="engine",url}     1 while taken for requests
kvtier_proxy_index_mode{url,mode}             1 for the engine's index mode: exact,
                                              degraded (rebuilding after lost events),
                                              down (no events: routed by load)
kvtier_proxy_index_blocks                     blocks some engine holds, in the index
kvtier_proxy_predicted_cached_tokens_total{url}   prompt tokens the proxy expected the
kvtier_proxy_reported_cached_tokens_total{url}    engine to hold, and those it reported it
                                                  did not compute (non-streamed answers
                                                  carrying kvtier's provenance): a wrong
                                                  index shows as the two drifting apart
kvtier_proxy_resent_requests_total{side="engine",cause}   requests sent to another engine
                                              before any byte of the answer reached the
                                              client: the engine ``broke`` off or ``stalled``
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.responses import Response

from kvtier.apps.proxy.event_stream import Mode
from kvtier.apps.proxy.metrics import resent_counter
from kvtier.apps.proxy.scoring import POLICIES

if TYPE_CHECKING:
    from kvtier.apps.proxy.fleet import FleetRouter

REASONS = ("prefix", "load", "round-robin", "no-index", "no-tokens", "retry")


class FleetMetrics:
    def __init__(self, router: FleetRouter) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.decisions = Counter(
            "kvtier_proxy_decisions", "Requests routed, by policy and why the engine was chosen.",
            ["policy", "reason"], registry=self.registry,
        )  # fmt: skip
        self.predicted = Counter(
            "kvtier_proxy_predicted_cached_tokens", "Prompt tokens the proxy expected the "
            "engine to hold (non-streamed answers).", ["url"], registry=self.registry,
        )  # fmt: skip
        self.reported = Counter(
            "kvtier_proxy_reported_cached_tokens", "Prompt tokens the engine reported it did "
            "not compute (kvtier's provenance, non-streamed answers).", ["url"],
            registry=self.registry,
        )  # fmt: skip
        for policy in POLICIES:
            for reason in REASONS:
                self.decisions.labels(policy=policy, reason=reason)
        for url in router.config.engines:
            self.predicted.labels(url=url)
            self.reported.labels(url=url)
        self.resent = resent_counter(self.registry, [router.pool.side])
        self.registry.register(_Fleet(router))

    def decided(self, policy: str, reason: str) -> None:
        self.decisions.labels(policy=policy, reason=reason).inc()

    def reported_by(self, url: str, predicted: int, reported: int | None) -> None:
        """A non-streamed answer of ``url``: ``reported`` None when it carried no provenance."""
        if reported is None:
            return
        self.predicted.labels(url=url).inc(predicted)
        self.reported.labels(url=url).inc(reported)

    def resend_of(self, side: str) -> Callable[[str], None]:
        """Counts a request of ``side`` sent to another engine, by cause (``resend.py``)."""
        return lambda cause: self.resent.labels(side=side, cause=cause).inc()

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _Fleet(Collector):
    def __init__(self, router: FleetRouter) -> None:
        self.router = router

    def collect(self) -> Iterator[GaugeMetricFamily]:
        router = self.router
        up = GaugeMetricFamily(
            "kvtier_proxy_engine_up", "1 while the engine is taken for requests (its /health "
            "passes).", labels=["side", "url"],
        )  # fmt: skip
        mode = GaugeMetricFamily(
            "kvtier_proxy_index_mode", "1 for the mode of the engine's index: exact, degraded, "
            "down.", labels=["url", "mode"],
        )  # fmt: skip
        for engine in router.pool.engines:
            up.add_metric(["engine", engine.url], 1.0 if router.pool.is_up(engine) else 0.0)
            now = router.placement.mode(engine.url)
            for each in Mode:
                mode.add_metric([engine.url, each.value], 1.0 if each is now else 0.0)
        yield up
        yield mode
        with router.placement.lock:
            blocks = len(router.placement.index)
        yield GaugeMetricFamily("kvtier_proxy_index_blocks", "Blocks some engine holds, in the "
                                "proxy's index.", value=blocks)  # fmt: skip
