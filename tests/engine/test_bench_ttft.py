"""``kvtier bench ttft`` end to end on the tiny model: every configuration runs, the kvtier hits
are verified from kvtier's counters, and the JSON holds one row per prompt length."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.bench import ttft

ROW_KEYS = {
    "prompt_tokens", "recompute_s", "engine_hit_s", "kvtier_hit_s", "example_hit_s",
    "kvtier_over_engine_hit", "example_over_engine_hit", "kvtier_over_recompute",
    "kvtier_over_example", "kvtier_hit_verified", "kvtier_hit_chunks", "full_chunks",
}  # fmt: skip
THROUGHPUT_KEYS = {"baseline_tokens_per_s", "kvtier_tokens_per_s", "ratio", "ratios"}


def test_bench_ttft_writes_verified_rows(tiny_model: Path, tmp_path: Path) -> None:
    workload = ttft.Workload(prompts=2, tokens=128, max_tokens=2, rounds=1)
    ttft.run(tmp_path, lengths=(128, 256), repeats=1, model=tiny_model, dtype="float32",
             workload=workload)  # fmt: skip

    document = json.loads((tmp_path / "ttft-cpu.json").read_text())
    rows = document["rows"]
    assert [row["prompt_tokens"] for row in rows] == [128, 256]
    for row in rows:
        assert ROW_KEYS <= row.keys()
        assert row["kvtier_hit_verified"] is True
        assert row["full_chunks"] == row["prompt_tokens"] // ttft.CHUNK_TOKENS
        assert row["kvtier_hit_chunks"] >= 0.9 * row["full_chunks"]
        assert all(row[f"{m}_s"] > 0 for m in ttft.MEASURES)
    assert THROUGHPUT_KEYS <= document["throughput"].keys()
    assert len(document["throughput"]["ratios"]) == 1
    assert (tmp_path / "ttft-cpu.png").stat().st_size > 0
