"""``kvtier bench ttft`` end to end on the tiny model, its smallest sizes, run as a user's fresh
shell runs it (only PATH and HOME): the engines run side by side, every row is measured and
verified (kvtier hits from kvtier's counters), and the JSON holds the no-regret ratios with their
goals and verdicts, per length and for the throughput; the Markdown page says them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fresh_shell import run_kvtier

from kvtier.apps.bench.ttft.ratios import GOALS

ROW_KEYS = {
    "prompt_tokens", "aligned", "recompute_s", "engine_hit_s", "engine_hit_on_s", "kvtier_hit_s",
    "kvtier_miss_s", "engine_hit_on_over_off", "kvtier_over_engine_hit",
    "kvtier_miss_over_recompute", "kvtier_over_recompute", "kvtier_hit_verified",
    "kvtier_hit_chunks", "full_chunks", "loadable_chunks", "kvtier_hit_cached_tokens",
}  # fmt: skip
EXAMPLE_KEYS = {"example_hit_s", "example_over_engine_hit", "kvtier_over_example"}
BOUNDS = {"engine_hit_on_over_off": 1.1, "kvtier_over_engine_hit": 1.0, "throughput_ratio": 0.98}
VERDICT_KEYS = {"key", "label", "prompt_tokens", "ratio", "spread", "pairs", "goal", "pass"}


def test_bench_ttft_writes_verified_no_regret_rows(tiny_model: Path, tmp_path: Path) -> None:
    run_kvtier("bench", "ttft", "--lengths", "128", "--unaligned", "100", "--repeats", "2",
            "--model", str(tiny_model), "--dtype", "float32", "--chunk-tokens", "32",
            "--pairs", "2", "--max-pairs", "2", "--prompts", "2", "--prompt-tokens", "128",
            "--max-tokens", "2", "--out", str(tmp_path), timeout=900)  # fmt: skip

    document = json.loads((tmp_path / "ttft-cpu.json").read_text())
    assert document["chunk_tokens"] == 32
    rows = {row["prompt_tokens"]: row for row in document["rows"]}
    assert sorted(rows) == [100, 128]
    assert rows[128]["aligned"] and not rows[100]["aligned"]
    for row in rows.values():
        assert ROW_KEYS <= row.keys()
        assert row["kvtier_hit_verified"] is True
        assert row["loadable_chunks"] == (row["prompt_tokens"] - 1) // 32
        assert row["kvtier_hit_chunks"] >= 0.9 * row["loadable_chunks"]
        assert row["kvtier_hit_cached_tokens"] >= 0.9 * row["loadable_chunks"] * 32
        assert all(row[f"{m}_s"] > 0 for m in ("recompute", "engine_hit", "kvtier_hit"))
    assert EXAMPLE_KEYS <= rows[128].keys() and not EXAMPLE_KEYS & rows[100].keys()

    verdicts = {(v["key"], v["prompt_tokens"]): v for v in document["no_regret"]}
    wanted = {(key, n) for key in GOALS if key != "throughput_ratio" for n in rows}
    assert verdicts.keys() == wanted | {("throughput_ratio", None)}
    for v in verdicts.values():
        assert VERDICT_KEYS <= v.keys() and v["ratio"] > 0
        bound = BOUNDS[v["key"]]
        assert v["pass"] == (v["ratio"] >= bound if bound < 1 else v["ratio"] <= bound)
    assert document["all_pass"] == all(v["pass"] for v in verdicts.values())
    throughput = document["throughput"]
    assert throughput["pairs"] == 2 and len(throughput["ratios"]) == 2
    assert throughput["ratio"] == pytest.approx(
        verdicts["throughput_ratio", None]["ratio"], abs=1e-3
    )
    assert (tmp_path / "ttft-cpu.png").stat().st_size > 0
    page = (tmp_path / "ttft-cpu.md").read_text()
    assert "--lengths 128 --unaligned 100 --repeats 2" in page and "| kvtier hit / " in page
