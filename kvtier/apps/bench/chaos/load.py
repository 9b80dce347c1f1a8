"""The chaos run's load: an open loop at a steady rate, a bound on the requests in flight.

    drive(workload, urls, settings, clock) -> Driven   every request until the run's time is up

A request is due every ``1 / settings.rate`` seconds on ``clock`` (the run's) until
``settings.duration_s``; when ``settings.in_flight`` are unanswered, the due one waits for a
slot (counted in ``held``). Each request opens a connection of its own (no keep-alive), so that
a refused connection is the proxy's refusal, never a stale pooled one. Every request ends within
its timeout (``client.send``); the loop returns when the last has ended. A line of progress is
printed every thirtieth of the run (10 s at least): time, sent, answered, failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NamedTuple

import httpx

from kvtier.apps.bench.chaos.client import Record, send
from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.chaos.workload import Ask, Workload


class Driven(NamedTuple):
    asks: dict[int, Ask]  # by id
    records: list[Record]  # in the order they ended
    held: int  # requests that waited for a slot


async def drive(
    workload: Workload, urls: dict[str, str], settings: ChaosSettings, clock: Callable[[], float]
) -> Driven:
    """``urls``: the proxy of each target ("fleet", "pd")."""
    asks: dict[int, Ask] = {}
    records: list[Record] = []
    slots = asyncio.Semaphore(settings.in_flight)
    tasks: set[asyncio.Task[None]] = set()
    held = 0
    limits = httpx.Limits(max_keepalive_connections=0)

    async def one(client: httpx.AsyncClient, ask: Ask) -> None:
        try:
            record = await send(client, urls[ask.target], ask, settings.max_tokens,
                                settings.timeout_s, clock)  # fmt: skip
            workload.answered(ask, record.tokens if record.ok else None)
            records.append(record)
        finally:
            slots.release()

    every = max(10.0, settings.duration_s / 30)
    told = every

    async with httpx.AsyncClient(timeout=None, limits=limits, trust_env=False) as client:
        due = clock()
        while due < settings.duration_s:
            if due >= told:
                told += every
                _progress(due, settings.duration_s, len(asks), records)
            await asyncio.sleep(max(0.0, due - clock()))
            if slots.locked():
                held += 1
            await slots.acquire()
            ask = workload.next()
            asks[ask.id] = ask
            task = asyncio.create_task(one(client, ask))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            due += 1.0 / settings.rate
        await asyncio.gather(*tasks)
    return Driven(asks, records, held)


def _progress(at: float, total: float, sent: int, records: list[Record]) -> None:
    failed = sum(not r.ok for r in records)
    print(f"kvtier bench chaos: {at / 60:.1f} of {total / 60:g} min: {sent} sent, "
          f"{len(records) - failed} answered, {failed} failed", flush=True)  # fmt: skip
