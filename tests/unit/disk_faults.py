"""Faults the disk-tier unit tests inject."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

import pytest


def full_disk_for(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """``os.writev`` of the temporary file of ``name`` writes its header, then fails: ENOSPC."""
    real_writev = os.writev
    started: set[int] = set()

    def writev(fd: int, buffers: Sequence[memoryview]) -> int:
        if f".{name}." not in os.readlink(f"/proc/self/fd/{fd}"):
            return real_writev(fd, buffers)
        if fd not in started:
            started.add(fd)
            return real_writev(fd, buffers[:1])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("kvtier.tiers.base.chunk_format.os.writev", writev)
