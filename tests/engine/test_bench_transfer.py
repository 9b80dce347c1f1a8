"""``kvtier bench transfer --quick --ttft`` end to end with the tiny model, run as a user's fresh
shell runs it (only PATH and HOME): a prefill and a decode ``kvtier serve`` and ``kvtier proxy``
really run, each prompt's KV crosses by the peer, and the JSON, the PNG and the Markdown page
hold every part of the split and its ratio to the bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fresh_shell import run_kvtier

pytestmark = pytest.mark.engine

PARTS = ("prefill", "transfer", "step", "first", "own_first", "proxy", "proxy_prefill",
         "proxy_transfer", "proxy_decode_ttft", "proxy_decode_queue",
         "proxy_decode_forward")  # fmt: skip


def test_bench_transfer_ttft_writes_the_split_and_its_ratio(tmp_path: Path) -> None:
    done = run_kvtier("bench", "transfer", "--quick", "--ttft", "--out", str(tmp_path), timeout=900)

    document = json.loads((tmp_path / "transfer-ttft.json").read_text())
    assert (tmp_path / "transfer-ttft.png").stat().st_size > 0
    assert "prefill→decode 1024 tokens: through the proxy" in done.stdout
    (row,) = document["rows"]
    assert row["prompt_tokens"] == 1024
    assert all(row[f"{part}_s"] > 0 for part in PARTS)  # pulls happened: their seconds counted
    # B's ratio to its own bound: the proxy's Server-Timing gave its prefill
    (proxy,), (prefill,), (transfer,) = (row[f"{p}_samples"] for p in PARTS[5:8])
    assert prefill < proxy and transfer < proxy
    bound = prefill + transfer + 1.2 * row["step_samples"][0]
    assert row["bound_s"] == pytest.approx(bound)
    assert row["ratio"] == pytest.approx(proxy / bound)
    assert row["ideal_ratio"] == pytest.approx(proxy / (prefill + row["own_first_s"]))
    assert isinstance(row["passes"], bool)
    # B on the decode engine: queued for its pull and more; vLLM's TTFT there holds its queue and
    # its forward, and is part of the time through the proxy
    (ttft,), (queue,), (forward,) = (row[f"{p}_samples"] for p in PARTS[8:])
    assert transfer < queue and queue + forward <= ttft < proxy - prefill
    assert row["wait_after_pull_s"] == pytest.approx(queue - transfer)
    assert row["hops_s"] == pytest.approx(proxy - prefill - ttft)
    assert row["forward_steps"] == pytest.approx(forward / row["step_samples"][0])
    page = (tmp_path / "transfer-ttft.md").read_text()
    assert "`kvtier bench transfer --ttft --quick`" in page and "| 1024 |" in page
    assert (tmp_path / "transfer.md").exists()  # the pulls, before the split
