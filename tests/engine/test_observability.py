"""What kvtier tells vLLM in real vLLM (in-process, CPU): provenance, stats payloads, reset.

Each prompt is generated, the engine's own prefix cache emptied, and generated again: the second
pass comes from kvtier, and every completion's ``kv_transfer_params`` says from where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import connector, engine, greedy, kvtier_transfer, prompts, settle

import kvtier
from kvtier.vllm.stats import Payload, merge

LENGTHS = [100, 250, 450]
CHUNK = 64


def _provenance(llm: Any, token_prompts: list[list[int]]) -> list[dict[str, Any]]:
    requests: list[Any] = [{"prompt_token_ids": p} for p in token_prompts]
    outputs = llm.generate(requests, greedy(4), use_tqdm=False)
    return [o.kv_transfer_params["kvtier"] for o in outputs]


def _accounted(found: dict[str, Any]) -> int:
    tiers = found.get("cpu", 0) + found.get("disk", 0)
    return int(found["engine_cached_tokens"] + tiers + found["computed"])


def test_provenance_counts_every_prompt_token_once(tiny_model: Path) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=21)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=CHUNK)) as llm:
        first = _provenance(llm, token_prompts)
        settle(llm)
        assert [f["computed"] for f in first] == LENGTHS  # nothing to reuse yet
        assert all(f["cpu"] == 0 and f["load_ms"] == 0 for f in first)
        again = _provenance(llm, token_prompts)  # the engine's own cache holds them now
        settle(llm)
        assert [f["engine_cached_tokens"] for f in again] == [96, 224, 448]  # whole blocks
        llm.reset_prefix_cache()
        loaded = _provenance(llm, token_prompts)
        settle(llm)
        assert not connector(llm).scheduler.requests  # provenance keeps nothing alive
        assert len(connector(llm).scheduler.job_log) == 0
    # at least the whole chunks (a prompt's tail may come from host memory too)
    assert all(f["cpu"] >= tokens for f, tokens in zip(loaded, [64, 192, 448])), loaded
    assert all(f["computed"] >= 1 for f in loaded)  # the last token, to sample the next
    assert all(f["engine_cached_tokens"] == 0 and f["failed_tokens"] == 0 for f in loaded)
    assert all(f["load_ms"] > 0 for f in loaded)
    for found, length in zip(first + again + loaded, LENGTHS * 3):
        assert found["prompt_tokens"] == length == _accounted(found)


def test_stats_payloads_add_up_to_the_totals(tiny_model: Path) -> None:
    """vLLM takes a payload after every step; summed, they are kvtier's running totals."""
    # one token past whole chunks: the hit is whole chunks, no prompt tail is loaded
    token_prompts = prompts(tiny_model, [65, 193, 449], seed=22)
    payloads: list[Payload] = []
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=CHUNK)) as llm:
        kv = connector(llm)
        take = kv.get_kv_connector_stats

        def recorded() -> Any:
            stats = take()
            if stats is not None:
                payloads.append(stats.data)
            return stats

        kv.get_kv_connector_stats = recorded  # type: ignore[method-assign]
        _provenance(llm, token_prompts)
        settle(llm)
        llm.reset_prefix_cache()
        _provenance(llm, token_prompts)
        settle(llm)
        totals = kvtier.stats(llm)
    assert len(payloads) >= 2  # one per pass at least: the sum must be of several payloads
    summed: Payload = {}
    for payload in payloads:
        summed = merge(summed, payload) if summed else payload
    cpu = summed["tiers"]["cpu"]
    for name in ("hit_chunks", "miss_chunks", "loaded_chunks", "loaded_bytes", "stored_chunks"):
        assert cpu[name] == getattr(totals.cpu, name), name
    assert cpu["hit_chunks"] == 1 + 3 + 7
    assert summed["lookups"] == totals.lookups
    assert len(summed["load_seconds"]["cpu"]) == 3  # one load job per prompt
    assert summed["used_bytes"]["cpu"] > 0
    assert summed["chunk_tokens"] == CHUNK


def test_a_connector_reset_that_keeps_the_tiers_empties_the_host_tier_and_keeps_the_disk(
    tiny_model: Path, tmp_path: Path
) -> None:
    token_prompts = prompts(tiny_model, [450], seed=23)
    disk = {"path": str(tmp_path / "tier"), "bytes": "64MiB"}
    extra = {"block_size": CHUNK, "disk": disk, "reset_keeps_tiers": True}
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**extra)) as llm:
        _provenance(llm, token_prompts)
        settle(llm)  # an idle engine writes its host chunks to disk
        scheduler = connector(llm).scheduler
        stored = len(scheduler.manager.stored())
        assert stored >= 7  # the prompt's chunks (and maybe its tail)
        assert llm.reset_prefix_cache()  # the engine's cache only: kvtier keeps its chunks
        assert len(scheduler.manager.stored()) == stored
        assert llm.reset_prefix_cache(reset_connector=True)
        assert scheduler.manager.stored() == {}
        scheduler.check_integrity()
        (found,) = _provenance(llm, token_prompts)
        settle(llm)
    assert (found["cpu"], found["disk"], found["computed"]) == (0, 448, 2)
