"""A disk tier's prefetch asks the kernel to read a chunk file ahead only where the file is not
in the page cache already (``DiskTier.prefetch``): asked of a cached file, the kernel walks every
page of it on the thread that hands the readers their files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chunk_files import FP, chunk_keys, store_chunks
from disk_io_setup import TRIMMED, disk_layout

from kvtier.apps.bench.common import page_cache
from kvtier.tiers.disk.files import DiskTier


def _answers_nowait(path: Path) -> bool:
    """Whether this filesystem says, without waiting, if a file's bytes are cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_cached_file_is_not_prefetched_one_read_from_disk_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    factor, _, groups, _ = TRIMMED
    tier = DiskTier(tmp_path, 0, FP, "test layout", disk_layout(), factor)
    keys = chunk_keys(groups)[:2]
    store_chunks(tier, keys)
    cached, dropped = (tier.path(key) for key in keys)
    if not hasattr(os, "RWF_NOWAIT") or not _answers_nowait(cached):
        pytest.skip("this filesystem cannot say whether a file is cached (RWF_NOWAIT)")
    os.sync()  # only clean pages leave the page cache
    page_cache.drop([dropped])
    advised: list[tuple[int, int]] = []
    fadvise = os.posix_fadvise

    def recorded(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((os.fstat(fd).st_ino, advice))
        fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recorded)
    tier.prefetch(keys[0])  # just written: in the page cache
    tier.prefetch(keys[1])
    assert advised == [(dropped.stat().st_ino, os.POSIX_FADV_WILLNEED)]
    tier.prefetch(b"\0" * len(keys[0]))  # no such file: nothing, no error
    assert len(advised) == 1
