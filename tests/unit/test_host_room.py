"""A GPU's host tier is checked against the machine's memory before it is pinned
(``kvtier/tiers/host/room.py``): read from ``/proc/meminfo`` and the container's cgroup files,
here written into a temporary directory, and from this machine's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.tiers.host.room import GIB, Room

MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:    8192000 kB
HugePages_Total:       0
"""


def _machine(tmp_path: Path, limit: str | None = None, used: str = "0") -> Room:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    if limit is not None:
        (cgroup / "memory.max").write_text(limit + "\n")
        (cgroup / "memory.current").write_text(used + "\n")
    return Room.read(meminfo, cgroup)


def test_the_machines_memory_is_read_in_bytes(tmp_path: Path) -> None:
    assert _machine(tmp_path) == Room(16384000 * 1024, 8192000 * 1024)


def test_a_containers_limit_bounds_both_figures(tmp_path: Path) -> None:
    room = _machine(tmp_path, limit=str(4 * GIB), used=str(3 * GIB))
    assert room == Room(4 * GIB, 1 * GIB)
    unlimited = tmp_path / "unlimited"
    unlimited.mkdir()
    assert _machine(unlimited, limit="max") == Room(16384000 * 1024, 8192000 * 1024)


def test_a_tier_beyond_the_machine_is_refused_naming_the_setting(tmp_path: Path) -> None:
    room = _machine(tmp_path, limit=str(64 * GIB), used=str(8 * GIB))
    total = 16384000 * 1024
    room.check(total // 8, ranks=8)  # every rank's tier fits, one within what is free
    with pytest.raises(ValueError, match=r"cpu_bytes_to_use: .* 8 rank\(s\) needs 23\.62 GiB"):
        room.check(total // 8 + GIB, ranks=8)  # the ranks' tiers together exceed the memory
    with pytest.raises(ValueError, match=r"cpu_bytes_to_use: this rank's host tier needs"):
        room.check(9 * GIB, ranks=1)  # within the machine, not within what is free now


def test_a_machine_that_tells_nothing_is_not_checked(tmp_path: Path) -> None:
    room = Room.read(tmp_path / "no-meminfo", tmp_path / "no-cgroup")
    assert room == Room(None, None)
    room.check(1 << 60, ranks=8)


def test_this_machines_memory_is_read() -> None:
    room = Room.read()
    assert room.total is not None and room.available is not None
    assert 0 < room.available <= room.total
    with pytest.raises(ValueError, match="cpu_bytes_to_use"):
        room.check(room.total + 1, ranks=1)
