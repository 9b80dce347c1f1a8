"""The disk tier at its limits in real vLLM (CPU): its byte budget, and a disk that fills up."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from disk_helpers import CHUNK, chunk_files, disk_extra, tier_bytes
from harness import connector, engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier
from kvtier.tiers.base import chunk_format as disk_format

LENGTHS = [100, 250, 300, 500, 129, 450]


def _expected(reference: Any, model: Path, token_prompts: list[list[int]]) -> list[list[int]]:
    """``token_prompts``' outputs from the engine without kvtier; the module's other set too,
    from the same engine (one engine start instead of two)."""
    others = [prompts(model, [*LENGTHS, 200], seed=11), prompts(model, LENGTHS, seed=12)]
    sets = [(p, 8) for p in (token_prompts, *others)]
    outputs: list[list[list[int]]] = reference.many(model, sets)
    return outputs[0]


def test_directory_stays_within_budget_and_keeps_the_recent(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    token_prompts = prompts(tiny_model, [*LENGTHS, 200], seed=11)
    expected = _expected(reference, tiny_model, token_prompts)
    tier = tmp_path / "tier"
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**disk_extra(tier))) as llm:
        generate(llm, token_prompts[:1])
        settle(llm)
        one_chunk = max(f.stat().st_size for f in chunk_files(tier))
    budget = 6 * one_chunk
    tier_files: list[set[Path]] = []
    extra = disk_extra(tmp_path / "small", cpu="256KiB", bytes=budget)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**extra)) as llm:
        for prompt, want in zip(token_prompts, expected):
            assert generate(llm, [prompt]) == [want]
            settle(llm)
            assert tier_bytes(tmp_path / "small") <= budget + one_chunk
            tier_files.append(chunk_files(tmp_path / "small"))
        assert kvtier.stats(llm).tiers["disk"].evicted_chunks > 0
        connector(llm).scheduler.check_integrity()
    last, before_last = tier_files[-1], tier_files[-2]
    newest = last - before_last
    assert len(newest) == 200 // CHUNK  # the last prompt's chunks are all there
    assert not (tier_files[0] & last)  # the first prompt's were evicted first


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 1 MiB tmpfs (about 14 chunk files) where mounting is allowed; else an injected ENOSPC
    once 1 MiB was written through kvtier's file writer."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    ).returncode == 0  # fmt: skip
    if not mounted:
        written = 0
        real = disk_format._write_all

        def write_all(fd: int, buffers: list[memoryview]) -> None:
            nonlocal written
            written += sum(len(b) for b in buffers)
            if written > 2**20:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            real(fd, buffers)

        monkeypatch.setattr(disk_format, "_write_all", write_all)
    try:
        yield mount
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=True)


def test_full_disk_skips_stores_and_still_serves_loads(
    tiny_model: Path, reference: Any, small_disk: Path
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=12)
    expected = _expected(reference, tiny_model, token_prompts)
    # a host tier of ~15 chunks: the first prompts' chunks are evicted from it, and only the
    # disk (which took the first ~14 chunks before it filled up) still holds them
    extra = disk_extra(small_disk / "tier", cpu="1MiB", bytes="64MiB", write_through=True)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**extra)) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        disk = kvtier.stats(llm).tiers["disk"]
        assert disk.failed_stores > 0  # the disk filled up: those stores were skipped
        assert 0 < disk.stored_chunks < full_chunks(token_prompts, CHUNK)
        written = disk.stored_chunks
        llm.reset_prefix_cache()
        assert generate(llm, token_prompts) == expected
        settle(llm)
        disk = kvtier.stats(llm).tiers["disk"]
        assert disk.loaded_chunks > 0  # what did fit is still served
        assert disk.bad_chunks == disk.failed_loads == 0
        assert disk.stored_chunks >= written
        connector(llm).scheduler.check_integrity()
