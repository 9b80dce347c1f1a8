"""``kvtier bench redis``'s TTFT part with the tiny model: engine A stores a prompt in Redis and
serves it from its host tier, engine B (another engine of the fleet) serves it from Redis, and
the hit is verified by kvtier's counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.apps.bench import redis_ttft


def test_bench_redis_ttft_serves_the_prompt_from_redis(
    tiny_model: Path, tmp_path: Path, redis_server: Any
) -> None:
    ttft = redis_ttft.measure(tmp_path, redis_server.url, 512, 1, tiny_model, "float32")
    for measure in redis_ttft.MEASURES:
        assert ttft[f"{measure}_s"] > 0
    assert ttft["kvtier_redis_over_recompute"] > 0 and isinstance(ttft["goal_met"], bool)
    (check,) = ttft["checks"]
    assert check["full_chunks"] == 512 // 64
    assert check["redis_loaded_chunks"] >= 0.9 * check["full_chunks"]
    assert check["cpu_hit_chunks"] == check["bad_chunks"] == check["failed_loads"] == 0
