"""``kvtier bench redis --quick`` against a real redis-server: every row and ratio, and the PNG.

The session's ``redis_server`` (``tests/redis_fixtures.py``): skipped when ``redis-server`` is
not on PATH, unless ``KVTIER_TEST_REQUIRE_REDIS=1`` (then it fails).
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from kvtier.apps.bench.common.redis_server import RedisServer
from kvtier.apps.bench.redis import run as redis_bench
from kvtier.apps.bench.redis.report import GOALS, RATIOS
from kvtier.apps.bench.redis.rig import PREFIX


def test_quick_bench_writes_every_row_ratio_and_the_figure(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_bench.run(tmp_path, quick=True, rounds=2, url=redis_server.url,
                    console=Console(quiet=True))  # fmt: skip

    document = json.loads((tmp_path / "redis.json").read_text())
    assert document["benchmark"] == "redis"
    assert document["hiredis"] is True
    rows = {(row["chunk_tokens"], row["key"]): row for row in document["rows"]}
    assert set(rows) == {(tokens, key) for tokens in (16, 64, 256) for key in RATIOS}
    for (_, key), row in rows.items():
        assert len(row["ratios"]) == 2
        assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
        assert row["kvtier_mib_s"] > 0 and row["bound_mib_s"] > 0
        assert row["pass"] is (None if key not in GOALS else row["ratio"] >= GOALS[key])
    sizes = {size["chunk_tokens"]: size for size in document["sizes"]}
    assert sizes[16]["engine_block_tokens"] == 16 and sizes[16]["chunk_bytes"] == 256 << 10
    assert sizes[256]["engine_block_tokens"] == 32 and sizes[256]["chunk_bytes"] == 4 << 20
    assert (tmp_path / "redis.png").stat().st_size > 0
    assert not redis_server.client().keys(f"{PREFIX}:*")  # the bench cleaned up


def test_the_report_names_the_server_it_ran_on(store_server: RedisServer) -> None:
    info = store_server.client().info("server")
    name = redis_bench._server_name(info)
    assert name.split() == [store_server.kind, info[f"{store_server.kind}_version"]]
