"""32 requests at once over 2 prefill and 2 decode engines: all answered, split 16 / 16."""

from __future__ import annotations

import asyncio
from collections import Counter

from proxy_fakes import WAIT_S, FakeEngine, proxied, run, serving

REQUESTS = 32


class Gate:
    """Holds every request an engine of one side gets until ``count`` have arrived on the side:
    all are in flight at once, so the split is the balancer's alone."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.arrived = 0
        self.open = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived == self.count:
            self.open.set()
        await asyncio.wait_for(self.open.wait(), WAIT_S)


def test_concurrent_requests_are_balanced_over_each_sides_engines() -> None:
    prefills = [FakeEngine("p0"), FakeEngine("p1")]
    decodes = [FakeEngine("d0"), FakeEngine("d1")]

    async def scenario() -> None:
        for side in (prefills, decodes):
            gate = Gate(REQUESTS)
            for engine in side:
                engine.before_answer = gate.wait
        async with serving(*(engine.app for engine in prefills + decodes)) as urls:
            async with proxied(urls[:2], urls[2:]) as (client, router):
                answers = await asyncio.gather(
                    *(
                        client.post("/v1/completions", json={"prompt": f"{i}", "max_tokens": 2})
                        for i in range(REQUESTS)
                    )
                )
                in_flight = [e.in_flight for e in router.prefill.engines + router.decode.engines]
        assert [answer.status_code for answer in answers] == [200] * REQUESTS
        assert [len(engine.received) for engine in prefills + decodes] == [16, 16, 16, 16]
        assert in_flight == [0, 0, 0, 0]
        # each decode got the offer of the prefill that served its request
        offers = Counter(
            r.body["kv_transfer_params"]["remote_engine_id"] for d in decodes for r in d.received
        )
        assert offers == {"p0": 16, "p1": 16}

    run(scenario())
