"""``kvtier bench transfer --quick``: a few seconds, JSON and PNG written, every method's bytes
checked, every ratio positive."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from kvtier.apps.bench.transfer import run as transfer


def test_quick_bench_writes_figures(tmp_path: Path) -> None:
    document = transfer.run(tmp_path, quick=True, console=Console(file=io.StringIO()))
    assert json.loads((tmp_path / "transfer.json").read_text()) == document
    assert (tmp_path / "transfer.png").stat().st_size > 10_000
    rows = document["rows"]
    methods = {row["method"] for row in rows}
    assert {"kvtier-1", "kvtier-2", "raw-1", "raw-2"} <= methods
    assert ("mooncake" in methods) == document["mooncake"]["available"]
    assert {row["chunk_tokens"] for row in rows} == set(transfer.CHUNK_TOKENS)
    assert all(row["ratio_min"] > 0 and row["gbps_min"] > 0 for row in rows)
    assert all(row["ratio_to_raw_stream"] == 1.0 for row in rows if row["method"] == "raw-1")
    assert document["verified"] and all(document["verified"].values())
