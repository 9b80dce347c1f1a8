"""``kvtier bench redis --quick --ttft`` with the tiny model, run as a user's fresh shell runs it
(only PATH and HOME): engine A stores a prompt in Redis and serves it from its host tier, engine
B (another engine of the fleet) serves it from Redis, and the hit is verified by kvtier's
counters; the Markdown page says the TTFT ratio."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fresh_shell import run_kvtier

from kvtier.apps.bench.redis.ttft import MEASURES


def test_bench_redis_ttft_serves_the_prompt_from_redis(
    tiny_model: Path, tmp_path: Path, redis_server: Any
) -> None:
    run_kvtier("bench", "redis", "--quick", "--rounds", "1", "--url", redis_server.url, "--ttft",
            "--ttft-tokens", "512", "--ttft-repeats", "1", "--model", str(tiny_model),
            "--dtype", "float32", "--out", str(tmp_path), timeout=900)  # fmt: skip
    ttft = json.loads((tmp_path / "redis.json").read_text())["ttft"]
    for measure in MEASURES:
        assert ttft[f"{measure}_s"] > 0
    assert ttft["kvtier_redis_over_recompute"] > 0 and isinstance(ttft["goal_met"], bool)
    (check,) = ttft["checks"]
    assert check["full_chunks"] == 512 // 64
    assert check["redis_loaded_chunks"] >= 0.9 * check["full_chunks"]
    assert check["cpu_hit_chunks"] == check["bad_chunks"] == check["failed_loads"] == 0
    page = (tmp_path / "redis.md").read_text()
    assert "--ttft --ttft-tokens 512 --ttft-repeats 1" in page and "TTFT from Redis" in page
