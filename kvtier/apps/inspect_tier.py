"""What a disk tier's directory holds, for ``kvtier inspect``. It only reads: nothing is changed.

Primitives:
    inspect_tier(root, verify, progress) -> TierReport   walk ``root``, read every chunk header
    render(report)                       -> str          the report as plain text

Chunk files are grouped by the layout their header names (fingerprint + describe). A chunk file is
bad when its header does not decode, or its name's key or rank, or its length, disagrees with the
header. ``verify`` also reads every payload (``chunk_format.verify_file``). A file removed while
the walk runs (a running engine evicting it) is counted as vanished, never as bad.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from kvtier.tiers.base.chunk_format import (
    HEADER_BYTES,
    ChunkError,
    ChunkHeader,
    read_header,
    verify_file,
)
from kvtier.tiers.disk.names import ChunkFile, scan


class BadFile(NamedTuple):
    path: Path
    reason: str  # the ChunkError or OSError message


@dataclass
class LayoutSummary:
    """The chunk files whose headers name one layout."""

    fingerprint: bytes
    describe: str
    files: int = 0
    keys: set[bytes] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    bytes: int = 0
    oldest: float = float("inf")  # the headers' ``created``, unix time
    newest: float = float("-inf")

    def add(self, header: ChunkHeader, size: int) -> None:
        self.files += 1
        self.keys.add(header.key)
        self.ranks.add(header.rank)
        self.bytes += size
        self.oldest = min(self.oldest, header.created)
        self.newest = max(self.newest, header.created)


@dataclass
class Verification:
    good: int = 0
    bad: list[BadFile] = field(default_factory=list)  # every bad chunk file, ``TierReport.bad`` too


@dataclass
class TierReport:
    root: Path
    scanned_at: float  # unix time the walk began; ages are measured from it
    layouts: dict[tuple[bytes, str], LayoutSummary] = field(default_factory=dict)
    temp_files: int = 0
    foreign_files: int = 0  # files two levels down that are not named as chunks
    bad: list[BadFile] = field(default_factory=list)  # found from the header alone
    vanished: int = 0
    verification: Verification | None = None  # None unless verified

    @property
    def chunk_files(self) -> int:
        return sum(layout.files for layout in self.layouts.values())


def inspect_tier(root: Path, verify: bool = False, progress: bool = False) -> TierReport:
    """Report what the disk tier at ``root`` holds; ``verify`` checks every payload too.

    ValueError naming ``root`` when it is not a directory. ``progress`` draws a bar on stderr.
    """
    if not root.is_dir():
        raise ValueError(f"{root} {'is not a directory' if root.exists() else 'does not exist'}")
    report = TierReport(root, time.time(), verification=Verification() if verify else None)
    total = sum(1 for _ in scan(root)) if progress else None
    entries = tqdm(
        scan(root), desc="kvtier inspect", total=total, unit="file", disable=not progress
    )
    for entry, chunk in entries:
        if chunk is not None:
            _inspect_chunk(report, ChunkFile(Path(entry.path), *chunk))
        elif entry.name.startswith(".") and entry.name.endswith(".tmp"):
            report.temp_files += 1
        else:
            report.foreign_files += 1
    return report


def _inspect_chunk(report: TierReport, chunk: ChunkFile) -> None:
    try:
        header, size = _read_header(chunk)
    except FileNotFoundError:
        report.vanished += 1
        return
    except (ChunkError, OSError) as error:
        report.bad.append(BadFile(chunk.path, str(error)))
        if report.verification is not None:
            report.verification.bad.append(report.bad[-1])
        return
    layout = (header.fingerprint, header.describe)
    report.layouts.setdefault(layout, LayoutSummary(*layout)).add(header, size)
    if report.verification is not None:
        _verify(report, report.verification, chunk.path)


def _read_header(chunk: ChunkFile) -> tuple[ChunkHeader, int]:
    """The header and size of ``chunk``'s file; ChunkError if they disagree with its name."""
    header, size = read_header(chunk.path)
    if header.key != chunk.key:
        raise ChunkError(f"named chunk {chunk.key.hex()}, holds chunk {header.key.hex()}")
    if header.rank != chunk.rank:
        raise ChunkError(f"named rank {chunk.rank}'s share, holds rank {header.rank}'s")
    if size != HEADER_BYTES + header.payload_bytes:
        raise ChunkError(f"{size} bytes long, expected {HEADER_BYTES + header.payload_bytes}")
    return header, size


def _verify(report: TierReport, verification: Verification, path: Path) -> None:
    try:
        verify_file(path)
    except FileNotFoundError:
        report.vanished += 1
    except (ChunkError, OSError) as error:
        verification.bad.append(BadFile(path, str(error)))
    else:
        verification.good += 1


def render(report: TierReport) -> str:
    """Plain text: a summary line, a table of layouts, then the bad files with their reasons."""
    layouts = sorted(report.layouts.values(), key=lambda layout: -layout.bytes)
    lines = [
        f"disk tier {report.root}: {report.chunk_files} chunk files in {len(layouts)} "
        f"layout{'' if len(layouts) == 1 else 's'}, "
        f"{_size(sum(layout.bytes for layout in layouts))}",
        f"other files: {report.temp_files} temporary, {report.foreign_files} foreign, "
        f"{len(report.bad)} bad, {report.vanished} vanished during the walk",
    ]
    if layouts:
        lines += ["", *_table(report, layouts)]
    if report.verification is None:
        lines += _bad_lines(
            "bad files (header unreadable or disagreeing with name/length)", report.bad
        )
    else:
        good, bad = report.verification.good, report.verification.bad
        lines += ["", f"verify: {good} good, {len(bad)} bad"]
        lines += _bad_lines("bad files", bad)
    return "\n".join(lines)


def _table(report: TierReport, layouts: list[LayoutSummary]) -> list[str]:
    header = ("fingerprint", "files", "keys", "ranks", "size", "oldest", "newest", "layout")
    rows = [header] + [
        (
            layout.fingerprint.hex(),
            str(layout.files),
            str(len(layout.keys)),
            ",".join(str(rank) for rank in sorted(layout.ranks)),
            _size(layout.bytes),
            _age(report.scanned_at - layout.oldest),
            _age(report.scanned_at - layout.newest),
            layout.describe or "-",
        )
        for layout in layouts
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows
    ]


def _bad_lines(title: str, bad: list[BadFile]) -> list[str]:
    return ["", f"{title}:", *(f"  {file.path}: {file.reason}" for file in bad)] if bad else []


def _age(seconds: float) -> str:
    """``"45s ago"``, ``"3m ago"``, ``"2h ago"``, ``"5d ago"``; a time in the future reads 0s."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _size(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
