"""Whether the machine has the memory a host tier on a GPU asks for, before the engine serves.

    Room.read()                        this machine's (or container's) memory, now
    Room.check(rank_bytes, ranks)      ``ValueError`` naming ``cpu_bytes_to_use`` when it has not
    check_room(layout, chunks, factor, world_size)
                                       a GPU rank's tier of ``chunks`` checked, its machine
                                       taken to hold as many of the engine's ranks as it has
                                       devices (``world_size`` at most)

On the CPU the tier is committed when built (``commit.py``), which fails then. On a GPU it is
pinned as the engine serves (``pinning.py``), so a tier larger than the memory would show only
once the pinning or the stores reached the memory that is not there: the engine killed for
memory while it serves. So the tier is checked first, two ways that the ranks of one engine,
starting side by side and pinning already, cannot fail for one another:

- all of this machine's ranks' tiers (``ranks``) within its memory (``MemTotal``, or the
  container's limit, cgroup v2 ``memory.max``): more cannot be right whatever else runs;
- this rank's tier within the memory available now (``MemAvailable``, or the limit less the
  container's use), which other processes may already hold.

A figure the machine does not give (not Linux, no limit) is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kvtier.layout import KVLayout
from kvtier.tiers.base.records import RecordLayout

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # the container's own, under a cgroup namespace
GIB = 2**30


@dataclass(frozen=True)
class Room:
    total: int | None  # bytes the machine or container may hold at most
    available: int | None  # bytes free to take now

    @classmethod
    def read(cls, meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> Room:
        info = _meminfo(meminfo)
        total, available = info.get("MemTotal"), info.get("MemAvailable")
        limit = _number(cgroup / "memory.max")
        if limit is not None:
            used = _number(cgroup / "memory.current") or 0
            total = limit if total is None else min(total, limit)
            free = max(limit - used, 0)
            available = free if available is None else min(available, free)
        return cls(total, available)

    def check(self, rank_bytes: int, ranks: int) -> None:
        """Raise ``ValueError`` naming ``cpu_bytes_to_use`` when ``ranks`` tiers of
        ``rank_bytes`` exceed ``total``, or one exceeds ``available``."""
        engine = rank_bytes * ranks
        if self.total is not None and engine > self.total:
            raise ValueError(
                f"kvtier: cpu_bytes_to_use: the host tier of this machine's {ranks} rank(s) "
                f"needs {engine / GIB:.2f} GiB, more than its {self.total / GIB:.2f} GiB of "
                f"memory; configure less host memory"
            )
        if self.available is not None and rank_bytes > self.available:
            raise ValueError(
                f"kvtier: cpu_bytes_to_use: this rank's host tier needs {rank_bytes / GIB:.2f} "
                f"GiB, more than the {self.available / GIB:.2f} GiB of memory available now; "
                f"configure less host memory"
            )


def check_room(layout: KVLayout, chunks: int, factor: int, world_size: int) -> None:
    ranks = max(1, min(world_size, torch.cuda.device_count()))
    Room.read().check(chunks * RecordLayout.of(layout, factor).record_bytes, ranks)


def _meminfo(path: Path) -> dict[str, int]:
    """``/proc/meminfo``'s fields in bytes (empty where it cannot be read)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        name, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields


def _number(path: Path) -> int | None:
    """A cgroup file's number (None: absent, unreadable, or ``max``)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
