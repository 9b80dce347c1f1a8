"""Writes that must land, land (issue 19): what one engine computed reaches Redis for the next
engine, whether the first one is shut down at once or Redis loses everything under it.

In-process engines, one at a time, on real redis-servers (``redis_fixtures.py``); engine B is
always a new engine with an empty host tier, so every chunk it is served came from Redis.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from harness import (
    connector,
    engine,
    full_chunks,
    generate,
    greedy,
    kvtier_transfer,
    prompts,
    settle,
)
from test_redis import LENGTHS, redis_extra

import kvtier

logger = logging.getLogger(__name__)

CHUNK = 64  # tokens per chunk (redis_extra's block_size)
ONE_BY_ONE = list(range(260, 320, 4))  # 15 prompts of 4 full chunks (and a tail): a 256-token
# hit each, worth an asynchronous load (min_async_load_tokens)
REWRITE_S = 10.0  # the bound on writing the hot chunks again once Redis came back empty


@pytest.mark.parametrize("cpu", ["256KiB", "256MiB"], ids=["host-4-chunks", "host-256MiB"])
def test_a_next_engine_finds_in_redis_what_an_engine_shut_down_at_once_computed(
    tiny_model: Path, reference: Any, redis_server: Any, cpu: str
) -> None:
    """Engine A answers 15 prompts one after the other, one token each (its last chunks are
    still dirty or being written when it stops), and is shut down at once: no settle, no idle
    step. Its shutdown writes what Redis lacks. A 4-chunk host tier evicts every prompt's
    chunks for the next prompt's. Engine B is then served >= 95 % of the full chunks."""
    token_prompts = prompts(tiny_model, ONE_BY_ONE, seed=61)
    one = greedy(1)
    expected = _expected(reference, tiny_model, token_prompts, max_tokens=1)
    extra = redis_extra(redis_server.url, cpu=cpu, prefix=f"drain-{time.monotonic_ns()}")
    transfer = kvtier_transfer(**extra)
    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        assert [generate(llm, [prompt], one)[0] for prompt in token_prompts] == expected
        written = kvtier.stats(llm).tiers["redis"]
    assert written.lost == {}

    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        assert generate(llm, token_prompts, one) == expected
        served = kvtier.stats(llm).tiers["redis"]
    wanted = full_chunks(token_prompts, CHUNK)
    assert served.hit_chunks >= 0.95 * wanted, (served, wanted)
    assert served.loaded_chunks == served.hit_chunks
    assert served.bad_chunks == served.failed_loads == 0


def test_chunks_a_restarted_redis_lost_are_written_again_under_traffic(
    tiny_model: Path, reference: Any, fresh_redis: Any
) -> None:
    """Redis restarted empty under engine D, whose host tier holds the prompts: within
    REWRITE_S of D's steady traffic the hot chunks are in Redis again, and a new engine E is
    served >= 90 % of them. D's shutdown writes nothing (``shutdown_flush_s`` 0), so all E
    finds is what the rewrite put there."""
    token_prompts = prompts(tiny_model, LENGTHS, seed=62)
    expected = _expected(reference, tiny_model, token_prompts)
    extra = {**redis_extra(fresh_redis.url), "shutdown_flush_s": 0}
    transfer = kvtier_transfer(**extra)
    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        hot = _names(fresh_redis.client())
        assert len(hot) >= full_chunks(token_prompts, CHUNK)

        fresh_redis.restart()
        client, started = fresh_redis.client(), time.monotonic()
        while client.exists(*hot) < len(hot):  # steady traffic until all are back
            assert time.monotonic() - started < REWRITE_S, (len(hot), client.dbsize())
            assert generate(llm, token_prompts) == expected
        logger.info("hot chunks in Redis again %.2f s after its restart",
                    time.monotonic() - started)  # fmt: skip
        assert kvtier.stats(llm).tiers["redis"].lost == {}
        connector(llm).scheduler.check_integrity()

    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        assert generate(llm, token_prompts) == expected
        served = kvtier.stats(llm).tiers["redis"]
    assert served.hit_chunks >= 0.9 * full_chunks(token_prompts, CHUNK), served
    assert served.bad_chunks == served.failed_loads == 0


def _expected(
    reference: Any, model: Path, token_prompts: list[list[int]], max_tokens: int = 8
) -> list[list[int]]:
    """``token_prompts``' outputs from the engine without kvtier; the module's other set too,
    from the same engine (one engine start instead of two)."""
    sets = [(token_prompts, max_tokens), (prompts(model, ONE_BY_ONE, seed=61), 1),
            (prompts(model, LENGTHS, seed=62), 8)]  # fmt: skip
    outputs: list[list[list[int]]] = reference.many(model, sets)
    return outputs[0]


def _names(client: redis.Redis) -> list[bytes]:
    """Every key in Redis (the test's own server holds only this engine's chunks)."""
    return list(client.scan_iter(count=1000))
