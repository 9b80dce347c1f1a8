"""The disk tier in real vLLM (CPU): KV survives a restart, is shared, and is never served wrong.

Engines run in new processes (``disk_job.py``) where the test is about processes (a restart, two
engines on one directory, an engine without the right to read the directory); the fault cases
run in this process, one engine each, over a copy of a directory an earlier engine filled.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from disk_helpers import (
    CHUNK,
    bad_files,
    chunk_files,
    copy_tier,
    disk_extra,
    finish_job,
    flip_payload_byte,
    run_job,
    start_job,
    swap_names,
    truncate,
)
from harness import connector, engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier
from kvtier.tiers.base.chunk_format import read_header, write_chunk

LENGTHS = [100, 250, 300, 500, 129, 450]


def _expected(reference: Any, model: Path, token_prompts: list[list[int]]) -> list[list[int]]:
    """``token_prompts``' outputs from the engine without kvtier; the module's other sets too,
    from the same engine (one engine start instead of four)."""
    sets = [(p, 8) for p in (token_prompts, *_compared(model))]
    outputs: list[list[list[int]]] = reference.many(model, sets)
    return outputs[0]


def _compared(model: Path) -> list[list[list[int]]]:
    """Every prompt set this module's tests compare with the engine alone."""
    shared = prompts(model, LENGTHS[:3], seed=3)
    mine = [shared + prompts(model, LENGTHS[3:], seed=4 + i) for i in range(2)]
    return [prompts(model, LENGTHS), *mine, prompts(model, LENGTHS, seed=9)]


def test_restart_loads_from_disk_in_a_new_process(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS)
    expected = _expected(reference, tiny_model, token_prompts)
    tier = tmp_path / "tier"
    # A exits right after generating, as a script would: its host chunks reach the disk as the
    # engine shuts down (write-back: nothing was evicted, the engine was never idle)
    a = run_job(tmp_path, "a", tiny_model, token_prompts, disk_extra(tier), settle=False)
    assert a["outputs"] == [expected]
    wanted = full_chunks(token_prompts, CHUNK)
    assert a["stats"]["tiers"]["disk"]["stored_chunks"] == 0
    assert len(chunk_files(tier)) >= wanted
    # B reads its files two at a time (a GPU engine's default on a host of 8 to 11 CPUs)
    b = run_job(tmp_path, "b", tiny_model, token_prompts, disk_extra(tier, readers=2))
    assert b["outputs"] == [expected]
    disk = b["stats"]["tiers"]["disk"]
    assert disk["hit_chunks"] >= 0.9 * wanted
    assert disk["loaded_chunks"] >= 0.9 * wanted
    assert disk["bad_chunks"] == disk["failed_loads"] == 0
    assert b["stats"]["tiers"]["cpu"]["hit_chunks"] == 0  # a new process: nothing in memory


def test_two_processes_share_one_directory(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    """Both store and load at once (a host tier of ~3 chunks: evictions write back mid-run)."""
    shared = prompts(tiny_model, LENGTHS[:3], seed=3)
    mine = [shared + prompts(tiny_model, LENGTHS[3:], seed=4 + i) for i in range(2)]
    expected = [_expected(reference, tiny_model, p) for p in mine]
    tier = tmp_path / "tier"
    extra = disk_extra(tier, cpu="256KiB")
    jobs = [start_job(tmp_path, f"p{i}", tiny_model, mine[i], extra, rounds=3) for i in range(2)]
    results = [finish_job(*job) for job in jobs]
    for result, want in zip(results, expected):
        assert result["outputs"] == [want] * 3
        disk = result["stats"]["tiers"]["disk"]
        assert disk["hit_chunks"] > 0
        assert disk["bad_chunks"] == disk["failed_loads"] == 0
    assert chunk_files(tier)
    assert bad_files(tier) == []  # no torn or foreign file under any name


# ---- faults: each load of a damaged file is a counted miss -------------------------------------


@pytest.fixture(scope="module")
def filled_tier(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[list[int]], list[set[Path]]]:
    """A directory holding every prompt's chunks, and which files each prompt wrote."""
    token_prompts = prompts(tiny_model, LENGTHS, seed=9)
    tier = tmp_path_factory.mktemp("filled") / "tier"
    files: list[set[Path]] = []
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**disk_extra(tier))) as llm:
        for prompt in token_prompts:
            before = chunk_files(tier)
            generate(llm, [prompt])
            settle(llm)
            files.append({f.relative_to(tier) for f in chunk_files(tier) - before})
    assert all(len(f) >= n // CHUNK for f, n in zip(files, LENGTHS))  # + generated tokens'
    return tier, token_prompts, files


def _middle_file(files: set[Path]) -> Path:
    ordered = sorted(files, key=lambda f: f.name)
    return ordered[len(ordered) // 2]


def _foreign(path: Path) -> None:
    """Replace ``path`` by a well-formed file of the same chunk, written for another model."""
    header, _ = read_header(path)
    other = msgspec.structs.replace(header, fingerprint=bytes(16), describe="another model")
    payload = [np.random.default_rng(0).bytes(n) for n in header.views]
    from kvtier.tiers.base.chunk_format import payload_checksum

    write_chunk(path, msgspec.structs.replace(other, checksum=payload_checksum(payload)), payload)


FAULTS: dict[str, tuple[Callable[[Path, list[Path]], None], int]] = {
    # name: (damage the chosen files (one of prompt 3, one of prompt 5), bad loads expected)
    "flip_payload_byte": (lambda root, f: flip_payload_byte(root / f[0]), 1),
    "truncate": (lambda root, f: truncate(root / f[0]), 1),
    "zero_length": (lambda root, f: truncate(root / f[0], 0), 1),
    "foreign_fingerprint": (lambda root, f: _foreign(root / f[0]), 1),
    "swap_names": (lambda root, f: swap_names(root / f[0], root / f[1]), 2),
    # once the engine indexed it, another engine evicts it: the load cannot open it
    "removed_after_start": (lambda root, f: (root / f[0]).unlink(), 1),
}
AFTER_START = {"removed_after_start"}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_file_is_a_counted_miss(
    fault: str,
    tiny_model: Path,
    reference: Any,
    filled_tier: tuple[Path, list[list[int]], list[set[Path]]],
    tmp_path: Path,
) -> None:
    source, token_prompts, files = filled_tier
    expected = _expected(reference, tiny_model, token_prompts)
    tier = copy_tier(source, tmp_path / "tier")
    damage, bad_loads = FAULTS[fault]
    chosen = [_middle_file(files[3]), _middle_file(files[5])]
    if fault not in AFTER_START:
        damage(tier, chosen)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**disk_extra(tier))) as llm:
        if fault in AFTER_START:
            damage(tier, chosen)
        assert generate(llm, token_prompts) == expected
        settle(llm)
        disk = kvtier.stats(llm).tiers["disk"]
        assert disk.bad_chunks == bad_loads
        assert disk.failed_loads == bad_loads
        assert disk.hit_chunks >= full_chunks(token_prompts, CHUNK) // 2  # the rest still serve
        connector(llm).scheduler.check_integrity()
    assert bad_files(tier) == []  # the damaged files were removed (or rewritten whole)


def test_unreadable_directory_recomputes(
    tiny_model: Path,
    reference: Any,
    filled_tier: tuple[Path, list[list[int]], list[set[Path]]],
    tmp_path: Path,
) -> None:
    """A directory the engine may not read: every chunk is a miss, stores are skipped."""
    source, token_prompts, _ = filled_tier
    expected = _expected(reference, tiny_model, token_prompts)
    tier = copy_tier(source, tmp_path / "tier")
    locked = [d for d in tier.iterdir() if d.is_dir()]
    for directory in locked:
        directory.chmod(0)
    # root ignores file modes: run the engine without the capabilities that let it
    prefix = (
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
        if os.geteuid() == 0
        else []
    )
    try:
        result = run_job(
            tmp_path, "locked", tiny_model, token_prompts, disk_extra(tier), prefix=prefix
        )
    finally:
        for directory in locked:
            directory.chmod(0o755)
    assert result["outputs"] == [expected]
    disk = result["stats"]["tiers"]["disk"]
    assert disk["hit_chunks"] == 0
    assert disk["miss_chunks"] == full_chunks(token_prompts, CHUNK)
    assert disk["failed_stores"] > 0  # the writes were refused, counted and skipped
    assert result["rank"]["tier_write_errors"] > 0
