"""``kvtier inspect``: a small tier, summarised per layout; ``--verify`` finds the damage."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kvtier.apps.cli import main
from kvtier.apps.inspect_tier import BadFile, inspect_tier, render
from kvtier.keys import make_key
from kvtier.tiers.base.chunk_format import (
    HEADER_BYTES,
    ChunkHeader,
    payload_checksum,
    read_header,
    temp_name,
)
from kvtier.tiers.base.chunk_format import write_chunk as write_file
from kvtier.tiers.disk.names import chunk_path

FP_A, FP_B = bytes(range(16)), bytes(range(16, 32))
A1, A2 = make_key(FP_A, 1, group=0), make_key(FP_A, 2, group=0)
B1, B2 = make_key(FP_B, 1, group=0), make_key(FP_B, 2, group=0)
PAYLOAD = [bytes(range(64)), b"\xab" * 200]
A_FILE, B_FILE = HEADER_BYTES + 264, HEADER_BYTES + 1000


def write(root: Path, key: bytes, rank: int, age_s: float = 0.0) -> Path:
    fingerprint = key[:16]
    payload = PAYLOAD if fingerprint == FP_A else [b"\x01" * 1000]
    describe = "layout A" if fingerprint == FP_A else "layout B"
    views = [len(view) for view in payload]
    header = ChunkHeader(key, rank, fingerprint, views, payload_checksum(payload),
                         time.time() - age_s, describe)  # fmt: skip
    path = chunk_path(root, key, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, header, payload)
    return path


@pytest.fixture
def tier(tmp_path: Path) -> Path:
    """Layout A: 2 keys x ranks 0 and 1, one payload damaged; layout B: 1 key, rank 0; 3 others."""
    write(tmp_path, A1, 0, age_s=2 * 3600 + 5)
    write(tmp_path, A1, 1, age_s=10 * 60 + 5)
    write(tmp_path, A2, 0, age_s=10 * 60 + 5)
    damaged = write(tmp_path, A2, 1, age_s=3 * 60 + 5)
    with open(damaged, "r+b") as file:
        file.seek(HEADER_BYTES + 10)
        file.write(b"\xff")
    b1 = write(tmp_path, B1, 0, age_s=30)
    temp_name(b1).write_bytes(b"half a chunk")
    b1.with_name("notes.txt").write_text("not a chunk")
    b1.with_name(".lock").write_text("hidden, but not a temporary file")
    return tmp_path


def _damaged(tier: Path) -> Path:
    return chunk_path(tier, A2, 1)


def test_report_groups_chunk_files_by_layout(tier: Path) -> None:
    report = inspect_tier(tier)
    assert (report.chunk_files, report.temp_files, report.foreign_files) == (5, 1, 2)
    assert (report.bad, report.vanished, report.verification) == ([], 0, None)
    a, b = report.layouts[(FP_A, "layout A")], report.layouts[(FP_B, "layout B")]
    assert (a.files, a.keys, a.ranks, a.bytes) == (4, {A1, A2}, {0, 1}, 4 * A_FILE)
    assert (b.files, b.keys, b.ranks, b.bytes) == (1, {B1}, {0}, B_FILE)
    assert report.scanned_at - a.oldest == pytest.approx(2 * 3600 + 5, abs=5)
    assert report.scanned_at - a.newest == pytest.approx(3 * 60 + 5, abs=5)
    assert b.newest == b.oldest


def test_render_shows_one_row_per_layout_with_ages(tier: Path) -> None:
    text = render(inspect_tier(tier))
    assert "5 chunk files in 2 layouts" in text
    assert "1 temporary, 2 foreign, 0 bad" in text
    row_a = next(line for line in text.splitlines() if line.startswith(FP_A.hex()))
    assert row_a.split() == [FP_A.hex(), "4", "2", "0,1", "17.0", "KiB", "2h", "ago", "3m", "ago",
                             "layout", "A"]  # fmt: skip
    row_b = next(line for line in text.splitlines() if line.startswith(FP_B.hex()))
    assert "30s ago" in row_b
    assert "verify" not in text


def test_verify_finds_exactly_the_damaged_payload(tier: Path) -> None:
    report = inspect_tier(tier, verify=True)
    assert report.verification is not None
    assert report.verification.good == 4
    assert report.verification.bad == [BadFile(_damaged(tier), "payload checksum mismatch")]
    assert report.bad == []  # its header is fine
    text = render(report)
    assert "verify: 4 good, 1 bad" in text
    assert f"{_damaged(tier)}: payload checksum mismatch" in text


def test_inspect_changes_nothing(tier: Path) -> None:
    def snapshot() -> dict[Path, tuple[bytes, int]]:
        files = [path for path in tier.rglob("*") if path.is_file()]
        return {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in files}

    before = snapshot()
    inspect_tier(tier, verify=True, progress=True)
    assert snapshot() == before


def test_bad_headers_and_names_are_counted_without_verify(tmp_path: Path) -> None:
    write(tmp_path, A1, 0)
    misnamed, other_rank = chunk_path(tmp_path, B2, 0), chunk_path(tmp_path, B1, 1)
    misnamed.parent.mkdir(parents=True)
    shutil.copy(write(tmp_path, B1, 0), misnamed)
    shutil.copy(chunk_path(tmp_path, B1, 0), other_rank)
    short, garbage = write(tmp_path, A2, 1), chunk_path(tmp_path, A2, 0)
    os.truncate(short, A_FILE - 1)
    garbage.write_bytes(b"hello\n" * 1000)
    expected = [
        BadFile(misnamed, f"named chunk {B2.hex()}, holds chunk {B1.hex()}"),
        BadFile(other_rank, "named rank 1's share, holds rank 0's"),
        BadFile(garbage, "not a kvtier chunk file (magic b'hello\\nhe')"),
        BadFile(short, f"{A_FILE - 1} bytes long, expected {A_FILE}"),
    ]
    report = inspect_tier(tmp_path)
    assert sorted(report.bad) == sorted(expected)
    assert report.chunk_files == 2
    verified = inspect_tier(tmp_path, verify=True).verification
    assert verified is not None and verified.good == 2
    assert sorted(verified.bad) == sorted(expected)


def test_a_file_evicted_during_the_walk_is_not_bad(
    tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def evicted_first(path: Path) -> tuple[ChunkHeader, int]:
        if path == chunk_path(tier, B1, 0):
            path.unlink()
        return read_header(path)

    monkeypatch.setattr("kvtier.apps.inspect_tier.read_header", evicted_first)
    report = inspect_tier(tier, verify=True)
    assert (report.vanished, report.bad, report.chunk_files) == (1, [], 4)
    assert (FP_B, "layout B") not in report.layouts


def test_a_root_that_is_not_a_directory_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{tmp_path / 'missing'} does not exist"):
        inspect_tier(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=f"{tmp_path / 'file'} is not a directory"):
        inspect_tier(tmp_path / "file")


def test_cli_exit_status(tier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tier)]) == 0
    assert "5 chunk files in 2 layouts" in capsys.readouterr().out
    assert main(["inspect", str(tier), "--verify"]) == 1
    assert f"{_damaged(tier)}: payload checksum mismatch" in capsys.readouterr().out
    _damaged(tier).unlink()
    assert main(["inspect", str(tier), "--verify"]) == 0
    assert "verify: 4 good, 0 bad" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr() == ("", f"kvtier inspect: {tmp_path / 'missing'} does not exist\n")


def test_cli_help_says_what_inspect_reports(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["inspect", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "grouped by the layout" in text and "--verify" in text and "Exit status" in text
