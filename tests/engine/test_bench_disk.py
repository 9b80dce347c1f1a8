"""``kvtier bench disk`` end to end with tiny sizes and the tiny model, run as a user's fresh shell
runs it (only PATH and HOME): every part runs, the hits from disk are verified (kvtier's
counters, ExampleConnector's files read back), and the JSON, the PNG and the Markdown page hold
every ratio."""

from __future__ import annotations

import json
from pathlib import Path

from fresh_shell import run_kvtier

RATIOS = {
    "store", "cold_load", "warm_load",
    "kvtier_disk_over_recompute", "example_over_recompute", "kvtier_disk_over_example",
}  # fmt: skip


def test_bench_disk_writes_verified_ratios(tiny_model: Path, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    run_kvtier("bench", "disk", "--dir", str(work), "--chunks", "4", "--layers", "2", "--rounds",
            "1", "--tokens", "256", "--repeats", "1", "--model", str(tiny_model), "--dtype",
            "float32", "--device", "cpu", "--out", str(out), timeout=900)  # fmt: skip

    document = json.loads((out / "disk-cpu.json").read_text())
    rows = {row["key"]: row for row in document["rows"]}
    assert rows.keys() == RATIOS
    assert all(row["ratio"] > 0 for row in rows.values())
    assert rows["cold_load"]["goal"] == ">= 0.7" and isinstance(rows["cold_load"]["pass"], bool)
    assert isinstance(rows["kvtier_disk_over_example"]["pass"], bool)
    throughput, ttft = document["throughput"], document["ttft"]
    assert throughput["chunks"] == 4 and throughput["resident_after_drop"] < 0.05
    assert ttft["kvtier_disk_verified"] is True and ttft["example_verified"] is True
    (check,) = ttft["checks"]["kvtier_disk"]
    assert check["disk_loaded_chunks"] >= 0.9 * check["full_chunks"] == 0.9 * 4
    assert check["cpu_hit_chunks"] == check["bad_chunks"] == 0
    assert check["resident_before"] < 0.05
    assert ttft["checks"]["example"][0]["folders_read"] == 1
    assert (out / "disk-cpu.png").stat().st_size > 0
    assert list(work.iterdir()) == []  # the working directory was removed
    page = (out / "disk-cpu.md").read_text()
    assert "--chunks 4 --layers 2 --rounds 1 --tokens 256" in page and "| cold load / " in page
