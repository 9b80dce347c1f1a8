"""A disk tier whose every file was damaged heals in one pass (issue 9, item 4).

The first engine over the damaged tier finds every chunk bad: each failed load names all of its
bad chunks at once, the scheduler drops them all, the engine recomputes them, and the recomputed
chunks reach the disk again. A restarted engine (nothing in host memory) is then served from disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disk_helpers import CHUNK, bad_files, chunk_files, disk_extra, flip_payload_byte
from harness import connector, engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier

# each prompt's hit is worth a load that makes it wait (min_async_load_tokens: 256), and the 7
# generated tokens whose KV is computed never fill one more chunk, so every file on disk belongs
# to a prompt chunk: after the healing pass none may be left damaged
LENGTHS = [330, 400, 500, 340, 450, 370]


def test_a_tier_with_every_file_damaged_is_whole_after_one_pass(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=11)
    expected = reference(tiny_model, token_prompts)
    wanted = full_chunks(token_prompts, CHUNK)
    tier = tmp_path / "tier"
    transfer = kvtier_transfer(**disk_extra(tier))
    with engine(tiny_model, kv_transfer_config=transfer) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)  # an idle engine writes its host chunks to disk
    files = chunk_files(tier)
    assert len(files) == wanted
    for path in files:
        flip_payload_byte(path)
    assert len(bad_files(tier)) == wanted

    with engine(tiny_model, kv_transfer_config=transfer) as llm:  # pass 1: all bad
        assert generate(llm, token_prompts) == expected
        settle(llm)
        disk = kvtier.stats(llm).tiers["disk"]
        assert disk.bad_chunks == wanted  # every chunk of every failed load, at once
        assert disk.failed_loads == len(token_prompts)
        assert disk.loaded_chunks == 0
        connector(llm).scheduler.check_integrity()
    assert bad_files(tier) == []  # each damaged file was removed and written afresh
    assert len(chunk_files(tier)) == wanted

    with engine(tiny_model, kv_transfer_config=transfer) as llm:  # pass 2: served from disk
        assert generate(llm, token_prompts) == expected
        settle(llm)
        stats = kvtier.stats(llm)
        disk = stats.tiers["disk"]
        assert stats.cpu.hit_chunks == 0  # a new engine: nothing in host memory
        assert disk.bad_chunks == disk.failed_loads == 0
        assert disk.loaded_chunks >= 0.9 * wanted, (disk.loaded_chunks, wanted)
        connector(llm).scheduler.check_integrity()
