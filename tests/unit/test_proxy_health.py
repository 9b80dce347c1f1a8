"""``GET /health``: 200 while a decode engine answers its own (``degraded`` without a prefill
engine: the proxy still serves); else 503 naming them."""

from __future__ import annotations

from proxy_fakes import FakeEngine, closed_url, proxied, run, serving


def test_healthy_with_one_engine_up_on_each_side() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")

    async def scenario() -> None:
        with closed_url() as dead:
            async with serving(prefill.app, decode.app) as (p_url, d_url):
                async with proxied([p_url], [dead, d_url]) as (client, _):
                    answer = await client.get("/health")
            assert answer.status_code == 200
            assert answer.json() == {
                "status": "ok",
                "prefill": {p_url: "ok"},
                "decode": {dead: "connection refused", d_url: "ok"},
            }

    run(scenario())


def test_unhealthy_names_the_side_and_its_engines() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    prefill.health_status = 503

    async def scenario() -> None:
        with closed_url() as dead:
            async with serving(prefill.app, decode.app) as (p_url, d_url):
                async with proxied([p_url], [dead]) as (client, _):
                    answer = await client.get("/health")
            assert answer.status_code == 503
            assert answer.json() == {
                "status": "unavailable",
                "prefill": {p_url: "HTTP 503"},
                "decode": {dead: "connection refused"},
                "error": f"prefill engine(s) down: {p_url} (HTTP 503); "
                f"decode engine(s) down: {dead} (connection refused)",
            }

    run(scenario())


def test_degraded_without_a_prefill_engine_but_still_up() -> None:
    prefill, decode = FakeEngine("p"), FakeEngine("d")
    prefill.health_status = 503

    async def scenario() -> None:
        async with serving(prefill.app, decode.app) as (p_url, d_url):
            async with proxied([p_url], [d_url]) as (client, _):
                answer = await client.get("/health")
            assert answer.status_code == 200
            assert answer.json() == {
                "status": "degraded",
                "prefill": {p_url: "HTTP 503"},
                "decode": {d_url: "ok"},
                "error": f"prefill engine(s) down: {p_url} (HTTP 503)",
            }

    run(scenario())
