"""``kvtier proxy``: one OpenAI-compatible endpoint in front of prefill and decode engines.

A completion goes first to a prefill engine (one token; its KV kept for a remote decode), then,
with the ``kv_transfer_params`` the prefill answered, to a decode engine, whose answer is the
client's. Without a prefill engine up, or when it fails, the decode engine alone computes the
prompt (degraded, said in ``x-kvtier-prefill`` and on ``/metrics``). One file per part:

    config.py    ProxyConfig: engine URLs per side, time limits
    engine_url.py  a server's URL, or one of its data-parallel engines' (``#dp<rank>``)
    balancer.py  Engine, Pool: least requests in flight, round-robin ties, down engines skipped
    bodies.py    the request bodies each side gets
    upstream.py  Exchange: one request on one side, retried on another engine if it cannot connect
    stall.py     Watch: waiting for an answer's first byte, unless its engine dies or stalls
    resend.py    answered: a request sent again elsewhere while nothing reached the client
    hedge.py     Hedge: when a late first byte sends a request to a second engine too
    relay.py     an engine's answer to the client, streamed as it comes (once it began)
    errors.py    the answers the proxy gives itself (503 engines down, 502/504, 400)
    health.py    GET /health; the watch that skips engines whose /health fails or stalls
    prefill.py   the prefill hop, and the degraded outcomes (skipped, failed)
    metrics.py   GET /metrics
    router.py    Router: the two hops of a completion
    app.py       build_app, build_fleet_app: the FastAPI app
    cli.py       add_arguments, run: ``kvtier proxy``

``kvtier proxy --engine URL...`` fronts a fleet of ``kv_both`` engines instead, each request sent
where its prompt's KV already is:

    fleet.py          FleetRouter: tokenize (the engine's /tokenize), choose, relay
    kv_events.py      vLLM's KV event batches, decoded by field name
    event_sources.py  where an engine publishes its events (vLLM's /kv_event_sources)
    event_stream.py   one engine's events followed (subscription + replay), its index's mode
    prefix_index.py   which engine holds which prefix in which tier, keyed by the tokens
    prefix_runs.py    a prompt's leading loadable blocks per engine, in groups of engines alike
    scoring.py        the policies: kv-aware, least-loaded, round-robin
    fleet_metrics.py  GET /metrics of a fleet proxy
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtier.apps.proxy.app import build_app
    from kvtier.apps.proxy.config import ProxyConfig

__all__ = ["ProxyConfig", "build_app"]


def __getattr__(name: str) -> object:
    """Imported on first use: ``kvtier --help`` need not load FastAPI."""
    if name == "build_app":
        from kvtier.apps.proxy.app import build_app

        return build_app
    if name == "ProxyConfig":
        from kvtier.apps.proxy.config import ProxyConfig

        return ProxyConfig
    raise AttributeError(f"module 'kvtier.apps.proxy' has no attribute {name!r}")
