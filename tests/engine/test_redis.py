"""The Redis tier in real vLLM (CPU): one engine's prefixes are every engine's hits, on one Redis
or a 3-master Redis Cluster; a Redis that dies costs misses, never wrong KV, a hang or a restart.

Engines that share a Redis run in new processes (``disk_job.py``: any tier config); the fault
cases run in this process, one engine each, against a Redis of their own.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
from disk_helpers import finish_job, run_job, start_job
from harness import connector, engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier

CHUNK = 64  # tokens per chunk: two engine blocks of 32
LENGTHS = [300, 500, 450, 700, 333, 640]  # each worth a step: a load of >= 256 tokens
TIMEOUT_S = 0.5  # the tests of a dead Redis: it must cost a request little
# every other test (no fault stalls Redis): a round trip slowed by a loaded machine (the other
# test worker's engines on both cores) must not trip the circuit breaker and turn chunks into
# misses
SERVED_TIMEOUT_S = 5.0


def redis_extra(url: str, cpu: str = "64MiB", **redis: Any) -> dict[str, Any]:
    """kvtier's extra config with a Redis tier (no disk tier); ``timeout_s`` SERVED_TIMEOUT_S
    unless given; a connector reset empties the host tier only."""
    return {
        "cpu_bytes_to_use": cpu,
        "block_size": CHUNK,
        "redis": {"url": url, "timeout_s": SERVED_TIMEOUT_S, **redis},
        "reset_keeps_tiers": True,  # a connector reset empties host memory: hits are Redis's
    }


def _expected(reference: Any, model: Path, token_prompts: list[list[int]]) -> list[list[int]]:
    """``token_prompts``' outputs from the engine without kvtier; the module's other sets of the
    tiny model too, from the same engine (one engine start instead of seven)."""
    sets = [(p, 8) for p in (token_prompts, *_compared(model))]
    outputs: list[list[list[int]]] = reference.many(model, sets)
    return outputs[0]


def _compared(model: Path) -> list[list[list[int]]]:
    """Every set of tiny-model prompts this module's tests compare with the engine alone."""
    seeds = (21, 22, 31, 32, 33, 51)
    return [prompts(model, LENGTHS, seed=s) for s in seeds] + [prompts(model, [300], seed=5)]


def _served(stats: dict[str, Any]) -> int:
    return int(stats["tiers"]["redis"]["hit_chunks"])


def test_a_second_engine_process_is_served_from_redis(
    tiny_model: Path, reference: Any, tmp_path: Path, store_server: Any
) -> None:
    """The same on redis-server and on valkey-server: Valkey works unchanged."""
    token_prompts = prompts(tiny_model, LENGTHS, seed=21)
    expected = _expected(reference, tiny_model, token_prompts)
    extra = redis_extra(store_server.url, prefix=f"two-{time.monotonic_ns()}")
    a = run_job(tmp_path, "a", tiny_model, token_prompts, extra)
    assert a["outputs"] == [expected]
    wanted = full_chunks(token_prompts, CHUNK)
    assert a["stats"]["tiers"]["redis"]["stored_chunks"] >= wanted
    b = run_job(tmp_path, "b", tiny_model, token_prompts, extra)
    assert b["outputs"] == [expected]
    redis = b["stats"]["tiers"]["redis"]
    told = (a["stats"]["tiers"]["redis"], redis)  # what A wrote, what B found
    assert redis["hit_chunks"] >= 0.9 * wanted and redis["loaded_chunks"] >= 0.9 * wanted, told
    assert redis["bad_chunks"] == redis["failed_loads"] == 0, told
    assert b["stats"]["tiers"]["cpu"]["hit_chunks"] == 0  # a new process: nothing in memory


def test_a_hybrid_models_two_groups_come_from_redis(
    hybrid_model: Path, reference: Any, tmp_path: Path, redis_server: Any
) -> None:
    """Sliding-window and full-attention groups (the window's chunks only), in a second
    process, from what the first stored; lengths where the window starts on a block edge too.
    No lookup holds a step for Redis's answer (``lookup_wait_s`` 0), as none is answered in time
    on a loaded machine: the window's chunks, asked about a step after the full group's, must be
    waited for, not taken for misses."""
    token_prompts = prompts(hybrid_model, [300, 319, 447, 500, 640], seed=23)
    expected = reference(hybrid_model, token_prompts)
    extra = redis_extra(redis_server.url, prefix=f"hybrid-{time.monotonic_ns()}", lookup_wait_s=0)
    a = run_job(tmp_path, "a", hybrid_model, token_prompts, extra)
    assert a["outputs"] == [expected]
    b = run_job(tmp_path, "b", hybrid_model, token_prompts, extra)
    assert b["outputs"] == [expected]
    redis = b["stats"]["tiers"]["redis"]
    told = (a["stats"]["tiers"]["redis"], redis)  # what A wrote, what B found
    assert redis["hit_chunks"] >= 0.9 * full_chunks(token_prompts, CHUNK), told
    assert redis["bad_chunks"] == redis["failed_loads"] == 0, told


def test_two_engines_share_a_redis_cluster(
    tiny_model: Path, reference: Any, tmp_path: Path, redis_cluster: Any
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=22)
    expected = _expected(reference, tiny_model, token_prompts)
    url, *seeds = redis_cluster.urls
    extra = redis_extra(url, cluster=True, seeds=seeds, prefix=f"cl-{time.monotonic_ns()}")
    a, b = (start_job(tmp_path, n, tiny_model, token_prompts, extra, rounds=2) for n in "ab")
    results = [finish_job(*a), finish_job(*b)]
    wanted = full_chunks(token_prompts, CHUNK)
    for result in results:
        assert result["outputs"] == [expected] * 2
        assert result["stats"]["tiers"]["redis"]["bad_chunks"] == 0
    c = run_job(tmp_path, "c", tiny_model, token_prompts, extra)
    assert c["outputs"] == [expected]
    assert _served(c["stats"]) >= 0.9 * wanted


def test_redis_killed_then_restarted_mid_run(
    tiny_model: Path, reference: Any, fresh_redis: Any
) -> None:
    """Killed: misses, outputs equal the reference, no request slower than the timeout allows;
    restarted on the same port: hits resume in the same engine."""
    first, second, third = (prompts(tiny_model, LENGTHS, seed=s) for s in (31, 32, 33))
    expected = {
        s: _expected(reference, tiny_model, p) for s, p in ((1, first), (2, second), (3, third))
    }
    transfer = kvtier_transfer(**redis_extra(fresh_redis.url, timeout_s=TIMEOUT_S))
    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        assert generate(llm, first) == expected[1]
        settle(llm)
        llm.reset_prefix_cache(reset_connector=True)  # loads must come from Redis now
        fresh_redis.kill()
        for prompt, want in zip(first, expected[1]):  # one by one: each request's latency
            started = time.monotonic()
            assert generate(llm, [prompt]) == [want]
            assert time.monotonic() - started < TIMEOUT_S + 2.0
        assert generate(llm, second) == expected[2]
        settle(llm)
        down = kvtier.stats(llm).tiers["redis"]
        assert down.miss_chunks > 0
        fresh_redis.restart()
        deadline = time.monotonic() + 60
        hits_before = down.hit_chunks
        while True:  # the circuit breaker lets a call through after its window
            assert generate(llm, third) == expected[3]
            settle(llm)
            llm.reset_prefix_cache(reset_connector=True)
            stats = kvtier.stats(llm).tiers["redis"]
            if stats.hit_chunks > hits_before:
                break
            assert time.monotonic() < deadline, f"no Redis hit after the restart: {stats}"
        connector(llm).scheduler.check_integrity()


def test_two_cache_salts_never_share_a_chunk(
    tiny_model: Path, reference: Any, redis_server: Any
) -> None:
    token_prompts = prompts(tiny_model, [300, 450], seed=41)
    extra = redis_extra(redis_server.url, prefix=f"salt-{time.monotonic_ns()}")
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**extra)) as llm:
        params = kvtier_greedy()

        def run(salt: str) -> list[list[int]]:
            requests = [{"prompt_token_ids": p, "cache_salt": salt} for p in token_prompts]
            outputs = llm.generate(requests, params, use_tqdm=False)  # type: ignore[arg-type]
            return [list(o.outputs[0].token_ids) for o in outputs]

        first = run("tenant-a")
        settle(llm)
        llm.reset_prefix_cache(reset_connector=True)
        assert run("tenant-b") == first
        settle(llm)
        assert kvtier.stats(llm).tiers["redis"].hit_chunks == 0  # another salt: no chunk shared
        llm.reset_prefix_cache(reset_connector=True)
        assert run("tenant-a") == first
        assert kvtier.stats(llm).tiers["redis"].hit_chunks >= full_chunks(token_prompts, CHUNK) - 2


def kvtier_greedy() -> Any:
    from harness import greedy

    return greedy()


def test_an_unreachable_redis_at_start_up_is_an_error_naming_the_setting(
    tiny_model: Path, tmp_path: Path
) -> None:
    # in a process of its own: vLLM fails to start
    extra = redis_extra("redis://127.0.0.1:1/0", timeout_s=TIMEOUT_S)
    with pytest.raises(AssertionError, match=r"kvtier: 'redis\.url'.*nothing listens"):
        run_job(tmp_path, "down", tiny_model, prompts(tiny_model, [300], seed=5), extra)


def test_an_unreachable_optional_redis_is_a_warning(tiny_model: Path, reference: Any) -> None:
    token_prompts = prompts(tiny_model, [300], seed=5)
    expected = _expected(reference, tiny_model, token_prompts)  # before: one engine at a time
    extra = redis_extra("redis://127.0.0.1:1/0", timeout_s=TIMEOUT_S, required=False)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**extra)) as llm:
        assert generate(llm, token_prompts) == expected
        assert "redis" not in kvtier.stats(llm).tiers


def test_corrupted_and_evicted_records_are_misses(
    tiny_model: Path, reference: Any, fresh_redis: Any
) -> None:
    """Garbage under every key: counted misses, deleted, recomputed and written again; then a
    Redis too small for the prompts (allkeys-lru evicting under load): misses, never errors."""
    token_prompts = prompts(tiny_model, LENGTHS, seed=51)
    expected = _expected(reference, tiny_model, token_prompts)
    client = fresh_redis.client()
    transfer = kvtier_transfer(**redis_extra(fresh_redis.url))
    with engine(tiny_model, kv_transfer_config=transfer) as llm:

        def again() -> Any:
            llm.reset_prefix_cache(reset_connector=True)
            assert generate(llm, token_prompts) == expected
            settle(llm)
            return copy.deepcopy(kvtier.stats(llm).tiers["redis"])

        assert generate(llm, token_prompts) == expected
        settle(llm)
        names = list(client.scan_iter(count=1000))
        assert len(names) >= full_chunks(token_prompts, CHUNK)
        for name in names:
            client.set(name, b"garbage " * 100)
        bad = again()
        assert bad.bad_chunks >= len(token_prompts) and bad.loaded_chunks == 0
        healed = again()  # the bad records were deleted, recomputed and written afresh
        assert healed.loaded_chunks >= 0.9 * full_chunks(token_prompts, CHUNK)
        assert healed.bad_chunks == bad.bad_chunks
        client.flushall()
        room = client.info("memory")["used_memory"] + (1 << 20)  # ~16 of the prompts' 43 chunks
        client.config_set("maxmemory", str(room))
        client.config_set("maxmemory-policy", "allkeys-lru")
        for _ in range(2):
            last = again()  # outputs equal the reference: evicted chunks are recomputed
        assert client.info("stats")["evicted_keys"] > 0, (last, client.info("memory"))
        connector(llm).scheduler.check_integrity()
