"""Weights changed inside a running engine (an RL trainer's weight sync), then the connector
reset as vLLM's ``pause_generation(clear_cache=True)`` does: no chunk computed before the reset
is loaded again, from any tier, and what the engine computes after it is.

The trainer's update is vLLM's own in-place reload of weights (``reload_weights``, as its RL
weight transfer loads them) from ``harness.retrained``'s checkpoint; the reference is an engine
that started from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disk_helpers import chunk_files, disk_extra
from harness import (
    connector,
    engine,
    generate,
    greedy,
    kvtier_transfer,
    prompts,
    retrained,
    settle,
)

import kvtier


def test_after_a_weight_update_and_a_reset_no_earlier_chunk_is_loaded(
    tiny_model: Path, tmp_path: Path
) -> None:
    prompt = prompts(tiny_model, [200, 260], seed=61)
    updated = retrained(tiny_model, tmp_path / "updated")
    with engine(updated) as llm:
        expected = generate(llm, prompt)
    tier = tmp_path / "tier"
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**disk_extra(tier))) as llm:
        before = generate(llm, prompt)
        settle(llm)
        written = len(chunk_files(tier))
        assert written == 7 and before != expected  # 3 + 4 chunks of the old weights on disk

        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(updated)})
        assert llm.reset_prefix_cache(reset_running_requests=True, reset_connector=True)
        after = generate(llm, prompt)
        settle(llm)
        assert llm.reset_prefix_cache()  # the engine's own cache: the next hits are kvtier's
        again = generate(llm, prompt)
        settle(llm)
        stats = kvtier.stats(llm)
    assert after == again == expected
    assert stats.tiers["disk"].loaded_chunks == 0
    assert stats.cpu.hit_chunks == 7  # the last round: what the new weights computed
    assert len(chunk_files(tier)) == 2 * written  # the old chunks kept, beside the new ones


def test_a_reset_after_every_step_changes_no_output(
    tiny_model: Path, tmp_path: Path, reference: Any
) -> None:
    """Resets while loads, stores and writes are in flight: each renames the keys under the
    requests alive, whose chunks are then named apart (and told to a router as they are
    stored); what they compute is still right."""
    token_prompts = prompts(tiny_model, [200, 260, 330], seed=62)
    expected = reference(tiny_model, token_prompts)
    transfer = kvtier_transfer(**disk_extra(tmp_path))
    events = {"enable_kv_cache_events": True, "publisher": "null"}
    with engine(tiny_model, kv_transfer_config=transfer, kv_events_config=events) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        assert llm.reset_prefix_cache()  # the engine's own: the next pass starts from kvtier
        core, outputs = llm.llm_engine, {}
        for i, prompt in enumerate(token_prompts):
            core.add_request(f"r{i}", {"prompt_token_ids": prompt}, greedy())
        while core.has_unfinished_requests():
            outputs |= {out.request_id: list(out.outputs[0].token_ids)
                        for out in core.step() if out.finished}  # fmt: skip
            core.reset_prefix_cache(reset_connector=True)
        settle(llm)
        connector(llm).scheduler.check_integrity()
        stats = kvtier.stats(llm)
    assert [outputs[f"r{i}"] for i in range(3)] == expected
    assert stats.cpu.hit_chunks > 0  # found before the first reset: loads ran across resets
